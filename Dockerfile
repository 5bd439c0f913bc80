# syntax=docker/dockerfile:1
# kubegpu's image: the device plugin and every other kubegpu command, entrypoint `kubegpu`.
#   docker build -t REGISTRY/kubegpu:v0.1.0 --build-arg VERSION=0.1.0 .
# Python 3.11: the version requirements/*.txt are pinned for (scripts/lock_requirements.py).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Dependencies first, in their own layer: it is rebuilt only when the pins change.
COPY requirements/ /src/requirements/
COPY scripts/build_venv.py /src/scripts/build_venv.py
RUN python /src/scripts/build_venv.py deps --venv /opt/kubegpu --src /src
COPY pyproject.toml README.md /src/
COPY src/ /src/src/
RUN python /src/scripts/build_venv.py project --venv /opt/kubegpu --src /src

# Same base as the build stage: the venv's interpreter links point at its /usr/local/bin/python3.11.
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="kubegpu" \
      org.opencontainers.image.description="Kubernetes GPU device plugin, a drop-in for NVIDIA's k8s-device-plugin v0.20, and its SRE toolkit" \
      org.opencontainers.image.version="${VERSION}" \
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
