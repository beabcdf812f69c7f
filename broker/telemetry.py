"""The broker's event metrics: counters and histograms bumped where each event happens.

One ``CollectorRegistry`` per ``Broker`` (never prometheus_client's global one), so several
brokers in one process (tests, benchmarks) keep their own series. ``Telemetry`` is the
interface the broker's layers call, with every method a no-op: what a broker built with
``FIREPOOL_METRICS=false`` gets, so a benchmark can measure what instrumentation costs.
``PrometheusTelemetry`` records. Gauges that mirror state (pods, queues, budgets, held
capacity) are not here: ``broker.state_metrics`` computes them at scrape time.

The pure control plane (``pool_manager``) never imports this module: it is told about
events by the broker code that carries out the control plane's decisions, from the values
those decisions return (a ``Lease``'s path and reason, a ``DeletePod``'s reason).

Concurrency: prometheus_client's metrics are thread-safe; ``store_commit`` is called on the
job store's writer thread, everything else on the event loop. Label values are escaped by
prometheus_client's exposition.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

disable_created_metrics()  # no ``_created`` series beside each counter and histogram

START_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                 120.0, 300.0)  # fmt: skip
"""Seconds, for a start (submit or lease to first instruction, create to ready, handover):
a warm start is tens of ms, a cold GPU pod 20-35 s, an image pull minutes (paper §1)."""
SHORT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, 10.0)  # fmt: skip
"""Seconds, for what should take milliseconds (a reset, a store commit, an HTTP request)."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
"""Writes per committed store transaction (the group-commit writer's ``max_batch`` is 2048)."""
HANDOVER_PATHS = frozenset({"standby", "new", "single_use"})
"""Acquisition paths of a handover: a job that found no idle pod (paper Table 6)."""


class Telemetry:
    """Every event the broker reports; each method records nothing (metrics off).

    ``registry`` is the broker's own, with or without the event metrics: the scrape-time
    state collector registers there too."""

    enabled = False

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)

    def job_submitted(self, pool: str) -> None:
        """A new job was stored QUEUED (an idempotent repeat is not one)."""

    def job_ended(self, pool: str, state: str) -> None:
        """A job reached its terminal ``state`` (SUCCEEDED, FAILED, CANCELLED)."""

    def acquired(
        self, pool: str, path: str, reason: str | None, queue_wait_s: float | None
    ) -> None:
        """An attempt's pods were leased by ``path`` (its RUNNING commit landed); ``reason``
        why no warmer path was taken (None for ``warm``); ``queue_wait_s`` submit to lease, for
        a job's first attempt (None for a retry)."""

    def first_instruction(
        self, pool: str, path: str, since_submit_s: float | None, since_lease_s: float | None
    ) -> None:
        """An attempt's user code started: ``since_lease_s`` after its pods were leased and,
        for the job's first attempt to get there, ``since_submit_s`` after its submission."""

    def pod_create(self, pool: str, role: str, reason: str) -> None:
        """A create was asked of the backend (``reason``: ``demand``, ``warm_target``,
        ``standby``; see ``Dispatcher.dispatch_pass``)."""

    def pod_create_failed(self, pool: str, why: str) -> None:
        """A create failed: the backend refused it, or the pod never became ready."""

    def pod_ready(self, pool: str, role: str, seconds: float) -> None:
        """A created pod answered its readiness probe ``seconds`` after the create was asked."""

    def pod_delete(self, pool: str, reason: str) -> None:
        """A pod is being deleted, for ``reason`` (the scaler's, the recycler's, a sweep's)."""

    def pod_reset(self, pool: str, seconds: float, clean: bool) -> None:
        """A pod's reset round trip ended, verified clean or not (unclean or unreachable)."""

    def store_commit(self, writes: int, seconds: float) -> None:
        """The job store committed one transaction of ``writes`` writes (writer thread)."""

    def http_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """An HTTP request was answered; ``route`` is the route's template, never the path."""


