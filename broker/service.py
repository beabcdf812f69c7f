"""Composition root: builds the broker's parts from ``Settings`` and runs them.

Startup order (paper A.1): open the store (schema checked) → rebuild the tracker from the
backend's pods and the store (recovery) → start the dispatcher. Shutdown (the uvicorn way):
stop intake at the signal (``stop_intake``), wait ``drain_s`` for running jobs, then stop
waiting: a job still running runs on in its pod (pods outlive the broker), and the next start
takes it up again (``broker.recovery``).
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import io
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

from broker import PROCESS_STARTED
from broker.agent_client import AgentClient
from broker.background import BackgroundTasks
from broker.catalog_reload import CatalogReloader
from broker.dashboard_views import (
    CapacityHistory,
    DashboardViews,
    start_sampler,
    stop_sampler,
)
from broker.dispatcher import Dispatcher
from broker.exclusive import BrokerLocks
from broker.executor import Executor
from broker.function_registry import FunctionRegistry
from broker.job_logs import JobLogs
from broker.jobs import Job
from broker.keys import load_or_create_key
from broker.lifecycle import PodRecycler
from broker.log_objects import open_log_archive
from broker.package_check import check_package_file
from broker.package_uploads import Authorised, PackageUploads
from broker.pods import PodManager, new_pod_name
from broker.pool_report import pod_list, pool_report
from broker.quotas import StorageQuotas
from broker.recovery import recover
from broker.settings import Settings, private_home
from broker.state_metrics import BrokerStateCollector
from broker.storage_collection import Collected, StorageCollector
from broker.store import JobStore, StoreSettings, open_store
from broker.store.store import STATEMENT_OVERHEAD
from broker.sweeps import Sweeps
from broker.telemetry import Telemetry, make_telemetry
from functions.errors import Forbidden, InvalidRequest, NotFound, TooLarge, Unavailable
from functions.spec import FunctionSpec
from functions.stores import PackageStore, UrlSigner, check_digest_syntax, open_package_store
from pod_runtime.agent_auth import agent_key
from pool_manager.backends.base import PodBackend
from pool_manager.backends.factory import KubernetesOptions, make_backend
from pool_manager.backends.gpu_share import GpuShare
from pool_manager.backends.local import LocalBackend, socket_path_error
from pool_manager.catalog import Catalog
from pool_manager.model import PodInfo
from pool_manager.pod_index import gpus_per_pod
from pool_manager.states import JobState
from pool_manager.tracker import Tracker

log = logging.getLogger("firepool.broker")
OUT_OF_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errors of a write to a full filesystem (or past a quota)."""


_ids = random.Random(secrets.randbits(128))


def new_job_id() -> str:
    """Time-ordered and unique: 12 hex digits of milliseconds + 48 random bits. Not a secret
    (a job is only visible to its caller); a seeded PRNG avoids a system call per job."""
    return f"{int(time.time() * 1000):012x}{_ids.getrandbits(48):012x}"


def check_socket_room(root: Path, catalog: Catalog) -> None:
    """``InvalidRequest`` (``FIREPOOL_HOME``) where a local pod of some pool could not listen
    on its socket under ``root`` (the path would pass the kernel's limit): refused at
    start-up rather than every pod of that pool dying before it is ready."""
    for sku in catalog.pools:
        error = socket_path_error(root, new_pod_name(sku, suffix="f" * 8))
        if error is not None:
            raise InvalidRequest(error, field="FIREPOOL_HOME")


WAITERS_MARGIN_S = 0.25
"""How long before the server's drain ends the sync invokes still waiting are answered."""


