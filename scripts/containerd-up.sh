#!/usr/bin/env bash
# containerd-up.sh - bring up a private, real containerd CRI runtime (runc) for plegd's
# end-to-end tests, on a Debian 12 (bookworm) machine, as root, without Docker and
# without any container registry.
#
# Usage:  scripts/containerd-up.sh [BASE]
#   BASE     state directory (default: $PLEGD_CRI_BASE, else /var/lib/plegd-ci; with
#            PLEGD_CRI_CONTAINERD=1.6 or 2 the default gets a "-1.6" or "-2.1" suffix)
#   stdout:  exactly one line, the CRI socket path (SOCK=$(scripts/containerd-up.sh) works;
#            the plegd endpoint is unix://$SOCK)
#   stderr:  progress log
#
# Idempotent: when this BASE's containerd is already up and CRI answers, it only prints
# the socket path (~0.3 s). Warm start (BASE populated, containerd stopped) ~1 s; cold
# start (empty BASE) ~12 s, mostly apt downloads.
#
# What it does (all state lives under BASE; nothing else is changed system-wide except
# `apt-get install runc` and, if missing, gcc/libc6-dev):
#   1. runc 1.1.5 from bookworm's own apt sources (trixie's runc needs GLIBC_2.38).
#   2. containerd binaries, extracted with dpkg -x (never installed):
#        1.7 (default): Debian trixie's containerd 1.7.x .deb, downloaded through a
#            throw-away apt config under BASE/cache/trixie -> BASE/bin
#        1.6 (PLEGD_CRI_CONTAINERD=1.6): bookworm's containerd 1.6.20 .deb from the
#            system's sources -> BASE/bin-1.6 (its CRI answers GetContainerEvents with
#            Unimplemented: used to test plegd against a runtime without the stream)
#        2.1 (PLEGD_CRI_CONTAINERD=2): Debian sid's containerd 2.x .deb (2.1.9 when
#            written; it needs only GLIBC_2.34), through a throw-away apt config under
#            BASE/cache/sid -> BASE/bin-2. Config version 3: the CRI plugin split into
#            io.containerd.cri.v1.runtime / .images, NRI on, and an unpack config for
#            the transfer service (2.x's `ctr images import` unpacks through it).
#   3. BASE/config.toml: private root/state/socket, CRI with restrict_oom_score_adj=true
#      (root here lacks CAP_SYS_RESOURCE), runc via cgroupfs, overlayfs (native when BASE
#      sits on overlayfs), empty CNI dirs (tests use host-network pods),
#      sandbox_image = localhost/pleg/pause:1.0.
#   4. two local OCI images, built offline and imported with ctr into k8s.io:
#      localhost/pleg/pause:1.0 (a static C pause) and localhost/pleg/busybox:1.0
#      (bookworm's busybox-static).
#   5. starts containerd (setsid; PID in BASE/containerd.pid, log in BASE/containerd.log)
#      and waits until the CRI Version RPC answers (a raw gRPC call with curl over the
#      unix socket; `ctr plugins ls` if curl cannot speak HTTP/2).
#
# Env knobs:
#   PLEGD_CRI_BASE         base dir (the first argument wins)
#   PLEGD_CRI_CONTAINERD   1.7 (default) | 1.6 | 2 (containerd 2.1)
#   PLEGD_CRI_SNAPSHOTTER  overlayfs | native (default: auto)
#   PLEGD_CRI_NRI=1        enable containerd 1.7's NRI plugin (socket BASE/nri.sock); 2.x
#                          has it on unless PLEGD_CRI_NRI=0
#   PLEGD_CRI_LOG_LEVEL    containerd log level (default info)
#   PLEGD_CRI_RUNC         runc binary (default: runc on PATH, i.e. bookworm's /usr/sbin/runc)
#   PLEGD_CRI_TIMEOUT      seconds to wait for CRI (default 60)
#
# One BASE holds the state of one containerd version only (BASE/flavor): use another
# BASE for the other version, or purge first (containerd-down.sh BASE --purge).
# Stop with scripts/containerd-down.sh BASE [--purge|--purge-all].
set -euo pipefail