class PrometheusTelemetry(Telemetry):
    """``Telemetry`` recorded as Prometheus metrics in the broker's own registry."""

    enabled = True

    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.jobs = Counter(
            "firepool_jobs", "Jobs submitted, and jobs ended by state.", ["pool", "event"],
            registry=r,
        )  # fmt: skip
        self.acquisitions = Counter(
            "firepool_acquisitions",
            "Attempts whose pods were leased, by acquisition path and the reason no warmer "
            "path was taken (none for warm).",
            ["pool", "path", "reason"],
            registry=r,
        )
        self.submit_to_first = Histogram(
            "firepool_submit_to_first_instruction_seconds",
            "Submission to the first instruction of user code, once per job.",
            ["pool", "path"],
            buckets=START_BUCKETS,
            registry=r,
        )
        self.lease_to_first = Histogram(
            "firepool_pod_to_first_instruction_seconds",
            "Pods leased to the attempt's first instruction of user code, per attempt.",
            ["pool", "path"],
            buckets=START_BUCKETS,
            registry=r,
        )
        self.promotions = Counter(
            "firepool_standby_promotions", "Standby pods promoted to serve a job.", ["pool"],
            registry=r,
        )  # fmt: skip
        self.handover_wait = Histogram(
            "firepool_handover_wait_seconds",
            "Queue wait (submit to lease) of a job's first attempt that found no idle pod.",
            ["pool", "path"],
            buckets=START_BUCKETS,
            registry=r,
        )
        self.creates = Counter(
            "firepool_pod_creates", "Pod creates asked of the backend.", ["pool", "role", "reason"],
            registry=r,
        )  # fmt: skip
        self.create_failures = Counter(
            "firepool_pod_create_failures",
            "Pod creates that failed (refused by the backend, or never ready).",
            ["pool", "why"],
            registry=r,
        )
        self.create_to_ready = Histogram(
            "firepool_pod_create_to_ready_seconds",
            "A pod's create asked to its agent answering the readiness probe.",
            ["pool", "role"],
            buckets=START_BUCKETS,
            registry=r,
        )
        self.deletes = Counter(
            "firepool_pod_deletes", "Pod deletes, by reason.", ["pool", "reason"], registry=r
        )
        self.hold_breaks = Counter(
            "firepool_hold_breaks",
            "Owner holds broken for queued demand (the pod is deleted, reason hold_broken).",
            ["pool"],
            registry=r,
        )
        self.resets = Histogram(
            "firepool_pod_reset_seconds",
            "A pod's reset round trip after an attempt.",
            ["pool"],
            buckets=SHORT_BUCKETS,
            registry=r,
        )
        self.unclean_resets = Counter(
            "firepool_pod_unclean_resets",
            "Resets not verified clean (unclean or unreachable): the pod retires.",
            ["pool"],
            registry=r,
        )
        self.commit_latency = Histogram(
            "firepool_store_commit_seconds",
            "One job store transaction (a group-commit batch), begin to commit.",
            buckets=SHORT_BUCKETS,
            registry=r,
        )
        self.commit_batch = Histogram(
            "firepool_store_commit_batch_size",
            "Writes per committed job store transaction.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.http_requests = Counter(
            "firepool_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self.http_latency = Histogram(
            "firepool_http_request_seconds",
            "HTTP request to its answer's start, by route template and method.",
            ["route", "method"],
            buckets=SHORT_BUCKETS,
            registry=r,
        )

    def job_submitted(self, pool: str) -> None:
        self.jobs.labels(pool, "submitted").inc()

    def job_ended(self, pool: str, state: str) -> None:
        self.jobs.labels(pool, state.lower()).inc()

    def acquired(
        self, pool: str, path: str, reason: str | None, queue_wait_s: float | None
    ) -> None:
        self.acquisitions.labels(pool, path, reason or "none").inc()
        if path == "standby":
            self.promotions.labels(pool).inc()
        if queue_wait_s is not None and path in HANDOVER_PATHS:
            self.handover_wait.labels(pool, path).observe(max(0.0, queue_wait_s))

    def first_instruction(
        self, pool: str, path: str, since_submit_s: float | None, since_lease_s: float | None
    ) -> None:
        if since_submit_s is not None:
            self.submit_to_first.labels(pool, path).observe(max(0.0, since_submit_s))
        if since_lease_s is not None:
            self.lease_to_first.labels(pool, path).observe(max(0.0, since_lease_s))

    def pod_create(self, pool: str, role: str, reason: str) -> None:
        self.creates.labels(pool, role, reason).inc()

    def pod_create_failed(self, pool: str, why: str) -> None:
        self.create_failures.labels(pool, why).inc()

    def pod_ready(self, pool: str, role: str, seconds: float) -> None:
        self.create_to_ready.labels(pool, role).observe(seconds)

    def pod_delete(self, pool: str, reason: str) -> None:
        self.deletes.labels(pool, reason).inc()
        if reason == "hold_broken":
            self.hold_breaks.labels(pool).inc()

    def pod_reset(self, pool: str, seconds: float, clean: bool) -> None:
        self.resets.labels(pool).observe(seconds)
        if not clean:
            self.unclean_resets.labels(pool).inc()

    def store_commit(self, writes: int, seconds: float) -> None:
        self.commit_latency.observe(seconds)
        self.commit_batch.observe(writes)

    def http_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(route, method, str(status)).inc()
        self.http_latency.labels(route, method).observe(seconds)


def make_telemetry(enabled: bool) -> Telemetry:
    """The broker's telemetry: recording (``FIREPOOL_METRICS`` on) or not."""
    return PrometheusTelemetry() if enabled else Telemetry()


NO_TELEMETRY = Telemetry()
"""What a part built without a broker's telemetry reports to (tests, benchmarks)."""
