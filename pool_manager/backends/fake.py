"""The fake pod backend (``FIREPOOL_BACKEND=fake``): in-memory pods that run attempts in the
broker's own process, for fast tests of everything above the backend.

A fake pod is no process: it is a record (``BackendPod``) plus an agent, an aiohttp app on a
unix socket in the event loop that created it, speaking the real pod agent protocol
(``fake_pod``), so the broker's ``AgentClient``, executor, lifecycle and recovery run
unchanged against it. Attempts run in-process (``fake_run``): a ``mod:fn`` in a thread of its
own, a ``command`` as a subprocess in the pod's package directory. Pods are ready once
``create`` returns; each has a directory ``root/<name>/`` laid out as a real pod's
(``pod_runtime.settings.PodLayout``); its socket lives in a short temporary directory of the
registry (a socket path is limited to 107 bytes; ``root`` may be deep).

State: ``FakePodRegistry``, one per ``root`` in this process (``FakePodRegistry.of``). Every
``FakeBackend`` over the same ``root`` shares it, so pods outlive the backend object that made
them (``close`` leaves them serving) and a new backend over the same ``root`` (a restarted
broker with the same home) lists them with their annotations, as a new ``LocalBackend`` over
the same ``root`` does from its pod records. A registry belongs to the event loop its pods
were created in; ``FakeBackend.shutdown`` stops every pod of the registry and forgets it (a
test's teardown: call it before that loop ends, or its servers are left open).

For tests that need failures: ``fail_creates`` (the next N creates raise ``CreateFailed``) and
``kill(name)`` (the pod dies: its agent stops answering, ``exited`` says so, ``list`` shows it
not alive until it is deleted).

Limits (what it does not emulate):
- no isolation at all: user code runs in the broker's process, as its user, with its
  imports, files and memory; a function that calls ``os._exit`` ends the test process;
- a function's thread cannot be stopped: a timeout or cancel ends the attempt at once but the
  thread runs on, and the pod's reset then answers unclean (the broker deletes the pod);
- ``os.environ`` is the process's: a ``mod:fn`` sees neither the function's ``env`` nor the
  broker's ``system_env`` (caller, job id, ranks); a ``command`` gets both, as on a real pod;
- a package's modules are importable by relative import only (``from . import util``); the
  package directory is not on ``sys.path`` (it would be shared by every pod in the process),
  so ``import util`` of a sibling module fails;
- only the calling thread's prints reach the attempt's log (not those of threads it starts,
  nor of C code writing to file descriptors 1 and 2);
- no requirements installs (refused ``DependencyInstallFailed``), no zygote or preload, no
  sandbox, cgroups, memory or pid limits (no ``OOM``), no log cap, no GPUs (``sweep`` reads no
  card, so a standby is never promoted; a pod keeps the ``gpu`` it was created with), and no
  start-up delay (a pod is ready when ``create`` returns).

Concurrency: event-loop only; the registry is a plain dict mutated between awaits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, ClassVar

from pod_runtime.settings import PodLayout
from pool_manager.backends.base import BackendPod, CreateFailed
from pool_manager.backends.fake_pod import FakePod
from pool_manager.backends.fake_run import OpenPackage
from pool_manager.catalog import PoolSpec


def _no_packages(digest: str) -> BinaryIO:
    raise LookupError(f"this fake backend was given no package store (asked for {digest})")


class FakePodRegistry:
    """The fake backend's state: its pods by name, and where their sockets are."""

    _by_root: ClassVar[dict[Path, FakePodRegistry]] = {}

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pods: dict[str, FakePod] = {}
        self.sockets = Path(tempfile.mkdtemp(prefix="firepool-fake-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.sockets, True)
        self.open_package: OpenPackage = _no_packages
        """Where pods read packages: the latest backend's (a restarted broker's store), as a
        real pod fetches from whichever broker now signs its URLs."""

    @classmethod
    def of(cls, root: Path) -> FakePodRegistry:
        """The registry of ``root`` (resolved) in this process, made on first use."""
        root = root.resolve()
        registry = cls._by_root.get(root)
        if registry is None:
            registry = cls._by_root[root] = cls(root)
        return registry

    async def shutdown(self) -> None:
        """Stop every pod and forget this state (``of`` makes a new one afterwards)."""
        pods, self.pods = list(self.pods.values()), {}
        await asyncio.gather(*(pod.stop() for pod in pods))
        if self._by_root.get(self.root) is self:
            del self._by_root[self.root]
        self._cleanup()


class FakeBackend:
    """Pods as in-memory agents in this event loop (see the module docstring for the limits)."""

    rendezvous_port: int | None = None
    """None: fake pods share the broker's host: each gang gets a free port."""

    def __init__(
        self,
        root: Path,
        open_package: OpenPackage | None = None,
        *,
        fail_creates: int = 0,
    ) -> None:
        """``open_package``: a package's stored bytes by digest, as a file (the broker passes
        its package store's ``open``). ``fail_creates``: how many of the next creates raise
        ``CreateFailed`` (also settable later, as an attribute)."""
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.registry = FakePodRegistry.of(self.root)
        if open_package is not None:
            self.registry.open_package = open_package
        self.fail_creates = fail_creates

    def _open_package(self, digest: str) -> BinaryIO:
        return self.registry.open_package(digest)

    async def create(
        self, name: str, pool: PoolSpec, role: str = "active", gpu: str | None = None
    ) -> BackendPod:
        if name in self.registry.pods:
            raise ValueError(f"pod {name} already exists")
        if role == "standby" and gpu is None and pool.is_gpu:
            raise ValueError("a standby pod needs the card of its active pod")
        if self.fail_creates > 0:
            self.fail_creates -= 1
            raise CreateFailed(f"pod {name} was not made (FakeBackend.fail_creates)")
        socket = self.registry.sockets / f"{name}.sock"
        record = BackendPod(
            name=name,
            sku=pool.sku,
            role=role,
            created=time.time(),
            endpoint=f"unix:{socket}",
            gpu=gpu,
            template=pool.template,
        )
        pod = FakePod(record, PodLayout(self.root / name), socket, self._open_package)
        self.registry.pods[name] = pod
        try:
            await pod.start()
        except Exception as exc:
            await self.delete(name)
            raise CreateFailed(f"pod {name} could not start: {exc!r}") from exc
        return _copy(record)

    async def delete(self, name: str) -> None:
        pod = self.registry.pods.pop(name, None)
        if pod is not None:
            await pod.stop()
        await asyncio.to_thread(shutil.rmtree, self.root / name, True)

    async def list(self) -> list[BackendPod]:
        return [_copy(pod.record) for _, pod in sorted(self.registry.pods.items())]

    async def annotate(self, name: str, annotations: Mapping[str, str | None]) -> None:
        pod = self.registry.pods.get(name)
        if pod is None:
            return
        for key, value in annotations.items():
            if value is None:
                pod.record.annotations.pop(key, None)
            else:
                pod.record.annotations[key] = value

    async def sweep(self, gpus: Sequence[str]) -> dict[str, bool]:
        """No card can be read here: nothing is known about any."""
        return {}

    async def exited(self, name: str) -> bool:
        pod = self.registry.pods.get(name)
        return pod is None or not pod.record.alive

    async def close(self) -> None:
        """Nothing to release: the pods keep serving, in the registry."""

    async def kill(self, name: str) -> None:
        """Make the pod die, as a crash or an operator's kill would: its agent stops
        answering and its attempts end; it stays listed, not alive, until it is deleted."""
        pod = self.registry.pods.get(name)
        if pod is not None:
            await pod.stop()

    async def shutdown(self) -> None:
        """Stop every pod of this backend's state and forget it: a test's teardown."""
        await self.registry.shutdown()


def _copy(record: BackendPod) -> BackendPod:
    """A snapshot callers may keep or change without touching the pod's record."""
    return dataclasses.replace(record, annotations=dict(record.annotations))