FLAVOR="${PLEGD_CRI_CONTAINERD:-1.7}"
case "$FLAVOR" in
    1.7) DEFAULT_BASE="${PLEGD_CRI_BASE:-/var/lib/plegd-ci}"; BIN_NAME=bin ;;
    1.6) DEFAULT_BASE="${PLEGD_CRI_BASE:-/var/lib/plegd-ci}-1.6"; BIN_NAME=bin-1.6 ;;
    2|2.*) FLAVOR=2; DEFAULT_BASE="${PLEGD_CRI_BASE:-/var/lib/plegd-ci}-2.1"; BIN_NAME=bin-2 ;;
    *) echo "[containerd-up] PLEGD_CRI_CONTAINERD must be 1.7, 1.6 or 2, not '$FLAVOR'" >&2; exit 2 ;;
esac
BASE="${1:-$DEFAULT_BASE}"
case "$BASE" in -h|--help) sed -n '2,55p' "$0" >&2; exit 0 ;; esac

log() { printf '[containerd-up %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [ "$(id -u)" != 0 ]; then die "must run as root (containerd and runc need it)"; fi
BASE="$(realpath -m "$BASE")"
SOCK="$BASE/containerd.sock"
# unix socket paths are limited to 108 bytes; the ttrpc socket adds a suffix
if [ "${#SOCK}" -gt 90 ]; then die "BASE path too long for unix sockets: $SOCK"; fi
mkdir -p "$BASE"
chmod 0700 "$BASE"
PIDFILE="$BASE/containerd.pid"
LOG="$BASE/containerd.log"
BIN="$BASE/$BIN_NAME"
CACHE="$BASE/cache"
PAUSE_IMAGE="localhost/pleg/pause:1.0"
BUSYBOX_IMAGE="localhost/pleg/busybox:1.0"
TIMEOUT="${PLEGD_CRI_TIMEOUT:-60}"
export DEBIAN_FRONTEND=noninteractive

ctr_() { "$BIN/ctr" --address "$SOCK" "$@"; }

# shellcheck source-path=SCRIPTDIR source=lib/containerd-pid.sh
. "$(dirname "$(readlink -f "$0")")/lib/containerd-pid.sh"

# CRI readiness: a real runtime.v1 Version call. gRPC over HTTP/2 with prior knowledge;
# the request is an empty VersionRequest (5-byte frame: no compression, length 0). The
# answer must carry grpc-status 0 (a CRI plugin still initialising answers an error).
curl_h2=0
if command -v curl >/dev/null 2>&1 && curl -V 2>/dev/null | grep -qw HTTP2; then curl_h2=1; fi
cri_version() {
    local out
    out="$(printf '\0\0\0\0\0' | timeout 5 curl -sS --max-time 3 --unix-socket "$SOCK" \
        --http2-prior-knowledge -D - -o /dev/null \
        -H 'content-type: application/grpc' -H 'te: trailers' --data-binary @- \
        http://localhost/runtime.v1.RuntimeService/Version 2>&1)" || return 1
    grep -qi '^grpc-status: *0' <<<"$out"
}
cri_ready() {
    if [ "$curl_h2" = 1 ]; then
        cri_version
    else
        ctr_ version >/dev/null 2>&1 &&
            ctr_ plugins ls 2>/dev/null | grep -E 'io\.containerd\.grpc\.v1[[:space:]]+cri[[:space:]].*ok' >/dev/null
    fi
}

# ---------------------------------------------------------------- already up?
if pid="$(running_pid "$BIN/containerd --config $BASE/config.toml")" && cri_ready; then
    log "containerd $FLAVOR already running (pid $pid)"
    echo "$SOCK"
    exit 0
fi

# one containerd version per BASE: its metadata DB and CRI state are not shared
if [ -f "$BASE/flavor" ] && [ "$(cat "$BASE/flavor")" != "$FLAVOR" ] &&
    { [ -d "$BASE/root" ] || [ -d "$BASE/state" ]; }; then
    die "$BASE holds containerd $(cat "$BASE/flavor") state; use another BASE for $FLAVOR (or containerd-down.sh $BASE --purge)"
fi

mkdir -p "$BIN" "$CACHE" "$BASE/images" "$BASE/cni/net.d" "$BASE/cni/bin" "$BASE/logs"

# ---------------------------------------------------------------- 1. Debian packages
apt_updated=0
apt_update_once() {
    if [ "$apt_updated" = 0 ]; then
        log "apt-get update (bookworm, system sources)"
        apt-get update -qq >&2
        apt_updated=1
    fi
}
# apt-get download from the system sources, updating the lists once if needed
apt_download() {
    local dir="$1" pkg="$2"
    (cd "$dir" && apt-get -o APT::Sandbox::User=root download -qq "$pkg" >&2) && return 0
    apt_update_once
    (cd "$dir" && apt-get -o APT::Sandbox::User=root download -qq "$pkg" >&2)
}
need_pkgs=()
dpkg -s runc >/dev/null 2>&1 || need_pkgs+=(runc)
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc libc6-dev)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || need_pkgs+=(libc6-dev)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    log "apt-get install ${need_pkgs[*]}"
    if ! apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2; then
        apt_update_once
        apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2
    fi
