# syntax=docker/dockerfile:1
# The generic pod base image: the pod agent (`python -m pod_runtime.agent`), Python, uv, and
# the modules pools preload into their zygotes. Every pool's pods start from one such image;
# a job's code arrives later as a package, never baked in.
# Build from the repository root:  docker build -f docker/pod.Dockerfile -t firepool-pod .
#   --build-arg PRELOAD_PACKAGES="numpy torch"   what pools may `preload:` (default numpy)
#
# The base is pinned to one Python patch release on one Debian release; pin its digest too
# (PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:...) where builds must be bit-for-bit.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG PRELOAD_PACKAGES="numpy"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/firepool
WORKDIR /src
COPY docker/pod-requirements.txt ./
RUN /opt/firepool/bin/pip install -r pod-requirements.txt ${PRELOAD_PACKAGES}
# The wheel holds only the packages a pod runs: the agent and the error classes it reports.
COPY pyproject.toml README.md ./
COPY pod_runtime ./pod_runtime
COPY functions ./functions
RUN /opt/firepool/bin/pip install --no-deps . \
 && /opt/firepool/bin/python -c "import pod_runtime.agent, pod_runtime.zygote"

FROM ${PYTHON_IMAGE}
# The agent runs unprivileged, so jobs run as its uid (pod_runtime.jobuser needs root to
# drop to another); the pod itself (its container, namespace and NetworkPolicy) is the
# boundary. /pod is the pod directory (packages, scratch, caches): the kubernetes backend
# mounts an emptyDir there (pool_manager/backends/kubernetes_spec.py, POD_DIR).
RUN groupadd --system --gid 10002 firepool \
 && useradd --system --uid 10002 --gid 10002 --no-create-home --home-dir /pod firepool \
 && install -d -m 0700 -o 10002 -g 10002 /pod
COPY --from=build /opt/firepool /opt/firepool
ENV PATH=/opt/firepool/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10002:10002
WORKDIR /pod
ENTRYPOINT ["python", "-m", "pod_runtime.agent"]
CMD ["--pod-name", "pod", "--pod-dir", "/pod", "--listen", "tcp:0.0.0.0:8090"]
