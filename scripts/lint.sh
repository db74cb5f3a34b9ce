#!/usr/bin/env bash
# Formatting, lints, dependency policy and the standard validators of the deployment
# files, and plegd.v1's compatibility with its last release (`buf breaking` against
# protocol/released), as scripts/test.sh runs them; also runs alone. Installs its
# tools first (scripts/lint-tools.sh; buf: scripts/conformance-tools.sh). What the
# deployment files must say about plegd itself is checked by a Rust test,
# plegd/tests/deploy_files.rs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/lint-tools.sh
# buf (npm, pinned in conformance/node/package-lock.json) for the proto check
bash scripts/conformance-tools.sh node
bin="${PLEGD_TOOLS:-/var/lib/plegd-tools}/bin"
step() { echo "[lint] $*" >&2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
step "fuzz targets build (fuzz/ is outside the workspace)"
cargo check --manifest-path fuzz/Cargo.toml --locked --bins --quiet
step "shellcheck"
shellcheck scripts/*.sh scripts/lib/*.sh compose/*.sh .ci/run
step "yamllint"
yamllint --strict .
step "docker compose config"
"$bin/docker-compose" -f docker-compose.yml config --quiet
step "hadolint"
"$bin/hadolint" Dockerfile compose/*.Dockerfile
step "kubernetes-validate (Kubernetes 1.33 schemas, strict)"
# Kubernetes manifests only: deploy/collector's agent.yaml and gateway.yaml are collector
# configurations (plegd/tests/deploy_files.rs checks them), kustomization.yaml is kustomize's.
"$bin/kubernetes-validate" --quiet --strict -k 1.33.0 deploy/daemonset.yaml deploy/collector/collector.yaml
step "systemd-analyze verify"
# verify wants ExecStart's binary installed; the arguments are the Rust test's business
sed 's|^ExecStart=/usr/local/bin/plegd |ExecStart=/bin/true |' deploy/plegd.service >"$tmp/plegd.service"
if ! out="$(systemd-analyze verify --man=no "$tmp/plegd.service" 2>&1)" || [ -n "$out" ]; then
    echo "$out" >&2
    exit 1
fi

step "buf breaking (plegd.v1 against the last release, protocol/released)"
conformance/node/node_modules/.bin/buf breaking protocol/proto --against protocol/released \
    --config '{"version":"v1","breaking":{"use":["FILE"]}}'

step "cargo deny"
if timeout 60 cargo deny fetch >/dev/null 2>&1; then
    cargo deny --offline check
else
    step "WARNING: the RustSec advisory database cannot be fetched here: advisories NOT checked"
    cargo deny --offline check licenses bans sources
fi
step "cargo machete (unused dependencies)"
cargo machete runtime actors telemetry sim protocol api plegd integration-tests workload otlp-events nri bench testkit
step "all clean"