fi
RUNC="${PLEGD_CRI_RUNC:-$(command -v runc || echo /usr/sbin/runc)}"
"$RUNC" --version >/dev/null || die "runc ($RUNC) does not run"

# busybox-static (bookworm) only as the source of a static busybox for the test image
if ! ls "$CACHE"/busybox-static_*.deb >/dev/null 2>&1; then
    log "apt-get download busybox-static (bookworm)"
    apt_download "$CACHE" busybox-static
fi

# ---------------------------------------------------------------- 2. containerd binaries
last_match() {   # last_match GLOB...: the last existing path of an expanded glob, or nothing
    local f last=""
    for f in "$@"; do [ -e "$f" ] && last="$f"; done
    printf '%s' "$last"
}
install_bins() {   # install_bins DEB: dpkg -x, then copy the three binaries to $BIN
    local deb="$1" x="$BASE/pkg"
    rm -rf "$x" && mkdir -p "$x"
    dpkg -x "$deb" "$x/containerd"
    for b in containerd containerd-shim-runc-v2 ctr; do
        install -m 0755 "$x/containerd/usr/bin/$b" "$BIN/$b"
    done
    rm -rf "$x"
}
# debian_deb SUITE VERSION_PREFIX: SUITE's containerd .deb, downloaded once through a
# throw-away apt config under $CACHE/SUITE (the system's sources are never changed)
debian_deb() {
    local suite="$1" ver="$2" dir="$CACHE/$1"
    mkdir -p "$dir/lists/partial"
    echo "deb http://deb.debian.org/debian $suite main" >"$dir/$suite.list"
    local opts=(-o "Dir::Etc::sourcelist=$dir/$suite.list" -o "Dir::Etc::sourceparts=-"
           -o "Dir::State::Lists=$dir/lists" -o "APT::Get::List-Cleanup=0"
           -o "Dir::Cache::pkgcache=$dir/pkgcache.bin" -o "Dir::Cache::srcpkgcache=$dir/srcpkgcache.bin"
           -o "APT::Sandbox::User=root")
    if ! ls "$dir"/containerd_"$ver".*.deb >/dev/null 2>&1; then
        log "apt-get update (temporary $suite config, not added to the system sources)"
        apt-get "${opts[@]}" update -qq >&2
        log "apt-get download containerd ($suite): $(apt-cache "${opts[@]}" policy containerd | awk '/Candidate/{print $2}')"
        (cd "$dir" && apt-get "${opts[@]}" download -qq containerd >&2)
    fi
    last_match "$dir"/containerd_"$ver".*.deb
}
want_re=' 1\.7\.'
[ "$FLAVOR" = 1.6 ] && want_re=' 1\.6\.'
[ "$FLAVOR" = 2 ] && want_re=' 2\.'
if ! { [ -x "$BIN/containerd" ] && "$BIN/containerd" --version 2>/dev/null | grep -q "$want_re"; }; then
    if [ "$FLAVOR" = 1.7 ]; then
        deb="$(debian_deb trixie 1.7)"
        [ -n "$deb" ] || die "no containerd 1.7 .deb downloaded from trixie"
    elif [ "$FLAVOR" = 2 ]; then
        deb="$(debian_deb sid 2)"
        [ -n "$deb" ] || die "no containerd 2.x .deb downloaded from sid"
    else
        BWM="$CACHE/bookworm"
        mkdir -p "$BWM"
        if ! ls "$BWM"/containerd_1.6.*.deb >/dev/null 2>&1; then
            log "apt-get download containerd (bookworm, system sources)"
            apt_download "$BWM" containerd
        fi
        deb="$(last_match "$BWM"/containerd_1.6.*.deb)"
        [ -n "$deb" ] || die "no containerd 1.6 .deb downloaded from bookworm"
    fi
    log "extracting $(basename "$deb") -> $BIN"
    install_bins "$deb"
