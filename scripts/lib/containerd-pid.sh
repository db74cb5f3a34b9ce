# shellcheck shell=bash
# Shared by containerd-up.sh and containerd-down.sh (sourced, not run).

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
