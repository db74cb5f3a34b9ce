#!/usr/bin/env bash
# Installs what the build needs that cargo does not fetch: protoc (for the CRI
# bindings of the k8s-cri crate). Idempotent; a no-op when protoc is present.
set -euo pipefail

if command -v protoc >/dev/null 2>&1 || [ -n "${PROTOC:-}" ]; then
    exit 0
fi
echo "[setup] installing protobuf-compiler (protoc) with apt-get" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "[setup] need root or sudo to install protobuf-compiler" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y --no-install-recommends protobuf-compiler >&2; then
    $SUDO apt-get update >&2
    $SUDO apt-get install -y --no-install-recommends protobuf-compiler >&2
fi
command -v protoc >/dev/null 2>&1 || { echo "[setup] protoc still missing" >&2; exit 1; }