fi
"$BIN/containerd" --version >&2 || die "containerd binary does not run (glibc?)"
"$BIN/containerd" --version | grep -q "$want_re" || die "$BIN/containerd is not containerd $FLAVOR"
log "runc: $("$RUNC" --version | head -n1)"

# ---------------------------------------------------------------- 3. config
SNAP="${PLEGD_CRI_SNAPSHOTTER:-}"
if [ -z "$SNAP" ]; then
    case "$(stat -f -c %T "$BASE")" in
        overlayfs) SNAP=native ;;   # an overlay upperdir on overlayfs does not work
        *) SNAP=overlayfs ;;
    esac
fi
NRI_SECTION=""
if [ "$FLAVOR" != 1.6 ]; then
    NRI_DISABLE=true
    [ "${PLEGD_CRI_NRI:-0}" = 1 ] && NRI_DISABLE=false
    # containerd 2.x has NRI on by default
    [ "$FLAVOR" = 2 ] && [ "${PLEGD_CRI_NRI:-1}" != 0 ] && NRI_DISABLE=false
    mkdir -p "$BASE/nri/plugins" "$BASE/nri/conf.d"
    NRI_SECTION="[plugins.\"io.containerd.nri.v1.nri\"]
  disable = $NRI_DISABLE
  socket_path = \"$BASE/nri.sock\"
  plugin_path = \"$BASE/nri/plugins\"
  plugin_config_path = \"$BASE/nri/conf.d\""
fi
# The sections both config versions share: socket, debug level, metrics off, opt
# plugin path and NRI.
COMMON_SECTIONS=$(cat <<EOF
[grpc]
  address = "$SOCK"
  uid = 0
  gid = 0

[ttrpc]
  address = "$SOCK.ttrpc"

[debug]
  level = "${PLEGD_CRI_LOG_LEVEL:-info}"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$BASE/opt"

$NRI_SECTION
EOF
)
if [ "$FLAVOR" = 2 ]; then
# containerd 2.x: config version 3. The 1.x CRI plugin is split in three: cri.v1.images
# (snapshotter, sandbox image = pinned_images.sandbox), cri.v1.runtime (runtimes, CNI,
# security settings) and grpc.v1.cri (only the streaming server is left in it).
cat >"$BASE/config.toml" <<EOF
# generated by plegd's scripts/containerd-up.sh - private containerd 2.x for CRI tests
version = 3
root = "$BASE/root"
state = "$BASE/state"
oom_score = 0
# plugins that cannot work here or are not needed; they would only log load errors
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.differ.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

$COMMON_SECTIONS

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "$SNAP"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"

[plugins."io.containerd.cri.v1.runtime"]
  disable_apparmor = true
  enable_selinux = false
  # REQUIRED here, as for 1.7: root lacks CAP_SYS_RESOURCE
  restrict_oom_score_adj = true
  # CDI (on by default in 2.x) would watch /etc/cdi and /var/run/cdi
  enable_cdi = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$RUNC"
        Root = "$BASE/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    # empty on purpose: host-network pods (NamespaceOption.network = NODE) need no CNI
    bin_dirs = ["$BASE/cni/bin"]
    conf_dir = "$BASE/cni/net.d"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

