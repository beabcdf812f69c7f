"""The dashboard's server time per page at scale, and what the event metrics cost a warm
invoke (issue 24).

Pages: a broker on fake pods whose tracker holds ``--pods`` pods (records only: the backend
reports them alive, ``SeededBackend``) and whose job store holds ``--jobs`` ended jobs of the
last hour and 20 functions of 3 versions each, inserted directly. Each page is asked
``--requests`` times in-process (``httpx.ASGITransport``: the app's own time, no socket),
beside its floor: the JSON API route that reads the same data (``/v1/pools``, ``/v1/jobs``,
...), asked as often in the same run. Goal: every page's p50 at most 200 ms.

Metrics A/B: two broker processes on local pods, ``FIREPOOL_METRICS=true`` and ``=false``,
``noop`` warm sync invokes over real HTTP in alternating rounds (each round: both sides, the
order swapped every round). Goal: the on/off ratio of the p50s at most 1.03.

    python -m benchmarks.dashboard --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine

from benchmarks.args import positive_int
from benchmarks.invoke import CATALOG as INVOKE_CATALOG
from benchmarks.invoke import NOOP, _calls, pct
from broker.jobs import Attempt, Job
from broker.service import Broker
from broker.settings import Settings
from broker.store import open_store
from broker.store.codec import job_row
from broker.store.tables import jobs as jobs_table
from functions.spec import FunctionSpec
from gateway.app import create_app
from gateway.auth import Authenticator, Role
from gateway.harness import kill_pods, start_broker
from pool_manager.backends.fake import FakeBackend
from pool_manager.model import PodInfo
from pool_manager.states import JobState, PodState

PAGE_GOAL_P50_MS = 200.0
METRICS_GOAL_RATIO = 1.03
CATALOG = (
    "budgets: {cpu: 8192}\n"
    "pools:\n"
    "  cpu: {min_count: 0, max_idle_count: 4000, max_count: 4000, idle_timeout_s: 86400}\n"
    "  cpu-large: {units_per_pod: 4, min_count: 0, max_idle_count: 1000, max_count: 1000,"
    " idle_timeout_s: 86400}\n"
)
POOLS = ("cpu", "cpu-large")
PATHS = (("warm", None), ("idle", "no_warm_pod"), ("new", "no_idle_pod_when_queued"))
FUNCTIONS = 20
VERSIONS = 3


class SeededBackend(FakeBackend):
    """Fake pods, and the benchmark's seeded pod records reported alive: they exist only in
    the tracker (a real pod each would cost a socket and a server apiece), so the idle-pod
    sweep must not retire them as exited."""

    seeded: set[str]

    async def exited(self, name: str) -> bool:
        return name not in self.seeded and await super().exited(name)


def pod_names(count: int) -> list[str]:
    """The seeded pods' names: a fifth in ``cpu-large``, the rest in ``cpu``."""
    return [f"{POOLS[1] if i % 5 == 0 else POOLS[0]}-seed{i:05d}" for i in range(count)]


def seed_pods(broker: Broker, names: list[str], now: float, rng: random.Random) -> None:
    """``names`` as idle pods in the tracker, two in three with an owner holding them."""
    for i, name in enumerate(names):
        sku = name.rsplit("-seed", 1)[0]
        pod = PodInfo(name=name, sku=sku, created=now - rng.uniform(60, 3600), state=PodState.IDLE)
        if i % 3:
            pod.owner = f"caller-{i % 100:03d}"
        broker.tracker.add_pod(pod, now, reserved=False)


