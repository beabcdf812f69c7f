"""Gauges that mirror the broker's state, computed at scrape time from its facade.

``BrokerStateCollector`` is registered in the broker's own registry (``Telemetry.registry``)
and reads, on each scrape, what ``GET /v1/pools`` reads: the tracker's pods, the dispatcher's
queue and the budget ledger. Nothing is kept in step on the hot path; a scrape costs one pass
over the pods and the queue.

Held capacity: the budget ledger integrates the units each accelerator holds exactly
(``firepool_held_unit_seconds_total{accelerator}``). Its split by pool and owner state
(``firepool_pod_held_unit_seconds_total``) is integrated here, between scrapes: each interval
is counted against the pods' states as the previous scrape saw them, so a pod that changes
state between two scrapes is counted in its old state until the next one (scrape often, and
use ``rate()`` over several intervals). Its total over states can differ from the ledger's by
that, and because a standby pod holds no units of its own (its active pod's group holds the
GPU). Owner states: ``busy`` (assigned, running, resetting), ``owner_held`` (idle, its
owner's hold not yet over), ``idle`` (idle, no hold), ``starting``, ``terminating``.

Concurrency: ``collect`` runs where the scrape is served (the event loop, for ``/metrics``);
the lock only guards the integral against a second scrape from another thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pool_manager.model import PodInfo
from pool_manager.states import PodState

if TYPE_CHECKING:
    from broker.service import Broker

OWNER_STATE = {
    PodState.STARTING: "starting",
    PodState.ASSIGNED: "busy",
    PodState.RUNNING: "busy",
    PodState.RESETTING: "busy",
    PodState.RETIRING: "terminating",
}
"""A pod state's owner state; IDLE is ``owner_held`` or ``idle`` by its hold."""

HeldKey = tuple[str, str, str]
"""``(pool, accelerator, owner_state)``."""


def owner_state(pod: PodInfo, now: float) -> str | None:
    """What a pod's units are held for now; None once it is deleted."""
    if pod.state is PodState.IDLE:
        held = pod.hold_until is not None and pod.hold_until > now
        return "owner_held" if held else "idle"
    return OWNER_STATE.get(pod.state)


class BrokerStateCollector(Collector):
    """Pods, queues, budgets and held capacity of one broker, read at each scrape."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._lock = threading.Lock()
        self._held: dict[HeldKey, float] = {}
        """Unit-seconds integrated so far, per key."""
        self._rate: dict[HeldKey, int] = {}
        """Units held per key as the last scrape saw them."""
        self._since: float | None = None

    def describe(self) -> Iterator[Metric]:
        """The families this collector yields (no samples): registering does not scrape."""
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily | CounterMetricFamily, ...]:
        return (
            GaugeMetricFamily("firepool_ready", "1 while the broker dispatches jobs, else 0."),
            GaugeMetricFamily(
                "firepool_pods", "Pods by pool, state and role.", labels=["pool", "state", "role"]
            ),
            GaugeMetricFamily(
                "firepool_queue_depth", "Jobs waiting for pods.", labels=["pool", "queue"]
            ),
            GaugeMetricFamily(
                "firepool_queue_oldest_wait_seconds",
                "How long the longest-waiting queued job has waited since its submission.",
                labels=["pool", "queue"],
            ),
            GaugeMetricFamily(
                "firepool_budget_used_units",
                "GPUs or cores reserved per accelerator (creates reserve, deletes release).",
                labels=["accelerator"],
            ),
            GaugeMetricFamily(
                "firepool_budget_limit_units",
                "The catalog's budget per accelerator (absent: unbounded).",
                labels=["accelerator"],
            ),
            CounterMetricFamily(
                "firepool_held_unit_seconds",
                "GPU- or core-seconds each accelerator held, create to delete (exact: the "
                "budget ledger's integral); rate() of it is the capacity held.",
                labels=["accelerator"],
            ),
            CounterMetricFamily(
                "firepool_pod_held_unit_seconds",
                "GPU- or core-seconds held by pool, accelerator and owner state (busy, idle, "
                "owner_held, starting, terminating), integrated between scrapes.",
                labels=["pool", "accelerator", "owner_state"],
            ),
            CounterMetricFamily(
                "firepool_package_bytes_served",
                "Package bytes the broker served to pods (/v1/blobs); 0 with the s3 store, "
                "whose pods fetch from the bucket.",
            ),
            CounterMetricFamily(
                "firepool_package_bytes_relayed",
                "Package bytes local sandboxed pods fetched through the broker's fetch socket "
                "(their network reaches neither /v1/blobs nor the object store); 0 on Kubernetes.",
            ),
        )

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        (ready, pods_f, depth_f, oldest_f, used_f, limit_f, held_f, split_f, served_f,
         relayed_f) = self._families()  # fmt: skip
        ready.add_metric([], 1.0 if broker.ready else 0.0)
        now = broker.clock()
        pods = broker.pod_infos()
        counts: dict[tuple[str, str, str], int] = {}
        for pod in pods:
            key = (pod.sku, str(pod.state), pod.role)
            counts[key] = counts.get(key, 0) + 1
        for labels, n in sorted(counts.items()):
            pods_f.add_metric(list(labels), n)
        for (pool, queue), (n, oldest) in sorted(broker.queue_summary().items()):
            depth_f.add_metric([pool, queue], n)
            oldest_f.add_metric([pool, queue], max(0.0, now - oldest))
        for accelerator, (used, limit) in broker.ledger.view().items():
            used_f.add_metric([accelerator], used)
            if limit is not None:
                limit_f.add_metric([accelerator], limit)
        for accelerator, held in sorted(broker.held_unit_seconds().items()):
            held_f.add_metric([accelerator], held)
        for key, held in sorted(self._integrate(pods, now).items()):
            split_f.add_metric(list(key), held)
        served_f.add_metric([], broker.package_bytes_served)
        relayed_f.add_metric([], broker.package_bytes_relayed)
        yield from (
            ready, pods_f, depth_f, oldest_f, used_f, limit_f, held_f, split_f, served_f, relayed_f
        )  # fmt: skip

    def _integrate(self, pods: list[PodInfo], now: float) -> dict[HeldKey, float]:
        """Add the interval since the last scrape at the units it saw, then take the pods'
        units now for the next one. Returns the integral so far."""
        pools = self.broker.catalog.pools
        rate: dict[HeldKey, int] = {}
        for pod in pods:
            spec = pools.get(pod.sku)
            state = owner_state(pod, now)
            if spec is None or state is None or pod.role != "active":
                continue
            key = (pod.sku, spec.accelerator, state)
            rate[key] = rate.get(key, 0) + spec.units_per_pod
        with self._lock:
            if self._since is not None:
                elapsed = max(0.0, now - self._since)
                for key, units in self._rate.items():
                    self._held[key] = self._held.get(key, 0.0) + units * elapsed
            for key in rate:
                self._held.setdefault(key, 0.0)
            self._rate, self._since = rate, now
            return dict(self._held)
