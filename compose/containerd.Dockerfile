# syntax=docker/dockerfile:1
# containerd 1.7 with its CRI plugin, for the docker-compose demo (docs/compose.md).
# Debian trixie packages containerd 1.7.24 and runc 1.1.15: the versions plegd's
# real-runtime tests use (shared/runtime). Runs privileged (see docker-compose.yml).
FROM debian:trixie-slim

# ca-certificates: CRI pulls the pause and busybox images over TLS.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends containerd runc ca-certificates \
 && rm -rf /var/lib/apt/lists/*

COPY containerd-config.toml /etc/containerd/config.toml
COPY --chmod=0755 containerd-entrypoint.sh /usr/local/bin/containerd-entrypoint

# /var/lib/containerd: images and snapshots (a volume: overlayfs cannot stack on the
# container's own overlay root). /run/containerd: the sockets, shared with plegd and
# the workload generator through a named volume.
VOLUME ["/var/lib/containerd"]

ENTRYPOINT ["/usr/local/bin/containerd-entrypoint"]
