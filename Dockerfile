# syntax=docker/dockerfile:1
# gaslocd: one daemon per container (docs/design.md §2). Two variants from one file:
#   docker build -t gaslocd .                               CUDA 12.8 runtime, torch cu128 (GPU hosts)
#   docker build -t gaslocd:cpu --build-arg VARIANT=cpu .   python:3.11-slim, CPU torch
# TORCH_SPEC / TORCH_INDEX pick another torch build (e.g. another CUDA line).
#
# Ports (all TCP; publish the first two where you can: a peer that others cannot dial is
# detected at start-up and dials out only, see README "Behind a home router"):
#   7070   gRPC: parameter exchange, GetState for newcomers, Status, Probe (--port)
#   31337  hivemind DHT (libp2p): discovery and the bootstrap address (--dht-port)
#   9410   Prometheus /metrics (--metrics-port); keep it inside the operator's network
# Volumes: /var/lib/gaslocd/checkpoints (--checkpoint-dir), /data (token data for --data).
ARG VARIANT=cuda
ARG CUDA_BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG CPU_BASE=python:3.11-slim-bookworm

FROM ${CUDA_BASE} AS base-cuda
ENV TORCH_INDEX_DEFAULT=https://download.pytorch.org/whl/cu128
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

FROM ${CPU_BASE} AS base-cpu
ENV TORCH_INDEX_DEFAULT=https://download.pytorch.org/whl/cpu

# hadolint ignore=DL3006
FROM base-${VARIANT}
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX=
SHELL ["/bin/sh", "-eu", "-c"]
# glibc allocator settings that keep big message buffers in the heap (docs/design.md §3, measured).
ENV VIRTUAL_ENV=/opt/gaslocd \
    PATH=/opt/gaslocd/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MALLOC_MMAP_THRESHOLD_=33554432 \
    MALLOC_TRIM_THRESHOLD_=1073741824
# torch first, from its own index, so that installing gaslocd keeps that build
# (TORCH_SPEC pins it; hadolint cannot see through the variable).
# hadolint ignore=DL3013
RUN python3 -m venv /opt/gaslocd \
    && pip install --no-cache-dir --index-url "${TORCH_INDEX:-$TORCH_INDEX_DEFAULT}" "$TORCH_SPEC"
COPY pyproject.toml README.md /tmp/src/
COPY gaslocd /tmp/src/gaslocd
# hadolint ignore=DL3013
RUN pip install --no-cache-dir "/tmp/src[export]" && rm -rf /tmp/src
COPY --chmod=0755 deploy/gaslocd-compose.sh /usr/local/bin/gaslocd-compose
# Non-root (uid 10001); the directories exist in the image so that named volumes mounted there start
# owned by this user.
RUN groupadd --system --gid 10001 gaslocd \
    && useradd --system --uid 10001 --gid gaslocd --home-dir /var/lib/gaslocd --create-home gaslocd \
    && mkdir -p /var/lib/gaslocd/checkpoints /data /run/gaslocd \
    && chown -R gaslocd:gaslocd /var/lib/gaslocd /data /run/gaslocd
USER 10001:10001
WORKDIR /var/lib/gaslocd
# Settings are GASLOCD_<FLAG> variables (flag > env > --config > default); these suit a
# container. Set GASLOCD_ANNOUNCE to the address other peers dial (and GASLOCD_TOKEN).
ENV GASLOCD_HOST=0.0.0.0 \
    GASLOCD_PORT=7070 \
    GASLOCD_DHT_PORT=31337 \
    GASLOCD_METRICS_PORT=9410 \
    GASLOCD_CHECKPOINT_DIR=/var/lib/gaslocd/checkpoints
VOLUME ["/var/lib/gaslocd/checkpoints", "/data"]
EXPOSE 7070/tcp 31337/tcp 9410/tcp
# The daemon answers Status from the moment its gRPC server is up (before the first round);
# the start period covers importing torch and starting the DHT.
HEALTHCHECK --interval=30s --timeout=15s --start-period=120s --retries=3 \
    CMD ["sh", "-c", "gaslocd status --timeout 10 \"127.0.0.1:${GASLOCD_PORT}\" > /dev/null"]
ENTRYPOINT ["gaslocd"]
CMD ["--help"]
