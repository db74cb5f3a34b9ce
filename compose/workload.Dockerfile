# syntax=docker/dockerfile:1
# The demo's workload generator (compose/workload.py): a CRI client in Python that
# creates and kills pods. Debian has no crictl package (trixie included), and an
# upstream crictl tarball would be a download outside any package registry, so the
# generator speaks CRI itself, with grpcio and the CRI v1 proto in compose/cri/
# (a copy of the k8s-cri 0.11.0 crate's proto, Apache-2.0).
FROM python:3.12-slim-bookworm

WORKDIR /app
RUN pip install --no-cache-dir grpcio==1.76.0 grpcio-tools==1.76.0

COPY cri/v1.proto cri/v1.proto
RUN python -m grpc_tools.protoc -I cri --python_out=. --grpc_python_out=. cri/v1.proto
COPY workload.py workload.py

# runs as root: containerd's socket is root:root 0660 (see the plegd Dockerfile)
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["python", "/app/workload.py"]
