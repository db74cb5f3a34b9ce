#!/usr/bin/env bash
# The whole test suite, as CI runs it on a fresh clone: installs what the build
# needs, runs the linters and validators (scripts/lint.sh: fmt, clippy, shellcheck,
# cargo-deny, cargo-machete, the deployment files' validators), then every test (unit,
# component, mock-CRI-server, deployment-file and real-runtime tests).
#
# The real-runtime tests (integration-tests/tests/containerd*.rs) need root: a private
# containerd 1.7, Debian sid's 2.1 and bookworm's 1.6.20 (for the Unimplemented case)
# are started here in the background while the linters run, and stopped and purged at
# the end, whatever happens (docs/containerd.md). State lives under $PLEGD_CRI_BASE
# (default /var/lib/plegd-ci), $PLEGD_CRI_BASE-2.1 and $PLEGD_CRI_BASE-1.6.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# A clean build gains nothing from incremental data; it only fills the disk, which on
# the CI machine is shared.
export CARGO_INCREMENTAL=0
bash scripts/setup.sh
# the linters' Debian packages now: containerd-up.sh, started next, uses apt too
bash scripts/lint-tools.sh --system
# the conformance suites' clients (grpcio, grpc-js; Debian's python3-venv and nodejs
# when missing), for plegd/tests/conformance.rs; before containerd-up.sh for the same reason
bash scripts/conformance-tools.sh

export PLEGD_CRI_BASE="${PLEGD_CRI_BASE:-/var/lib/plegd-ci}"
up_log="$(mktemp)"
up_pid=""
stop_containerd() {
    if [ -n "$up_pid" ]; then wait "$up_pid" 2>/dev/null || true; fi
    echo "[test] stopping containerd" >&2
    bash scripts/containerd-down.sh "$PLEGD_CRI_BASE" --purge || true
    PLEGD_CRI_CONTAINERD=2 bash scripts/containerd-down.sh "$PLEGD_CRI_BASE-2.1" --purge || true
    PLEGD_CRI_CONTAINERD=1.6 bash scripts/containerd-down.sh "$PLEGD_CRI_BASE-1.6" --purge || true
    rm -f "$up_log"
}
trap stop_containerd EXIT
echo "[test] starting containerd 1.7, 2.1 and 1.6 in the background (log: $up_log)" >&2
(
    set -e
    PLEGD_CRI_NRI=1 bash scripts/containerd-up.sh "$PLEGD_CRI_BASE"
    PLEGD_CRI_CONTAINERD=2 bash scripts/containerd-up.sh "$PLEGD_CRI_BASE-2.1"
    PLEGD_CRI_CONTAINERD=1.6 bash scripts/containerd-up.sh "$PLEGD_CRI_BASE-1.6"
) >"$up_log" 2>&1 &
up_pid=$!

echo "[test] linters and validators (scripts/lint.sh)" >&2
bash scripts/lint.sh

if ! wait "$up_pid"; then
    up_pid=""
    cat "$up_log" >&2
    echo "[test] containerd could not be started: the real-runtime tests cannot run (they need root; see docs/containerd.md)" >&2
    exit 1
fi
up_pid=""
echo "[test] containerd up: $(grep -E '^/' "$up_log" | tr '\n' ' ')" >&2

echo "[test] cargo test" >&2
# --include-ignored: the real-containerd tests and the conformance suites are ignored
# for a plain `cargo test` (they need root and containerd, or the clients
# scripts/conformance-tools.sh installed, which this script provides).
cargo test --locked --workspace --all-targets -- --include-ignored

echo "[test] benchmark harness smoke run (plegd-bench --smoke; checks the harness, not plegd's speed)" >&2
# Debug binaries, already built by cargo test: the figures mean nothing, the run
# proves that every workload still runs end to end (BENCHMARKS.md).
cargo build --locked -p plegd -p plegd-sim -p plegd-bench
target/debug/plegd-bench --smoke
# The same against the real containerd 2.1 and 1.7 started above (the harness's pods,
# kills and raw subscribers; about 10 s each). Nothing else runs on them by now: the
# harness's own CRI event streams share neither runtime with a test's.
for sock in "$PLEGD_CRI_BASE-2.1/containerd.sock" "$PLEGD_CRI_BASE/containerd.sock"; do
    echo "[test] benchmark harness smoke run on the real containerd at $sock (plegd-bench --containerd --smoke)" >&2
    target/debug/plegd-bench --containerd "unix://$sock" --smoke
done
