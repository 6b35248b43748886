# syntax=docker/dockerfile:1
# Reflex for cold jobs (serverless functions, CI steps, cron, one Kubernetes Job per decision).
#
# Two stages: the builder has the CUDA toolkit and compiles the kernels into wheels; the runtime
# is a slim Python holding those wheels and their dependencies -- no nvcc, no CUDA toolkit. The
# driver comes from the host through the NVIDIA container runtime (cuda-bindings needs only
# libcuda). Both install steps are scripts that CI runs outside a container
# (tests/test_deploy_image.py).
#
#   docker build -t reflex .
#   docker build -t reflex --build-arg REFLEX_CUDA_ARCH=sm_90 --build-arg REFLEX_PLUGINS=qwen3 .
#   docker run --rm --gpus all -v "$PWD/models:/models:ro" reflex /models/m.gguf "Hello" -n 16
#
# Build arguments:
#   REFLEX_CUDA_ARCH  empty (default): SASS for every GPU generation the toolkit knows from sm_80
#                     (Ampere) on, plus PTX of the newest, which the driver compiles for a later
#                     GPU; sm_XX or a list (sm_80,sm_90): those only, plus PTX of the newest
#                     (a much shorter build)
#   REFLEX_PLUGINS    the architecture plugins built and installed (folders of plugins/)
#   CUDA_IMAGE        the builder's toolkit; kernels built by nvcc 13 need a host driver >= 580
#   PYTHON_IMAGE      the runtime's Python (>= 3.10)

ARG CUDA_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG REFLEX_PLUGINS="qwen3 qwen3_moe qwen35_hybrid deepseek_mla"

FROM ${CUDA_IMAGE} AS builder
ARG REFLEX_CUDA_ARCH=""
ARG REFLEX_PLUGINS
# g++: nvcc's host compiler (it preprocesses every .cu). The versions are the CUDA image's
# Ubuntu release's: pinning them would break on its next update.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY reflex_core reflex_core
COPY cuda cuda
COPY plugins plugins
COPY scripts/build-wheels.sh scripts/
RUN python3 -m venv /opt/build \
    && PYTHON=/opt/build/bin/python sh scripts/build-wheels.sh /wheels

FROM ${PYTHON_IMAGE} AS runtime
ARG REFLEX_PLUGINS
# compute: the NVIDIA container runtime mounts the driver's libcuda into the container.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PATH=/opt/reflex/bin:$PATH
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    --mount=type=bind,source=scripts/runtime-install.sh,target=/tmp/runtime-install.sh \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    sh /tmp/runtime-install.sh /opt/reflex /wheels \
    && groupadd --gid 10001 reflex \
    && useradd --create-home --uid 10001 --gid 10001 reflex
# The Indexed Job's shard runner (deploy/k8s/indexed-job.yaml): standard library only.
COPY --chmod=0755 deploy/fanout.py /usr/local/bin/reflex-fanout
# Numeric: Kubernetes can then check runAsNonRoot without a runAsUser.
USER 10001:10001
WORKDIR /home/reflex
# The plugins' entry points, found once here into the user's cache (~/.cache/reflex): a container,
# often with a read-only root file system, then skips their discovery (~50-100 ms) on every run.
RUN ["reflex", "plugins"]
ENTRYPOINT ["reflex", "generate"]