def seeded_jobs(count: int, pods: list[str], now: float, rng: random.Random) -> list[Job]:
    """``count`` ended jobs submitted over the last hour, each run once on a seeded pod."""
    out = []
    for i in range(count):
        submitted = now - rng.uniform(0, 3590)
        start = rng.lognormvariate(-4, 1.2)
        ran = rng.expovariate(5)
        pod = pods[i % len(pods)]
        path, reason = rng.choices(PATHS, weights=(6, 3, 1))[0]
        state = rng.choices(
            (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED), weights=(85, 10, 5)
        )[0]
        job = Job(
            id=f"{int(submitted * 1000):012x}{i:012x}",
            function=f"fn-{i % FUNCTIONS:02d}",
            version=1 + i % VERSIONS,
            caller=f"caller-{i % 100:03d}",
            sku=pod.rsplit("-seed", 1)[0],
            input={"i": i},
            state=state,
            output=i,
            submitted=submitted,
            started=submitted + start / 2,
            first_instruction=submitted + start,
            finished=submitted + start + ran,
            acquisition={"path": path, "reason": reason},
            attempts=[Attempt(f"j{i}:0", [pod], 0, submitted + start / 2, submitted + start + ran)],
        )
        out.append(job)
    return out


async def seed_store(url: str, jobs: list[Job]) -> None:
    """The schema made by ``open_store``, the jobs inserted in one transaction, and
    ``FUNCTIONS`` functions of ``VERSIONS`` versions each registered."""
    store = await open_store(url)
    try:
        for f in range(FUNCTIONS):
            for _ in range(VERSIONS):
                spec = FunctionSpec(
                    name=f"fn-{f:02d}",
                    sku=POOLS[f % 2],
                    package_digest=f"{f:064x}",
                    entrypoint="main:run",
                    owner="deployer",
                )
                await store.put_function(spec)
    finally:
        await store.close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(jobs_table.insert(), [job_row(j) for j in jobs])
    engine.dispose()


async def timed(call: Callable[[], Awaitable[httpx.Response]], n: int) -> list[float]:
    """Milliseconds of ``n`` calls, after 2 untimed ones; each must answer 200."""
    times = []
    for i in range(n + 2):
        t0 = time.perf_counter()
        answer = await call()
        elapsed = (time.perf_counter() - t0) * 1000
        if answer.status_code != 200:
            raise RuntimeError(f"{answer.request.url} answered {answer.status_code}")
        if i >= 2:
            times.append(elapsed)
    return times


async def page_times(pods: int, jobs: int, requests: int) -> dict[str, Any]:
    rng = random.Random(24)
    with tempfile.TemporaryDirectory(prefix="fp-dash-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        (home / "catalog.yaml").write_text(CATALOG)
        settings = Settings(
            home=home, backend="fake", catalog_path=home / "catalog.yaml", reconcile_s=3600.0
        )
        now = time.time()
        names = pod_names(pods)
        await seed_store(settings.resolved_store_url, seeded_jobs(jobs, names, now, rng))
        backend = SeededBackend(home / "pods")
        backend.seeded = set(names)
        broker = Broker(settings, backend=backend)
        app = create_app(broker)
        try:
            async with app.router.lifespan_context(app):
                seed_pods(broker, names, now, rng)
                token = Authenticator(broker.signing_key).mint("operator", Role.ADMIN, 3600)
                headers = {"Authorization": f"Bearer {token}"}
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://bench", headers=headers
                ) as http:
                    some_job = (await http.get("/v1/jobs?limit=1")).json()["jobs"][0]["id"]
                    pairs = {
                        "overview": ("/dashboard/", "/v1/pools"),
                        "pool_detail": ("/dashboard/pools/cpu", "/v1/pools?pods=1"),
                        "jobs": ("/dashboard/jobs", "/v1/jobs?limit=100"),
                        "jobs_1000": ("/dashboard/jobs?limit=1000", "/v1/jobs?limit=1000"),
                        "jobs_filtered": (
                            "/dashboard/jobs?function=fn-03&state=FAILED",
                            "/v1/jobs?state=FAILED",
                        ),
                        "job_detail": (f"/dashboard/jobs/{some_job}", f"/v1/jobs/{some_job}"),
                        "functions": ("/dashboard/functions", "/v1/functions"),
                    }
                    out: dict[str, Any] = {}
                    for name, (page, floor) in pairs.items():
                        page_ms = await timed(partial(http.get, page), requests)
                        floor_ms = await timed(partial(http.get, floor), requests)
                        p50 = statistics.median(page_ms)
                        floor_p50 = statistics.median(floor_ms)
                        out[name] = {
                            "path": page,
                            "p50_ms": round(p50, 2),
                            "p90_ms": round(pct(page_ms, 0.9), 2),
                            "floor": floor,
                            "floor_p50_ms": round(floor_p50, 2),
                            "ratio": round(p50 / floor_p50, 2),
                            "within_goal": p50 <= PAGE_GOAL_P50_MS,
                        }
                    tracked = len(broker.pod_infos())
        finally:
            await backend.shutdown()
    return {"pods": tracked, "jobs": jobs, "requests": requests, "pages": out}


