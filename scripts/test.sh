#!/usr/bin/env bash
# The whole test suite, as CI runs it on a fresh clone: installs what the build
# needs, checks formatting and lints, then runs every test (unit, component,
# mock-CRI-server and real-runtime tests).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

echo "[test] cargo fmt --check" >&2
cargo fmt --all -- --check
echo "[test] cargo clippy" >&2
cargo clippy --locked --workspace --all-targets -- -D warnings
echo "[test] cargo test" >&2
cargo test --locked --workspace --all-targets
