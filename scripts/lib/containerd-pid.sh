# shellcheck shell=bash
# Shared by containerd-up.sh and containerd-down.sh (sourced, not run; they define
# log and PIDFILE).

# a process that exists and is not a zombie (an unreaped zombie keeps its /proc entry)
alive() {
    local st
    st="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)"
    [ -n "$st" ] && [ "$st" != Z ]
}

# The PID in $PIDFILE if that process is alive and its command line contains $1
# (PIDs get reused: make sure it is still our containerd).
running_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 1
    pid="$(cat "$PIDFILE")"
    [ -n "$pid" ] && alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$1" || return 1
    echo "$pid"
}

# SIGTERM to $1, up to $2 seconds for it to exit, then SIGKILL (and 5 s more).
stop_pid() {
    local pid="$1" grace="$2"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq $((grace * 10))); do alive "$pid" || return 0; sleep 0.1; done
    log "pid $pid still alive after $grace s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive "$pid" || return 0; sleep 0.1; done
}
