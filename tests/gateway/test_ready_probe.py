"""``ready_probe_delay``: how soon the broker sees a started pod ready, and how often it asks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from broker.agent_client import AgentClient
from broker.pods import READY_PROBE_MAX_S, READY_PROBE_MIN_S, PodManager, ready_probe_delay
from pool_manager.backends.local import LocalBackend, stop_pod
from pool_manager.catalog import Catalog
from pool_manager.tracker import Tracker


def _probes(ready_at: float) -> tuple[int, float]:
    """The probes ``wait_ready``'s schedule makes for a pod ready ``ready_at`` s after its
    create returned (a probe takes no time here), and when the first one that finds it
    ready comes."""
    t, probes = 0.0, 1
    while t < ready_at:
        t += ready_probe_delay(t)
        probes += 1
    return probes, t


@given(st.floats(min_value=0.0, max_value=600.0))
def test_the_pause_is_a_tenth_of_the_wait_between_5_and_200_ms(elapsed: float) -> None:
    delay = ready_probe_delay(elapsed)
    assert READY_PROBE_MIN_S <= delay <= READY_PROBE_MAX_S
    assert delay <= max(READY_PROBE_MIN_S, elapsed / 10 * (1 + 1e-12))  # rounding only


@given(st.floats(min_value=0.05, max_value=120.0))
def test_a_ready_pod_is_seen_within_a_tenth_of_its_start_or_200_ms(ready_at: float) -> None:
    _, seen = _probes(ready_at)
    assert ready_at <= seen <= ready_at + max(READY_PROBE_MIN_S, min(0.1 * seen, 0.2)) + 1e-9


def test_a_local_pod_is_seen_ready_soon_and_a_slow_one_is_not_probed_hot() -> None:
    assert _probes(0.33)[1] < 0.37  # a local pod's start; doubling from 5 ms: 0.515 s
    probes, _ = _probes(20.0)  # a cached Kubernetes pod start
    assert probes < 200  # ~5 a second once past 2 s


def test_a_pod_killed_while_it_starts_is_given_up_at_once_not_at_the_timeout(
    tmp_path: Path,
) -> None:
    """The broker probed a pod killed during its start until ``ready_timeout_s`` (60 s): its
    queued jobs waited that long per killed pod, and a broker stopping waited for it too
    (adversarial run). Real local pods; the kill is ``stop_pod``, as an operator's would be."""

    async def scenario() -> tuple[bool, float, bool, bool]:
        backend = LocalBackend(tmp_path / "pods")
        catalog = Catalog.default()
        pods = PodManager(backend, Tracker(catalog), catalog, AgentClient(), time.time,
                          lambda: None, ready_timeout_s=30.0)  # fmt: skip
        pool = catalog.pool("cpu")
        alive = await backend.create("cpu-alive", pool)
        doomed = await backend.create("cpu-doomed", pool)
        try:
            await asyncio.to_thread(stop_pod, tmp_path / "pods" / "cpu-doomed")
            t0 = time.monotonic()
            ready = await pods.wait_ready("cpu-doomed", doomed.endpoint)
            waited = time.monotonic() - t0
            alive_ready = await pods.wait_ready("cpu-alive", alive.endpoint)
            return ready, waited, alive_ready, await backend.exited("cpu-alive")
        finally:
            await backend.delete("cpu-alive")
            await backend.delete("cpu-doomed")
            await pods.agents.close()

    ready, waited, alive_ready, alive_exited = asyncio.run(scenario())
    assert not ready and waited < 5.0, waited
    assert alive_ready and not alive_exited
