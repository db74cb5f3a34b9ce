#!/usr/bin/env bash
# Installs the conformance suites' clients (conformance/README.md) and buf; a no-op once
# they are there. Python: grpcio and pytest from PyPI, pinned with hashes in
# conformance/python/requirements.txt, into a venv at $PLEGD_TOOLS/conformance/venv
# (python3-venv from Debian when missing). Node: @grpc/grpc-js, @grpc/proto-loader and
# @bufbuild/buf from npm, pinned by conformance/node/package-lock.json, with `npm ci`
# into conformance/node/node_modules (nodejs and npm from Debian when missing).
# `node`: only the npm packages (scripts/lint.sh needs buf, not grpcio).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TOOLS="${PLEGD_TOOLS:-/var/lib/plegd-tools}"
log() { echo "[conformance-tools] $*" >&2; }
export DEBIAN_FRONTEND=noninteractive
apt_install() {
    local apt=(apt-get -o DPkg::Lock::Timeout=300 -y -qq --no-install-recommends)
    "${apt[@]}" install "$@" >&2 || { apt-get -qq update >&2 && "${apt[@]}" install "$@" >&2; }
}
only="${1:-all}"

need=()
if [ "$only" != node ]; then
    python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
fi
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
if [ "${#need[@]}" -gt 0 ]; then
    log "apt-get install ${need[*]}"
    apt_install "${need[@]}"
fi

mkdir -p "$TOOLS/conformance"
exec 9>"$TOOLS/conformance/.lock"
flock 9   # concurrent runs wait for one installation

lock=conformance/node/package-lock.json
if ! cmp -s "$lock" conformance/node/node_modules/.package-lock.json.installed; then
    log "npm ci (grpc-js, proto-loader, buf) into conformance/node/node_modules"
    (cd conformance/node && npm ci --no-audit --no-fund --loglevel=error >&2)
    cp "$lock" conformance/node/node_modules/.package-lock.json.installed
fi

[ "$only" = node ] && exit 0

req=conformance/python/requirements.txt
venv="$TOOLS/conformance/venv"
if ! cmp -s "$req" "$venv/requirements.txt"; then
    log "grpcio, pytest (PyPI, hashes pinned) into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check --no-input \
        --require-hashes -r "$req" >&2
    cp "$req" "$venv/requirements.txt"
fi
