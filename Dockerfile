# dra-plugin: Kubernetes DRA kubelet plugin for Intel, NVIDIA and AMD GPUs.
#
# BASE_IMAGE is any Debian bookworm image: python:3.12.12-slim-bookworm (the default), or plain
# Debian (debian:bookworm-slim, or one built locally with debootstrap), which gets
# Debian's python3. Stage 1 builds the project's wheel and the wheels of its
# dependencies at the versions constraints.txt pins; stage 2 installs them from that
# directory alone (no index) into a venv at /opt/dra-plugin, so the image holds exactly
# those dependencies and no pip, compiler, build tool, pip cache or apt lists.

ARG BASE_IMAGE=python:3.12.12-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CONSTRAINT=/src/constraints.txt
# A venv, because Debian's python3 refuses system-wide pip installs (PEP 668). Plain
# Debian has no python3 (or no venv support) until it is installed here.
# hadolint ignore=DL3008
RUN python3 -m venv /opt/build 2>/dev/null \
    || { rm -rf /opt/build \
         && apt-get update \
         && apt-get install -y --no-install-recommends python3 python3-venv \
         && apt-get clean && rm -rf /var/lib/apt/lists/* \
         && python3 -m venv /opt/build; }
WORKDIR /src
COPY constraints.txt pyproject.toml README.md ./
COPY protos/ protos/
COPY dra_plugin/ dra_plugin/
# The wheel of this pyproject plus wheels of its dependencies, and pip's own wheel (stage 2
# runs pip from it instead of installing pip), into /wheels. PIP_CONSTRAINT pins the
# build backend too. Behind a TLS-intercepting proxy, pass its CA bundle as the optional
# secret `pip-ca` (`--secret id=pip-ca,src=/etc/ssl/certs/ca-certificates.crt`).
RUN --mount=type=secret,id=pip-ca \
    if [ -f /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && /opt/build/bin/pip wheel --wheel-dir /wheels pip . \
    && sha256sum /wheels/*.whl >/wheels/SHA256SUMS

FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="dra-plugin" \
      org.opencontainers.image.description="Kubernetes DRA kubelet plugin for Intel, NVIDIA and AMD GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"

# libudev1: pyudev loads it to discover DRM devices; python3 where the base has none.
# Not version-pinned on purpose: the Debian release is fixed by the base image, and its
# security updates should land. apt-get clean: plain Debian, unlike the python and
# debian:*-slim images, keeps the downloaded .debs and package caches.
# hadolint ignore=DL3008,SC2046
RUN apt-get update \
    && apt-get install -y --no-install-recommends libudev1 \
       $(command -v python3 >/dev/null || echo python3) \
    && apt-get clean && rm -rf /var/lib/apt/lists/*

# Install the wheel built from this pyproject (and its dependencies) from stage 1 only;
# the bind mount keeps the wheels, and pip, out of the image's layers. The wheels' checksums
# are copied first, and kept as a record of what was installed: podman/buildah caches a RUN
# with a bind mount from another stage on its command text alone, so without this layer a
# rebuild after a code change reused the old install and shipped the old code.
COPY --from=build /wheels/SHA256SUMS /opt/dra-plugin/wheels.sha256
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python3 -m venv --without-pip /opt/dra-plugin \
    && pip_wheel="$(echo /wheels/pip-*.whl)" \
    && /opt/dra-plugin/bin/python "${pip_wheel}/pip" install --no-cache-dir --no-index \
       --disable-pip-version-check --find-links=/wheels /wheels/dra_plugin-*.whl \
    && /opt/dra-plugin/bin/dra-plugin --help >/dev/null

# The plugin runs as root (uid 0) on purpose: it writes sockets into the kubelet's
# root-owned plugin directories and CDI specs into a root-owned host directory, and NVML
# opens root-owned /dev/nvidia* nodes. The chart drops every capability it can instead
# (all of them when only Intel is enabled). So there is no USER line.
ENV PATH=/opt/dra-plugin/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# SOURCE_TREE: a hash of the build context, set by whoever builds (the image test does, and
# checks it). Last, so that a new value rebuilds nothing but this label.
ARG SOURCE_TREE=unknown
LABEL io.github.dra-plugin.source-tree="${SOURCE_TREE}"
ENTRYPOINT ["dra-plugin"]
CMD ["run"]
