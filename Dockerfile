# syntax=docker/dockerfile:1
# kubegpu's image: the device plugin and every other kubegpu command, entrypoint `kubegpu`.
#
# `make image` builds it (scripts/image/build.sh) on bases it first builds from Debian 12's own packages,
# so no registry is needed (scripts/image/build-base.sh: distroless-style, Python 3.11 and the C libraries
# it loads, no shell, no package manager), passed in as BUILD_BASE and RUNTIME_BASE. Without them, where
# a registry is reachable, the official Python image serves for both stages:
#   docker build -t REGISTRY/kubegpu:0.1.0 --build-arg VERSION=0.1.0 .
# Behind a TLS-intercepting proxy, give pip the proxy's CA as a build secret (mounted for the RUN steps
# that download, never copied into a layer): --secret id=pip-ca,src=/etc/ssl/certs/ca-certificates.crt
# Python 3.11: the version requirements/*.txt are pinned for (scripts/lock_requirements.py).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG BUILD_BASE=${PYTHON_IMAGE}
ARG RUNTIME_BASE=${PYTHON_IMAGE}

FROM ${BUILD_BASE} AS build
# Dependencies first, in their own layer: it is rebuilt only when the pins change. Wheels only, each
# checked against its hash in requirements/runtime.txt, so two builds of one commit install the same files.
COPY requirements/ /src/requirements/
COPY scripts/build_venv.py /src/scripts/build_venv.py
RUN --mount=type=secret,id=pip-ca ["python3", "/src/scripts/build_venv.py", "deps", "--venv", "/opt/kubegpu", "--src", "/src", "--pip-cert", "/run/secrets/pip-ca"]
COPY pyproject.toml README.md /src/
COPY src/ /src/src/
RUN --mount=type=secret,id=pip-ca ["python3", "/src/scripts/build_venv.py", "project", "--venv", "/opt/kubegpu", "--src", "/src", "--pip-cert", "/run/secrets/pip-ca"]
# No installer in the image: pip and setuptools leave the venv.
RUN ["python3", "/src/scripts/build_venv.py", "prune", "--venv", "/opt/kubegpu"]

# Same base family as the build stage: the venv's interpreter links point at its python3.11.
FROM ${RUNTIME_BASE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="kubegpu" \
      org.opencontainers.image.description="Kubernetes GPU device plugin, a drop-in for NVIDIA's k8s-device-plugin v0.20, and its SRE toolkit" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/kubegpu /opt/kubegpu
# No bytecode writes: the node daemons run with a read-only root filesystem (pip compiled it at install).
ENV PATH=/opt/kubegpu/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default (lint, explain, doctor --cluster need no privileges). The node daemons run as uid 0
# because the kubelet's directories are root-only; the chart and the static manifests set that.
USER 65532:65532
ENTRYPOINT ["kubegpu"]
CMD ["--help"]
