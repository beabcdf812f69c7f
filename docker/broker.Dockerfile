# syntax=docker/dockerfile:1
# The Firepool broker: `firepool serve` (gateway, broker, control plane) in its own venv.
# Build from the repository root:  docker build -f docker/broker.Dockerfile -t firepool-broker .
#
# The base is pinned to one Python patch release on one Debian release; pin its digest too
# (PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:...) where builds must be bit-for-bit.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/firepool
WORKDIR /src
# Only what the wheel is built from: the packaging metadata and the broker's packages.
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY broker ./broker
COPY pool_manager ./pool_manager
COPY functions ./functions
COPY pod_runtime ./pod_runtime
COPY simulator ./simulator
RUN /opt/firepool/bin/pip install . \
 && /opt/firepool/bin/python -c "import gateway.cli, broker.service"

FROM ${PYTHON_IMAGE}
# The broker runs as an unprivileged user; its state directory (FIREPOOL_HOME) is the only
# place it writes: an emptyDir or a volume on Kubernetes, mounted owner-only.
RUN groupadd --system --gid 10001 firepool \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/firepool firepool \
 && install -d -m 0700 -o 10001 -g 10001 /var/lib/firepool
COPY --from=build /opt/firepool /opt/firepool
ENV PATH=/opt/firepool/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    FIREPOOL_HOME=/var/lib/firepool \
    FIREPOOL_HOST=0.0.0.0 \
    FIREPOOL_PORT=8080
USER 10001:10001
WORKDIR /var/lib/firepool
EXPOSE 8080
ENTRYPOINT ["python", "-m", "gateway.cli"]
CMD ["serve"]