# 2.x imports (and pulls) through the transfer service, which unpacks only for these
# platform/snapshotter pairs (default: overlayfs only; native would fail "no unpack
# platforms defined")
[[plugins."io.containerd.transfer.v1.local".unpack_config]]
  platform = "linux/amd64"
  snapshotter = "$SNAP"
  differ = "walking"
EOF
else
cat >"$BASE/config.toml" <<EOF
# generated by plegd's scripts/containerd-up.sh - private containerd $FLAVOR for CRI tests
version = 2
root = "$BASE/root"
state = "$BASE/state"
oom_score = 0
# plugins that cannot work here or are not needed; they would only log load errors
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

$COMMON_SECTIONS

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  disable_apparmor = true
  enable_selinux = false
  # REQUIRED here: root lacks CAP_SYS_RESOURCE, so runc cannot lower oom_score_adj (CRI
  # asks -998 for the pause container) -> "nsexec: failed to update
  # /proc/self/oom_score_adj: Permission denied". true clamps it to containerd's own.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$SNAP"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$RUNC"
        Root = "$BASE/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    # empty on purpose: host-network pods (NamespaceOption.network = NODE) need no CNI
    bin_dir = "$BASE/cni/bin"
    conf_dir = "$BASE/cni/net.d"
EOF
fi

# ---------------------------------------------------------------- 4a. build images (offline)
build_images() {
    local work="$BASE/images/build"
    rm -rf "$work" && mkdir -p "$work/pause/rootfs" "$work/busybox/rootfs"
    # pause: a static C program that sleeps until SIGTERM/SIGINT and reaps children
    cat >"$work/pause.c" <<'EOF'
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
static void on_term(int s) { (void)s; _exit(0); }
static void on_chld(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction sa = {0};
  sa.sa_handler = on_term; sigaction(SIGTERM, &sa, 0); sigaction(SIGINT, &sa, 0);
  sa.sa_handler = on_chld; sa.sa_flags = SA_NOCLDSTOP; sigaction(SIGCHLD, &sa, 0);
  for (;;) pause();
}
EOF
    gcc -static -Os -s -o "$work/pause/rootfs/pause" "$work/pause.c"
    # busybox: static busybox + applet symlinks + minimal /etc
    local r="$work/busybox/rootfs"
    dpkg -x "$(last_match "$CACHE"/busybox-static_*.deb)" "$work/bbdeb"
    mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/proc" "$r/sys" "$r/dev" "$r/root"
    cp "$work/bbdeb/bin/busybox" "$r/bin/busybox"
    for a in $("$r/bin/busybox" --list); do [ -e "$r/bin/$a" ] || ln -s busybox "$r/bin/$a"; done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$r/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
    chmod 1777 "$r/tmp"
    python3 - "$work" "$PAUSE_IMAGE" "$BUSYBOX_IMAGE" "$BASE/images" <<'PYEOF'
# Minimal OCI image-layout tarball writer (stdlib only): one uncompressed layer.
import hashlib, io, json, os, sys, tarfile
work, pause_name, bb_name, outdir = sys.argv[1:5]

def norm(ti):
    ti.uid = ti.gid = 0; ti.uname = ti.gname = "root"; ti.mtime = 0
    return ti

def layer(root):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        paths = []
        for dp, dns, fns in os.walk(root):
            dns.sort()
            for n in sorted(dns + fns):
                paths.append(os.path.join(dp, n))
        for p in paths:
            t.add(p, arcname=os.path.relpath(p, root), recursive=False, filter=norm)
    return buf.getvalue()

def blob(t, data):
    d = hashlib.sha256(data).hexdigest()
    ti = norm(tarfile.TarInfo("blobs/sha256/" + d)); ti.size = len(data); ti.mode = 0o644
    t.addfile(ti, io.BytesIO(data))
    return "sha256:" + d

def image(name, root, entrypoint, cmd, out):
    lay = layer(root)
    diff = "sha256:" + hashlib.sha256(lay).hexdigest()
    cfg = json.dumps({
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/",
                   "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "containerd-up.sh"}],
    }, sort_keys=True).encode()
    with tarfile.open(out + ".tmp", "w", format=tarfile.PAX_FORMAT) as t:
        data = b'{"imageLayoutVersion":"1.0.0"}'
        ti = norm(tarfile.TarInfo("oci-layout")); ti.size = len(data); ti.mode = 0o644
        t.addfile(ti, io.BytesIO(data))
        cd = blob(t, cfg); ld = blob(t, lay)
        man = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": len(cfg)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": len(lay)}],
        }, sort_keys=True).encode()
        md = blob(t, man)
        idx = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md,
                           "size": len(man), "platform": {"architecture": "amd64", "os": "linux"},
                           "annotations": {"io.containerd.image.name": name,
                                           "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}],
        }, sort_keys=True).encode()
        ti = norm(tarfile.TarInfo("index.json")); ti.size = len(idx); ti.mode = 0o644
        t.addfile(ti, io.BytesIO(idx))
    os.replace(out + ".tmp", out)
    print(f"built {name} -> {out} (layer {len(lay)} bytes)", file=sys.stderr)

