"""A pod's hold timing, written off the job's path (``PodManager.annotate_later``), ends as
the newest release set it, even when that release came while the previous write was under
way: a restarted broker restores holds from these annotations (``broker.recovery``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

from broker.agent_client import AgentClient
from broker.pods import PodManager
from pool_manager.backends.local import LocalBackend
from pool_manager.catalog import Catalog
from pool_manager.tracker import Tracker


class SlowRecords(LocalBackend):
    """A local backend whose annotate takes its values when called and lands them 50 ms
    later, as a write in a worker thread on a loaded host does."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, sandbox=False)
        self.writing = asyncio.Event()

    async def annotate(self, name: str, annotations: Mapping[str, str | None]) -> None:
        taken = dict(annotations)
        self.writing.set()
        await asyncio.sleep(0.05)
        await super().annotate(name, taken)


async def test_a_release_during_the_previous_write_is_written_after_it(tmp_path: Path) -> None:
    backend = SlowRecords(tmp_path / "pods")
    catalog = Catalog.default()
    pods = PodManager(backend, Tracker(catalog), catalog, AgentClient(), time.time, lambda: None)
    await backend.create("cpu-a", catalog.pool("cpu"))
    try:
        pods.annotate_later("cpu-a", {"firepool/owner": "alice", "firepool/hold-until": "100"})
        await backend.writing.wait()  # the first write has taken its values
        pods.annotate_later("cpu-a", {"firepool/owner": "alice", "firepool/hold-until": "200"})
        pods.annotate_later("cpu-a", {"firepool/released-at": "150"})
        await pods.drain()
        (pod,) = await LocalBackend(tmp_path / "pods").list()  # as a restarted broker reads
        assert pod.annotations["firepool/hold-until"] == "200"
        assert pod.annotations["firepool/released-at"] == "150"
        assert pod.annotations["firepool/owner"] == "alice"
    finally:
        await backend.delete("cpu-a")
        await pods.agents.close()
