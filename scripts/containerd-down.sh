#!/usr/bin/env bash
# containerd-down.sh - stop the private containerd started by scripts/containerd-up.sh and
# clean up after it.
#
# Usage:  scripts/containerd-down.sh [BASE] [--purge | --purge-all]
#   BASE defaults to $PLEGD_CRI_BASE, else /var/lib/plegd-ci (with PLEGD_CRI_CONTAINERD=1.6
#   or 2 the default gets a "-1.6" or "-2.1" suffix, as in containerd-up.sh)
#
#   1. if this BASE's containerd (PID from BASE/containerd.pid, cmdline checked) is up:
#      kills and deletes every task and container in every namespace with ctr (CRI pods
#      included: sandboxes are containerd containers too), then SIGTERMs it (SIGKILL after
#      10 s);
#   2. shims of THIS instance still alive (possible when containerd died earlier): found by
#      `-address BASE/containerd.sock` in their cmdline; their children (container
#      processes) are SIGKILLed, then the shim, all by PID;
#   3. unmounts everything under BASE (deepest first) and removes this instance's shim
#      sockets from /run/containerd/s (read from the bundles' address files);
#   --purge      also deletes the runtime data (root/, state/, runc/, logs/, opt/): the next
#                up starts empty but stays warm (bin*/, cache/, images/ are kept, ~1 s)
#   --purge-all  deletes BASE entirely.
# Idempotent. Never kills anything by name; only PIDs that belong to this BASE.
set -uo pipefail

case "${PLEGD_CRI_CONTAINERD:-1.7}" in
    1.6) BASE="${PLEGD_CRI_BASE:-/var/lib/plegd-ci}-1.6" ;;
    2|2.*) BASE="${PLEGD_CRI_BASE:-/var/lib/plegd-ci}-2.1" ;;
    *) BASE="${PLEGD_CRI_BASE:-/var/lib/plegd-ci}" ;;
esac
PURGE=0
for arg in "$@"; do
    case "$arg" in
        --purge) PURGE=1 ;;
        --purge-all) PURGE=2 ;;
        -h|--help) sed -n '2,21p' "$0" >&2; exit 0 ;;
        -*) echo "[containerd-down] unknown option $arg" >&2; exit 2 ;;
        *) BASE="$arg" ;;
    esac
done
[ -d "$BASE" ] || { echo "[containerd-down] nothing at $BASE" >&2; exit 0; }
if [ "$(id -u)" != 0 ]; then echo "[containerd-down] must run as root" >&2; exit 1; fi
BASE="$(realpath "$BASE")"
case "$BASE" in /|/var|/var/lib|/tmp|/root|/home) echo "[containerd-down] refusing BASE=$BASE" >&2; exit 2 ;; esac
SOCK="$BASE/containerd.sock"
PIDFILE="$BASE/containerd.pid"
log() { printf '[containerd-down %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# whichever containerd version ran here: its own ctr
CTR=""
if [ -f "$BASE/flavor" ] && [ "$(cat "$BASE/flavor")" = 1.6 ] && [ -x "$BASE/bin-1.6/ctr" ]; then
    CTR="$BASE/bin-1.6/ctr"
elif [ -f "$BASE/flavor" ] && [ "$(cat "$BASE/flavor")" = 2 ] && [ -x "$BASE/bin-2/ctr" ]; then
    CTR="$BASE/bin-2/ctr"
elif [ -x "$BASE/bin/ctr" ]; then
    CTR="$BASE/bin/ctr"
elif [ -x "$BASE/bin-2/ctr" ]; then
    CTR="$BASE/bin-2/ctr"
elif [ -x "$BASE/bin-1.6/ctr" ]; then
    CTR="$BASE/bin-1.6/ctr"
fi
ctr_() { [ -n "$CTR" ] && timeout 30 "$CTR" --address "$SOCK" "$@"; }

# shellcheck source-path=SCRIPTDIR source=lib/containerd-pid.sh
. "$(dirname "$(readlink -f "$0")")/lib/containerd-pid.sh"

# shim sockets of this instance, read from the bundles' "address" files (1.x) or
# "bootstrap.json" files (2.x: {"version":3,"address":"unix:///run/containerd/s/..",..})
shim_sockets() {
    local f
    for f in "$BASE"/state/io.containerd.runtime.v2.task/*/*/address; do
        [ -f "$f" ] && { sed 's|^unix://||' "$f"; echo; }   # the files have no trailing newline
    done
    for f in "$BASE"/state/io.containerd.runtime.v2.task/*/*/bootstrap.json; do
        [ -f "$f" ] && { sed -n 's|.*"address" *: *"unix://\([^"]*\)".*|\1|p' "$f"; echo; }
    done
}
SHIM_SOCKS="$(shim_sockets)"

if pid="$(running_pid "--config $BASE/config.toml")"; then
    n=0
    for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
        for t in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
            ctr_ -n "$ns" tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
        done
        for t in $(ctr_ -n "$ns" tasks ls -q 2>/dev/null); do
            ctr_ -n "$ns" tasks delete -f "$t" >/dev/null 2>&1 || true
        done
        for c in $(ctr_ -n "$ns" containers ls -q 2>/dev/null); do
            ctr_ -n "$ns" containers delete "$c" >/dev/null 2>&1 || true
            n=$((n + 1))
        done
    done
    log "removed $n containers (pods included)"
    SHIM_SOCKS="$SHIM_SOCKS $(shim_sockets)"
    log "stopping containerd pid $pid (SIGTERM)"
    stop_pid "$pid" 10
else
    log "containerd for $BASE is not running"
fi

# leftover shims of this instance (cmdline: containerd-shim-runc-v2 -namespace NS -address SOCK ...)
for d in /proc/[0-9]*; do
    s="${d#/proc/}"
    cmd="$( { tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null )" || continue
    case "$cmd" in
        *containerd-shim*" -address $SOCK "*)
            for c in $(ps -o pid= --ppid "$s" 2>/dev/null); do
                log "killing container process $c (child of leftover shim $s)"
                kill -KILL "$c" 2>/dev/null || true
            done
            log "killing leftover shim $s"
            kill -KILL "$s" 2>/dev/null || true
            ;;
    esac
done

# unmount everything under BASE, deepest first
for _ in 1 2 3; do
    mnts="$(findmnt -rn -o TARGET | grep -F "$BASE/" | grep -E "^$BASE/" | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-)"
    [ -n "$mnts" ] || break
    while IFS= read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
    done <<<"$mnts"
done

for s in $SHIM_SOCKS; do case "$s" in /run/containerd/s/*) rm -f "$s" ;; esac; done
rm -f "$SOCK" "$SOCK.ttrpc" "$PIDFILE" "$BASE/nri.sock"

case "$PURGE" in
    1) log "purging runtime data under $BASE"
       rm -rf "$BASE/root" "$BASE/state" "$BASE/runc" "$BASE/logs" "$BASE/opt" "$BASE/flavor" ;;
    2) log "removing $BASE"
       rm -rf "$BASE" ;;
esac
log "down"