image(pause_name, os.path.join(work, "pause", "rootfs"), ["/pause"], None, os.path.join(outdir, "pause.tar"))
image(bb_name, os.path.join(work, "busybox", "rootfs"), None, ["sh"], os.path.join(outdir, "busybox.tar"))
PYEOF
    rm -rf "$work"
}
if [ ! -f "$BASE/images/pause.tar" ] || [ ! -f "$BASE/images/busybox.tar" ]; then
    log "building images $PAUSE_IMAGE and $BUSYBOX_IMAGE"
    build_images
fi

# ---------------------------------------------------------------- 5. start containerd
if pid="$(running_pid "$BIN/containerd --config $BASE/config.toml")"; then
    log "containerd pid $pid is running but CRI does not answer; stopping it first"
    # containerd needs ~2 s to exit after SIGTERM (its socket disappears at once), and
    # a new one on the same BASE would block on the metadata DB lock meanwhile
    stop_pid "$pid" 15
fi
rm -f "$SOCK" "$SOCK.ttrpc" "$PIDFILE"
echo "$FLAVOR" >"$BASE/flavor"
t0=$(date +%s.%N)
log "starting containerd $FLAVOR (snapshotter=$SNAP), log: $LOG"
echo "=== containerd-up.sh start $(date -Is)" >>"$LOG"
PATH="$BIN:$PATH" setsid "$BIN/containerd" --config "$BASE/config.toml" </dev/null >>"$LOG" 2>&1 &
echo $! >"$PIDFILE"
pid="$(cat "$PIDFILE")"

deadline=$(( $(date +%s) + TIMEOUT ))
until ctr_ version >/dev/null 2>&1; do
    alive "$pid" || { tail -n 30 "$LOG" >&2; die "containerd exited during startup"; }
    [ "$(date +%s)" -lt "$deadline" ] || { tail -n 30 "$LOG" >&2; die "containerd did not answer within ${TIMEOUT}s"; }
    sleep 0.05
done
t1=$(date +%s.%N)
log "containerd gRPC up after $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}")s"

# import the images unless present (content survives restarts)
have="$(ctr_ -n k8s.io images ls -q 2>/dev/null || true)"
for pair in "$PAUSE_IMAGE:pause.tar" "$BUSYBOX_IMAGE:busybox.tar"; do
    img="${pair%:*}"; tarf="${pair##*:}"
    if ! grep -qxF "$img" <<<"$have"; then
        log "ctr -n k8s.io images import $tarf"
        ctr_ -n k8s.io images import --snapshotter "$SNAP" --platform linux/amd64 "$BASE/images/$tarf" >&2
    fi
done

until cri_ready; do
    alive "$pid" || { tail -n 30 "$LOG" >&2; die "containerd exited"; }
    [ "$(date +%s)" -lt "$deadline" ] || { tail -n 30 "$LOG" >&2; die "CRI did not answer within ${TIMEOUT}s"; }
    sleep 0.05
done
t2=$(date +%s.%N)
log "CRI ready after $(awk "BEGIN{printf \"%.2f\", $t2 - $t0}")s total (containerd $FLAVOR pid $pid, socket $SOCK)"
echo "$SOCK"
