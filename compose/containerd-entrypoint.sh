#!/bin/sh
# Entry point of the demo's containerd container (compose/containerd.Dockerfile).
# Prepares what runc needs inside a privileged container, then execs containerd.
set -eu

CONFIG=/etc/containerd/config.toml

# cgroup v2 (Docker's default cgroupns=private): processes may not live in a cgroup
# whose controllers are delegated to children ("no internal processes"). Move every
# process of this container's root cgroup into a leaf, then enable all controllers for
# the children, so runc can create the pods' cgroups. The same dance as Docker-in-Docker.
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    mkdir -p /sys/fs/cgroup/init
    while read -r pid; do
        echo "$pid" >/sys/fs/cgroup/init/cgroup.procs 2>/dev/null || true
    done </sys/fs/cgroup/cgroup.procs
    sed -e 's/ / +/g' -e 's/^/+/' /sys/fs/cgroup/cgroup.controllers \
        >/sys/fs/cgroup/cgroup.subtree_control || echo "containerd-entrypoint: could not enable cgroup controllers" >&2
fi

# overlayfs cannot use an upper dir on overlayfs: if /var/lib/containerd is not a
# volume, fall back to the (slower) native snapshotter.
mkdir -p /var/lib/containerd /run/containerd
if [ "$(stat -f -c %T /var/lib/containerd)" = overlayfs ]; then
    echo "containerd-entrypoint: /var/lib/containerd is on overlayfs, using the native snapshotter" >&2
    sed 's/snapshotter = "overlayfs"/snapshotter = "native"/' "$CONFIG" >/run/containerd-config.toml
    CONFIG=/run/containerd-config.toml
fi

exec containerd --config "$CONFIG" "$@"
