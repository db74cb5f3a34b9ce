# syntax=docker/dockerfile:1
#
# plegd container image. From the repository root:
#
#   docker build -t plegd .
#   docker run --rm -v /run/containerd:/run/containerd:ro -p 9464:9464 plegd
#
# docker-compose.yml builds this image for the local demo (docs/compose.md), and the
# demo's workload generator from the same sources (`--target workload`);
# deploy/daemonset.yaml runs plegd on every node of a cluster (docs/deploy.md).

# ---------------------------------------------------------------- build environment
# The toolchain of rust-toolchain.toml (plegd/tests/deploy_files.rs checks the two agree).
FROM rust:1.95.0-bookworm AS build-env

# protoc: the k8s-cri crate's build script compiles the CRI proto (scripts/setup.sh
# installs the same package on a developer's machine).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . .

# ---------------------------------------------------------------- plegd build
# Exactly the build command of scripts/run.sh (plegd/tests/deploy_files.rs checks that
# the two stay the same). The cache mounts keep downloaded crates and target/ between
# builds, so the binary is copied out of target/ in the same step.
FROM build-env AS builder
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p plegd \
 && install -D -m 0755 target/release/plegd /out/plegd

# ---------------------------------------------------------------- workload (compose demo)
# The demo's workload generator (workload/, docs/compose.md): `--target workload`.
# It runs as root too: containerd's socket is root:root 0660 (see below).
FROM build-env AS workload-builder
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p plegd-workload \
 && install -D -m 0755 target/release/plegd-workload /out/plegd-workload

FROM debian:bookworm-slim AS workload
COPY --from=workload-builder /out/plegd-workload /usr/local/bin/plegd-workload
ENTRYPOINT ["plegd-workload"]

# ---------------------------------------------------------------- plegd image (default)
# The last stage, so a plain `docker build .` builds it. bookworm-slim: the same glibc
# as the builder; plegd links only libc, libm, libgcc_s.
FROM debian:bookworm-slim AS plegd

COPY --from=builder /out/plegd /usr/local/bin/plegd

# plegd runs as root (uid 0) on purpose: the CRI socket (containerd's
# /run/containerd/containerd.sock, CRI-O's /var/run/crio/crio.sock) is owned by
# root:root with mode 0660, and connecting to a unix socket needs write permission on
# it. uid 0 passes as the socket's owner, so no capability is needed: the DaemonSet
# and the systemd unit drop all of them and keep the root filesystem read-only.
# Running as another user would need the runtime's socket group changed on every node.
ENV RUST_LOG=info \
    PLEGD_RUNTIME_ENDPOINT=unix:///run/containerd/containerd.sock

# /metrics, /healthz, /readyz (with --metrics-addr 0.0.0.0:9464)
EXPOSE 9464

ENTRYPOINT ["plegd"]
CMD ["run", "--metrics-addr", "0.0.0.0:9464"]