class Broker:
    def __init__(self, settings: Settings, backend: PodBackend | None = None) -> None:
        self.settings = settings
        home = settings.home
        private_home(home)
        self.catalog = (
            Catalog.load(settings.catalog_path) if settings.catalog_path else Catalog.default()
        )
        key = load_or_create_key(home / "signing.key")
        self.signing_key = key
        """Signs callers' tokens (the gateway's ``Authenticator`` checks them with it)."""
        self.packages: PackageStore = open_package_store(
            settings.package_store,
            root=home / "packages",
            signer=UrlSigner(hashlib.sha256(b"blob-url|" + key).digest()),
            base_url=settings.resolved_public_url,
            ttl_s=settings.package_url_ttl_s,
            s3=settings.s3_config,
        )
        self.uploads = PackageUploads(self.packages, key)
        """Uploads authorised here and sent straight to the object store (``s3``)."""
        self.package_bytes_served = 0
        """Package bytes this broker served to pods (``/v1/blobs``); 0 with the s3 store."""
        pod_key = agent_key(key)  # each pod's agent secret derives from it (agent_auth)
        self.backend: PodBackend = backend or make_backend(
            settings.backend,
            root=home / "pods",
            open_package=self.packages.open,
            package_url=self.packages.url,
            sandbox=settings.sandbox,
            gpus=self.catalog.gpus,
            private=[home],  # its keys, job store, packages, logs
            agent_key=pod_key,
            kubernetes=KubernetesOptions(
                namespace=settings.k8s_namespace,
                create_qps=settings.k8s_create_qps,
                agent_port=settings.k8s_agent_port,
                rendezvous_port=settings.k8s_rendezvous_port,
                kubeconfig=settings.k8s_kubeconfig,
                gpu=GpuShare(
                    resource=settings.k8s_gpu_resource,
                    memory_resource=settings.k8s_gpu_memory_resource,
                    cores_resource=settings.k8s_gpu_cores_resource,
                    standby_memory_mib=settings.k8s_standby_gpu_memory_mib,
                    standby_cores=settings.k8s_standby_gpu_cores,
                    uuid_annotation=settings.k8s_gpu_uuid_annotation,
                ),
            ),
        )
        self._local_pods = backend is None and settings.backend == "local"
        if self._local_pods:
            check_socket_room(home / "pods", self.catalog)
        self.tracker = Tracker(self.catalog)
        self.ledger = self.tracker.ledger
        self.agents = AgentClient(pod_key)
        self.logs = open_log_archive(home / "logs", self.packages)
        self.clock = time.time
        self._functions: FunctionRegistry | None = None
        self.locks = BrokerLocks(home, settings.resolved_store_url)
        """Held from ``start`` to ``stop`` (or taken earlier by ``firepool serve``)."""
        self.store: JobStore | None = None
        self._dispatcher: Dispatcher | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._sweeps: Sweeps | None = None
        self._logs: JobLogs | None = None
        self._collector: StorageCollector | None = None
        self._quotas: StorageQuotas | None = None
        self.ready = False
        self.accepting = True
        self.refusal = "the broker is shutting down"
        """Why new jobs are refused once ``accepting`` is False (the API's 503 says it)."""
        self.counters: Counter[str] = Counter()
        self._reloads = BackgroundTasks()
        self.telemetry: Telemetry = make_telemetry(settings.metrics)
        """This broker's metrics, in its own registry: events (when ``FIREPOOL_METRICS`` is
        on) and, always, the state gauges computed at scrape time."""
        self.telemetry.registry.register(BrokerStateCollector(self))
        self.capacity = CapacityHistory(self.ledger, self.clock)
        """The units each accelerator held over the last hour (the dashboard's plot)."""
        self._views: DashboardViews | None = None
        self._sampler: asyncio.Task[None] | None = None
        self.catalog_reloader: CatalogReloader | None = (
            CatalogReloader(self, settings.catalog_path, settings.catalog_poll_s)
            if settings.catalog_path
            else None
        )
        """Reloads the catalog file on SIGHUP (``request_reload``) and when it changes."""

    @property
    def dispatcher(self) -> Dispatcher:
        assert self._dispatcher is not None, "broker not started"
        return self._dispatcher

    @property
    def jobs(self) -> JobStore:
        assert self.store is not None, "broker not started"
        return self.store

    async def start(self) -> None:
        t0 = time.monotonic()
        await asyncio.to_thread(self.locks.acquire)  # before any pod or job is touched
        self.store = await open_store(
            self.settings.resolved_store_url,
            settings=StoreSettings(
                result_retention_s=self.settings.result_retention_s,
                idempotency_retention_s=self.settings.idempotency_retention_s,
            ),
        )
        t_store = time.monotonic()
        if self.telemetry.enabled:
            self.store.observe_commits(self.telemetry.store_commit)
        limit = self.store.max_statement_bytes
        if limit is not None and limit < 2 * self.settings.max_json_bytes + STATEMENT_OVERHEAD:
            log.warning(
                "the job store takes statements of at most %d bytes (MySQL max_allowed_packet): "
                "an input or output of more than about %d bytes (half that for text full of "
                "quotes) is refused with TooLarge; set max_allowed_packet to %d or more to "
                "take every body up to max_json_bytes (%d)",
                limit, limit - STATEMENT_OVERHEAD, 2 * self.settings.max_json_bytes
                + STATEMENT_OVERHEAD, self.settings.max_json_bytes,
            )  # fmt: skip
        pods = PodManager(
            self.backend,
            self.tracker,
            self.catalog,
            self.agents,
            self.clock,
            on_change=self._wake,
            ready_timeout_s=self.settings.pod_ready_timeout_s,
            telemetry=self.telemetry,
        )
        self.pods = pods
        # A release frees a pod to claim (wake); supply changes (create, ready, gone) replan.
        recycler = PodRecycler(
            self.tracker,
            pods,
            self.agents,
            self.logs,
            self.clock,
            self._claim_again,
            telemetry=self.telemetry,
        )
        self.recycler = recycler
        executor = Executor(
            self.agents,
            pods.endpoints,
            self.packages.url,
            rendezvous_port=self.backend.rendezvous_port,
        )
        self._dispatcher = Dispatcher(
            self.store,
            self.tracker,
            pods,
            executor,
            recycler,
            self.function_version,
            self.clock,
            tick_s=self.settings.dispatch_tick_s,
            reconcile_s=self.settings.reconcile_s,
            telemetry=self.telemetry,
        )
        self.counters = self._dispatcher.counters
        self._functions = FunctionRegistry(
            self.catalog, self.packages, self.store, self._dispatcher.specs
        )
        self._logs = JobLogs(
            self._dispatcher, pods.endpoints, self.agents, recycler, self.logs, self.get_job
        )
        self._collector = StorageCollector(
            self.packages, self.store, self.logs, self.settings.package_grace_s, self.clock
        )
        self._quotas = StorageQuotas(
            self.store,
            self.settings.storage_quota_bytes,
            dict(self.settings.storage_quotas),
            self.clock,
        )
        await recover(self)
        t_recovered = time.monotonic()
        self._loop_task = asyncio.get_running_loop().create_task(self.dispatcher.run())
        self._sweeps = Sweeps(
            self.settings,
            self.locks,
            self.store,
            self.tracker,
            pods,
            self.backend,
            self.logs,
            self.collector,
            self.clock,
            wake=self._wake,
            on_lock_lost=self._lock_lost,
        )
        self._sweeps.start()
        self._views = DashboardViews(self.store, self.tracker.pods, self.capacity, self.clock)
        self._sampler = start_sampler(self.capacity)
        if self.catalog_reloader is not None:
            self.catalog_reloader.start()
        self.ready = True
        log.info(
            "dispatching %.3f s after process start (imports %.3f s, store %.3f s, "
            "recovery %.3f s)",
            t_recovered - PROCESS_STARTED,
            t0 - PROCESS_STARTED,
            t_store - t0,
            t_recovered - t_store,
        )

    def stop_intake(self) -> None:
        """The first step of a shutdown, at its signal: refuse new jobs (503) and start no
        queued one (they stay queued in the store); running ones go on, and ``stop`` waits
        ``drain_s`` for them. A sync invoke still waiting on its job just before the server's
        own drain ends (``int(drain_s)`` s: uvicorn's ``timeout_graceful_shutdown``, after which
        it cancels the request) is answered 202 with its job id instead of losing its
        connection."""
        self.accepting = self.ready = False
        if self._dispatcher is not None:
            self._dispatcher.halt()
            release_in = max(0.0, int(self.settings.drain_s) - WAITERS_MARGIN_S)
            asyncio.get_running_loop().call_later(release_in, self._dispatcher.release_waiters)

    def _lock_lost(self, taken: str) -> None:
        """Another broker took one of this broker's locks while it was lost: stop taking and
        dispatching jobs, say why in ``/readyz`` and every refusal, and wait for the
        operator."""
        self.refusal = f"the broker stopped taking jobs: {taken}"
        self.accepting = self.ready = False
        self.dispatcher.halt()

    def request_reload(self) -> None:
        """SIGHUP: reload the catalog file in the background (on the event loop)."""
        if self.catalog_reloader is None or self._dispatcher is None:
            log.warning("SIGHUP: no catalog file to reload (FIREPOOL_CATALOG is unset) "
                        "or the broker is not started")  # fmt: skip
            return
        self._reloads.spawn(self.catalog_reloader.reload_quietly("SIGHUP"))

    def use_catalog(self, catalog: Catalog) -> None:
        """Serve ``catalog`` from now on (``CatalogReloader``), or raise
        ``CatalogChangeRefused``/``InvalidRequest`` with nothing changed. The tracker switches
        first (it refuses what would strand a running job); the pod manager, the function
        registry and admission read the new specs from then on. Pods of a removed pool are
        deleted; a changed template rolls out within each pool's drain budget. Runs on the
        event loop, so no pod is created in between under the old specs."""
        if self._local_pods:
            check_socket_room(self.settings.home / "pods", catalog)
        deletes = self.tracker.swap_catalog(catalog, self.clock())
        self.catalog = catalog
        self.pods.catalog = catalog
        self.functions.use_catalog(catalog)
        for action in deletes:
            self.pods.apply(action)
        self._wake()

    def _wake(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.replan()

    def _claim_again(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.wake()

    async def stop(self) -> None:
        self.accepting = False
        self.ready = False
        if self.catalog_reloader is not None:
            await self.catalog_reloader.stop()
        if self._dispatcher is not None:
            await self.dispatcher.stop(self.settings.drain_s)
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self._sweeps is not None:
            await self._sweeps.stop()
        if self._sampler is not None:
            await stop_sampler(self._sampler)
        if self._dispatcher is not None:
            await self.recycler.drain()
            await self.pods.drain()
        await self.agents.close()
        await self.backend.close()
        if self.store is not None:
            await self.store.close()
        await asyncio.to_thread(self.locks.release)

    # -- functions ----------------------------------------------------------------------
    @property
    def functions(self) -> FunctionRegistry:
        assert self._functions is not None, "broker not started"
        return self._functions

    async def function_version(self, name: str, version: int) -> FunctionSpec | None:
        """Version ``version`` of ``name``, even if deleted since (queued jobs name it)."""
        return await self.functions.version(name, version)

    async def latest_function(self, name: str) -> FunctionSpec:
        """``name``'s latest version; ``NotFound`` if there is none."""
        return await self.functions.latest(name)

    async def register_function(self, spec: FunctionSpec, as_admin: bool = False) -> FunctionSpec:
        """Store a new version of ``spec`` (``FunctionRegistry.register`` says what it
        refuses); its packages are not collected meanwhile."""
        async with self.collector.guard.using(spec.package_digest, spec.requirements_digest):
            return await self.functions.register(spec, as_admin)

    async def delete_function(self, name: str, caller: str | None = None) -> bool:
        """Hide every version of ``name`` (``FunctionRegistry.delete``)."""
        return await self.functions.delete(name, caller)

    async def may_use_package(self, digest: str, caller: str, as_admin: bool) -> bool:
        """Whether ``caller`` may register functions on the package ``digest``."""
        return await self.functions.may_use_package(digest, caller, as_admin)

    async def upload_package(
        self, digest: str, chunks: AsyncIterator[bytes], caller: str, is_zip: bool
    ) -> tuple[int, bool]:
        """Store the bytes ``chunks`` yields under ``digest`` (streamed: one chunk in memory;
        refused unless they hash to it, and, ``is_zip``, unless the pod's agent would extract
        them) and record ``caller`` as one who uploaded them. Returns the size and whether
        the bytes were new to the store. ``QuotaExceeded`` (nothing stored) when they would
        take ``caller`` past its storage quota; the package is not collected meanwhile. A
        store out of space refuses with ``Unavailable`` (503, try again), its partial upload
        removed, and the broker serves on."""
        check = check_package_file if is_zip else None
        async with self.collector.guard.using(digest):
            try:
                with self.packages.upload(digest) as upload:
                    async for chunk in chunks:
                        upload.write(chunk)
                    await self.check_storage_quota(caller, upload.size, digest=digest)
                    created = await asyncio.to_thread(upload.commit, check)
            except OSError as exc:
                if exc.errno not in OUT_OF_SPACE:
                    raise
                log.error("package %s not stored: %s", digest, exc)
                raise Unavailable(
                    f"the package store is out of space ({exc.strerror}); try again later"
                ) from None
            await self.jobs.put_package(digest, upload.size, caller)
        return upload.size, created

    # -- storage: collection and quotas -------------------------------------------------
    @property
    def collector(self) -> StorageCollector:
        assert self._collector is not None, "broker not started"
        return self._collector

    async def check_storage_quota(
        self, caller: str, incoming_bytes: int, *, digest: str | None = None
    ) -> None:
        """``QuotaExceeded`` (413) when ``incoming_bytes`` more would take ``caller`` past
        its storage quota (``broker.quotas``); ``digest``: the package being sent, which adds
        nothing when ``caller`` already uploaded it. Call it before accepting an upload,
        also one authorised to go straight to an object store."""
        assert self._quotas is not None, "broker not started"
        await self._quotas.check(caller, incoming_bytes, digest)

    async def collect_storage(self, now: float | None = None) -> Collected:
        """Delete the packages past their grace period that nothing references
        (``broker.storage_collection``; the storage sweep calls it every
        ``storage_sweep_s``)."""
        return await self.collector.collect(now)

    @property
    def package_bytes_relayed(self) -> int:
        """Package bytes local sandboxed pods fetched through the broker's fetch socket (from
        ``/v1/blobs`` or the object store: their network reaches neither); 0 elsewhere."""
        proxy = self.backend.fetch_proxy if isinstance(self.backend, LocalBackend) else None
        return proxy.bytes_relayed if proxy is not None else 0

    async def package_blob(self, digest: str, expires: int, sig: str) -> Path | BinaryIO:
        """A package for a pod holding a signed URL: the store's own file where it keeps one,
        else the bytes opened for reading (the caller closes them). ``Forbidden``/``Expired``
        for a URL that does not check out, ``NotFound`` when the package is not stored."""
        self.packages.check_url(digest, expires, sig, time.time())
        path = self.packages.local_path(digest)
        if path is not None:
            self.package_bytes_served += path.stat().st_size
            return path
        blob = await asyncio.to_thread(self.packages.open, digest)
        self.package_bytes_served += blob.seek(0, io.SEEK_END)
        blob.seek(0)
        return blob

    async def authorise_upload(
        self, digest: str, size: int, caller: str, as_admin: bool
    ) -> Authorised:
        """How ``caller`` is to upload ``size`` bytes of ``digest`` (``broker.package_uploads``):
        not at all when it already did, through the broker, or straight to the object store
        (recorded as an upload hold until the ticket expires). ``TooLarge`` past the body
        cap, ``QuotaExceeded`` past the caller's storage quota, ``StoreUnavailable`` when the
        object store does not answer."""
        check_digest_syntax(digest)
        if size > self.settings.max_body_bytes:
            raise TooLarge(f"the package is {size} bytes; the limit is "
                           f"{self.settings.max_body_bytes}", field="size")  # fmt: skip
        if await self.may_use_package(digest, caller, as_admin):
            return Authorised(digest, size, "none")
        await self.check_storage_quota(caller, size, digest=digest)
        authorised = await asyncio.to_thread(self.uploads.begin, digest, size, caller, self.clock())
        if authorised.expires is not None:
            await self.jobs.hold_package(digest, caller, size, authorised.expires)
        return authorised

    async def complete_upload(
        self, digest: str, ticket: str, etags: list[str], caller: str
    ) -> tuple[int, bool]:
        """Finish ``caller``'s direct upload of ``digest`` (its ``ticket``): the staged bytes
        are verified and copied into place, and only then is ``caller`` recorded as an
        uploader. Returns the size and whether the bytes were new to the store."""
        checked = self.uploads.check(ticket, digest, caller, self.clock())
        async with self.collector.guard.using(digest):
            created = await asyncio.to_thread(self.uploads.finish, checked, etags)
            await self.jobs.put_package(digest, checked.size, caller)
        await self.jobs.release_hold(digest, caller)
        return checked.size, created

    # -- jobs ---------------------------------------------------------------------------
    def _check_placeable(self, spec: FunctionSpec, caller: str) -> None:
        """Refuse a job that could never be placed: ``NotFound`` if its function's pool is
        not in the catalog (removed since it was registered), ``Forbidden`` if it needs
        more than its caller's own limits allow at once (otherwise a 2-pod gang for a
        ``max_pods: 1`` caller would be accepted and queue forever, 2 idle pods kept for it)."""
        limits = self.catalog.limits_for(caller)
        pool = self.catalog.pools.get(spec.sku)
        if pool is None:  # registered under a catalog that had it
            raise NotFound(
                f"function {spec.name!r} runs on pool {spec.sku!r}, which this broker's "
                "catalog does not have"
            )
        gpus = spec.pods * gpus_per_pod(pool)
        over = limits.exceeded_by(spec.pods, gpus)
        if over is not None:
            want, what, limit = (
                (spec.pods, "pods", limits.max_pods)
                if over == "caller_pod_limit"
                else (gpus, "GPUs", limits.max_gpus)
            )
            raise Forbidden(
                f"function {spec.name!r} needs {want} {what} at once; caller {caller!r} "
                f"may hold at most {limit} (max_{what.lower()} in the catalog's limits)"
            )

    async def submit(
        self,
        caller: str,
        name: str,
        body: dict[str, Any],
        idempotency_key: str | None,
        request_hash: str | None,
    ) -> tuple[Job, bool]:
        spec = await self.latest_function(name)
        self._check_placeable(spec, caller)
        job = Job(
            id=new_job_id(),
            function=spec.name,
            version=spec.version,
            caller=caller,
            sku=spec.sku,
            input=body["input"],
            state=JobState.QUEUED,
            lease_tag=body["lease_tag"],
            queue=body["queue"],
            priority=body["priority"],
            timeout_s=body["timeout_s"] or spec.timeout_s,  # the call's, else its version's
            max_retries=spec.max_retries,
            pods_needed=spec.pods,
            submitted=self.clock(),
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            single_use=body.get("single_use", False) or spec.single_use,
        )
        stored, created = await self.jobs.submit(job)
        if created:
            self.counters["jobs_submitted"] += 1
            self.telemetry.job_submitted(stored.sku)
            self.dispatcher.enqueue(stored)
        return stored, created

    async def get_job(self, job_id: str) -> Job | None:
        """The job as callers see it: durable states only (a job whose RUNNING commit or
        outcome is being recorded reads as the store has it), the live copy while it is
        queued or running."""
        durable = self.dispatcher.finishing.get(job_id) or self.dispatcher.starting.get(job_id)
        if durable is not None:
            return durable
        live = self.dispatcher.live.get(job_id)
        if live is not None:
            return live
        return await self.jobs.get_job(job_id)

    async def wait(self, job_id: str, timeout_s: float) -> Job | None:
        """The job once it has ended, or None if ``timeout_s`` passes first."""
        return await self.dispatcher.wait(job_id, timeout_s)

    async def cancel(self, job: Job) -> Job:
        """Cancel ``job`` (queued: at once; running: its attempt is stopped)."""
        return await self.dispatcher.cancel(job)

    async def list_jobs(
        self, caller: str | None, states: list[JobState] | None, limit: int
    ) -> list[Job]:
        """Summaries, newest first (``caller`` None: every caller's); outputs up to
        ``max_json_bytes`` in all, the rest marked omitted."""
        return await self.jobs.list_jobs(
            caller=caller, states=states, limit=limit, output_budget=self.settings.max_json_bytes
        )

    async def list_functions(self) -> list[FunctionSpec]:
        return await self.jobs.list_functions()

    def read_log(self, job: Job, follow: bool) -> AsyncIterator[bytes]:
        """The job's log from its start, live while it runs (``broker.job_logs``)."""
        assert self._logs is not None, "broker not started"
        return self._logs.stream(job, follow)

    def pod_infos(self) -> list[PodInfo]:
        """Every pod the tracker knows, as copies."""
        return self.tracker.pods()

    def queue_depth(self) -> int:
        """Jobs waiting for pods."""
        return self.dispatcher.queue_depth()

    def queue_summary(self) -> dict[tuple[str, str], tuple[int, float]]:
        """Per ``(pool, queue)``, the jobs waiting for pods and the oldest one's submission
        time (empty before ``start``)."""
        if self._dispatcher is None:
            return {}
        out: dict[tuple[str, str], tuple[int, float]] = {}
        for job in self._dispatcher.queued():
            n, oldest = out.get((job.sku, job.queue), (0, job.submitted))
            out[job.sku, job.queue] = (n + 1, min(oldest, job.submitted))
        return out

    def held_unit_seconds(self) -> dict[str, float]:
        """Per accelerator, the GPU- or core-seconds its pools held so far."""
        return self.ledger.held_unit_seconds()

    @property
    def views(self) -> DashboardViews:
        """The dashboard's reads (``broker.dashboard_views``)."""
        assert self._views is not None, "broker not started"
        return self._views

    def pool_report(self, with_pods: bool = False) -> dict[str, Any]:
        """``GET /v1/pools``: pools, budgets and, ``with_pods``, every pod."""
        pods = self.tracker.pods()
        report = pool_report(
            self.catalog,
            pods,
            self.dispatcher.queued(),
            self.ledger,
            self.pods.create_failures,
            self.clock(),
            asyncio.get_running_loop().time(),
        )
        if with_pods:
            report["pod_list"] = pod_list(pods)
        return report


def request_digest(name: str, body: bytes) -> str:
    return hashlib.sha256(name.encode() + b"\0" + body).hexdigest()
