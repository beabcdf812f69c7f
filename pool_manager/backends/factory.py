"""Which pod backend a broker runs on, by name (``Settings.backend``, ``FIREPOOL_BACKEND``).

Each backend module is imported only when it is chosen: a broker on local pods never loads
the fake's HTTP server, and reading the list of names (``BACKEND_KINDS``, what the settings
check a name against) loads neither.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from functions.errors import InvalidRequest
from pool_manager.backends.base import PodBackend
from pool_manager.backends.gpu_share import GpuShare

BACKEND_KINDS = ("local", "fake", "kubernetes")
"""The backends a broker can be built on: ``local`` (a ``pod_runtime`` agent process per pod on
this machine, the default), ``kubernetes`` (a Kubernetes pod per pod, from its pool's
template: ``pool_manager/backends/kubernetes.py``) and ``fake`` (in-memory pods running
attempts in the broker's own process, for fast tests: ``pool_manager/backends/fake.py`` says
what it does not emulate)."""


@dataclass(frozen=True, slots=True)
class KubernetesOptions:
    """What the kubernetes backend is told (the broker's ``k8s_*`` settings)."""

    namespace: str = "default"
    create_qps: float = 20.0
    """Pod creates per second, at most."""
    agent_port: int = 8090
    """Where every pod's agent listens, at its pod IP."""
    rendezvous_port: int = 29500
    """The port declared on every pod that a gang's rank 0 listens on (``MASTER_PORT``)."""
    kubeconfig: Path | None = None
    """None: the in-cluster configuration."""
    gpu: GpuShare = field(default_factory=GpuShare)
    """GPU resource names, a standby's fractional share and its pin (``gpu_share``)."""


def make_backend(
    kind: str,
    *,
    root: Path,
    open_package: Callable[[str], BinaryIO],
    sandbox: bool | None = None,
    gpus: Mapping[str, tuple[str, ...]] | None = None,
    private: Sequence[Path] = (),
    agent_key: bytes | None = None,
    kubernetes: KubernetesOptions | None = None,
    package_url: Callable[[str], str] | None = None,
) -> PodBackend:
    """The backend ``kind`` names, keeping its pods' state under ``root``.

    ``open_package``: a package's stored bytes by digest, as a file (the broker's package
    store's ``open``): fake pods read packages through it, local pods fetch signed URLs.
    ``sandbox``, ``gpus`` (the catalog's declared cards per accelerator) and ``private``
    (directories no pod may see: the broker's state; the operator's home directory is added)
    concern local pods only. ``agent_key`` (``pod_runtime.agent_auth.agent_key``): what each
    pod's agent secret is derived from (local and Kubernetes pods). ``kubernetes``: the
    kubernetes backend's options. ``package_url`` (the store's ``url``): local pods fetch
    URLs of its form through the backend's fetch socket (``package_proxy``).
    ``InvalidRequest`` naming the known backends for any other ``kind``."""
    if kind == "local":
        from pool_manager.backends.gpus import GpuInventory
        from pool_manager.backends.local import LocalBackend, operator_home

        return LocalBackend(
            root,
            sandbox=sandbox,
            gpus=GpuInventory(gpus or {}),
            private=[*private, *operator_home()],
            agent_key=agent_key,
            package_url=package_url,
        )
    if kind == "kubernetes":
        from pool_manager.backends.kubernetes import KubernetesBackend

        if agent_key is None:
            raise ValueError("Kubernetes pods need an agent key: anyone could call them")
        return KubernetesBackend.connect(kubernetes or KubernetesOptions(), agent_key)
    if kind == "fake":
        from pool_manager.backends.fake import FakeBackend

        return FakeBackend(root, open_package)
    raise InvalidRequest(
        f"unknown pod backend {kind!r}; the backends are: {', '.join(BACKEND_KINDS)}",
        field="backend",
    )
