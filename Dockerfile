# syntax=docker/dockerfile:1
# dra-plugin: Kubernetes DRA kubelet plugin for Intel and NVIDIA GPUs.
#
# Stage 1 builds the project's wheel and the wheels of every dependency pyproject.toml
# declares; stage 2 installs them from that directory alone (no index), so the image holds
# exactly the dependencies of pyproject.toml and no compiler, build tool or pip cache.

ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos/ protos/
COPY dra_plugin/ dra_plugin/
# The wheel of this pyproject plus wheels of its dependencies, into /wheels.
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="dra-plugin" \
      org.opencontainers.image.description="Kubernetes DRA kubelet plugin for Intel (udev) and NVIDIA (NVML) GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

# libudev1: pyudev loads it to discover DRM devices. Not version-pinned on purpose: the
# Debian release is fixed by the base image tag, and its security updates should land.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libudev1 \
    && rm -rf /var/lib/apt/lists/*

# Install the wheel built from this pyproject (and its dependencies) from stage 1 only;
# the bind mount keeps the wheels out of the image's layers.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/dra_plugin-*.whl \
    && dra-plugin --help >/dev/null

# The plugin runs as root (uid 0) on purpose: it writes sockets into the kubelet's
# root-owned plugin directories and CDI specs into a root-owned host directory, and NVML
# opens root-owned /dev/nvidia* nodes. The chart drops every capability it can instead
# (all of them when only Intel is enabled). So there is no USER line.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["dra-plugin"]
CMD ["run"]
