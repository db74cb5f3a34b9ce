#!/usr/bin/env bash
# Builds plegd (release) and runs it. With no arguments: `plegd demo`, the whole
# service against the built-in simulated runtime. Otherwise the arguments go to plegd,
# e.g. scripts/run.sh run --runtime-endpoint unix:///run/containerd/containerd.sock
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
cargo build --release --locked -p plegd >&2
if [ $# -eq 0 ]; then
    set -- demo
fi
exec ./target/release/plegd "$@"
