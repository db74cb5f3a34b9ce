#!/usr/bin/env bash
# Installs what the build and tests need that cargo does not fetch: protoc (for the
# CRI bindings of the k8s-cri crate) and valgrind (the instruction-count check of
# the global relist, bench/tests/relist_instructions.rs). Idempotent; a no-op when
# both are present.
set -euo pipefail

missing=()
if ! command -v protoc >/dev/null 2>&1 && [ -z "${PROTOC:-}" ]; then
    missing+=(protobuf-compiler)
fi
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
if [ "${#missing[@]}" = 0 ]; then
    exit 0
fi
echo "[setup] installing ${missing[*]} with apt-get" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "[setup] need root or sudo to install ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >&2; then
    $SUDO apt-get update >&2
    $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi
command -v protoc >/dev/null 2>&1 || [ -n "${PROTOC:-}" ] || { echo "[setup] protoc still missing" >&2; exit 1; }
command -v valgrind >/dev/null 2>&1 || { echo "[setup] valgrind still missing" >&2; exit 1; }