def metrics_ab(rounds: int, calls: int, warmup: int) -> dict[str, Any]:
    """Warm invoke p50 with the event metrics on and off, in alternating rounds."""
    sides = {"on": "true", "off": "false"}
    latencies: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="fp-dash-ab-") as tmp:
        servers = {}
        try:
            for side, value in sides.items():
                home = Path(tmp) / side
                servers[side] = start_broker(
                    home, INVOKE_CATALOG, extra_env={"FIREPOOL_METRICS": value}
                )
                with servers[side].client("deployer", Role.DEPLOY) as fp:
                    fp.deploy(NOOP, name="noop", sku="cpu", entrypoint="noop:noop")
            tokens = {side: server.token("bench") for side, server in servers.items()}
            for side, server in servers.items():
                asyncio.run(_calls(server.url, tokens[side], "noop", warmup, "bench", False))
            for r in range(rounds):
                order = ("on", "off") if r % 2 == 0 else ("off", "on")
                for side in order:
                    got, _paths = asyncio.run(
                        _calls(servers[side].url, tokens[side], "noop", calls, "bench", False)
                    )
                    latencies[side].extend(got)
        finally:
            for side, server in servers.items():
                server.stop()
                kill_pods(Path(tmp) / side)
    on = statistics.median(latencies["on"])
    off = statistics.median(latencies["off"])
    return {
        "switch": "FIREPOOL_METRICS",
        "rounds": rounds,
        "calls_per_side": len(latencies["on"]),
        "warm_p50_ms_metrics_on": round(on, 3),
        "warm_p50_ms_metrics_off": round(off, 3),
        "warm_p90_ms_metrics_on": round(pct(latencies["on"], 0.9), 3),
        "warm_p90_ms_metrics_off": round(pct(latencies["off"], 0.9), 3),
        "ratio_on_over_off": round(on / off, 4),
        "within_goal": on / off <= METRICS_GOAL_RATIO,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=positive_int, default=1000)
    parser.add_argument("--jobs", type=positive_int, default=10_000)
    parser.add_argument("--requests", type=positive_int, default=20, help="timed, per page")
    parser.add_argument("--rounds", type=positive_int, default=6, help="metrics A/B rounds")
    parser.add_argument("--calls", type=positive_int, default=100, help="per side per round")
    parser.add_argument("--warmup", type=positive_int, default=30)
    parser.add_argument("--skip-ab", action="store_true", help="only the page times")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    report: dict[str, Any] = asyncio.run(page_times(args.pods, args.jobs, args.requests))
    report["goal"] = {"page_p50_ms": PAGE_GOAL_P50_MS, "metrics_ratio": METRICS_GOAL_RATIO}
    if not args.skip_ab:
        report["metrics_ab"] = metrics_ab(args.rounds, args.calls, args.warmup)
    if args.json:
        print(json.dumps(report))
        return 0
    for name, row in report["pages"].items():
        print(
            f"{name:>14} p50 {row['p50_ms']:8.2f} ms  p90 {row['p90_ms']:8.2f} ms  "
            f"floor {row['floor_p50_ms']:7.2f} ms ({row['floor']})  x{row['ratio']}"
        )
    if "metrics_ab" in report:
        ab = report["metrics_ab"]
        print(
            f"warm invoke p50: metrics on {ab['warm_p50_ms_metrics_on']} ms, off "
            f"{ab['warm_p50_ms_metrics_off']} ms, ratio {ab['ratio_on_over_off']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
