"""The local backend's pod records under concurrent writes: each ``annotate`` merges.

The broker writes one pod's annotations from two places at once: a release's hold timing
(``PodManager.annotate_later``) and the next claim's owner or retire mark (``persist_owner``,
awaited before user code runs). Each runs in a worker thread; a read-modify-write of the
record without a lock lost one of them, or failed on the other's temporary file.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pool_manager.backends.local import LocalBackend
from pool_manager.catalog import PoolSpec


async def test_concurrent_annotations_of_one_pod_all_land(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "pods", sandbox=False)
    await backend.create("cpu-a", PoolSpec(sku="cpu"))
    try:
        for round_ in range(5):
            keys = [f"firepool/k{round_}-{i}" for i in range(16)]
            await asyncio.gather(*(backend.annotate("cpu-a", {key: "v"}) for key in keys))
            (pod,) = await LocalBackend(tmp_path / "pods").list()  # as a restarted broker
            assert sorted(k for k in keys if k not in pod.annotations) == []
        await asyncio.gather(
            backend.annotate("cpu-a", {"firepool/owner": "alice", "firepool/hold-until": "9"}),
            backend.annotate("cpu-a", {"firepool/retire-after": "session_boundary"}),
            backend.annotate("cpu-a", {"firepool/k0-0": None}),
        )
        (pod,) = await backend.list()
        assert pod.alive
        assert pod.annotations["firepool/retire-after"] == "session_boundary"
        assert pod.annotations["firepool/owner"] == "alice"
        assert "firepool/k0-0" not in pod.annotations
    finally:
        await backend.delete("cpu-a")
