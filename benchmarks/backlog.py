"""The broker's CPU per job as the backlog grows (issue 25): does a deep queue make every job
dearer?

For each depth in ``--depths`` (default 100, 1,000 and 10,000), a fresh broker (SQLite) with a cpu
pool capped at ``--pods`` pods (ready before the clock starts) is sent that many async no-op
jobs at once (``POST /v1/functions/noop/jobs``, ``--senders`` at a time; the pool drains far
slower than they arrive, so the queue stands near the depth), then left to drain; the
broker process's CPU (/proc: ``utime + stime``, every thread) from the first submit to the
moment the last job has ended (the benchmark's own sweep of ``GET``s that checks every job
succeeded comes after), divided by the jobs, is ``broker_cpu_ms_per_job``. A depth below
``--min-jobs`` (1,000) runs in batches in the same broker, each drained before the next, until
that many jobs ran: 100 jobs are under a second of CPU, which one busy moment of a shared
machine would double. The goal: ``ratio`` (the deepest depth's over the shallowest's) <= 1.25.

``--backend fake`` (the default) runs pods inside the broker process
(``pool_manager/backends/fake.py``): the broker's own work is all real (HTTP intake, the
store's commits, every dispatcher and scaler pass over the queue, the agent protocol over a
unix socket, completion), and a fake pod adds a fixed cost per job to the broker's CPU, the
same at every depth, which pulls the ratio towards 1 a little; its speed is what lets
10,000 jobs drain in minutes on a loaded machine. ``--backend local`` runs real pod
processes, whose CPU is then not the broker's.

    python -m benchmarks.backlog --json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.args import positive_int
from benchmarks.invoke import NOOP
from benchmarks.proc_cpu import process_cpu_s
from gateway.auth import Role
from gateway.harness import kill_pods, start_broker

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def catalog(pods: int) -> str:
    return (
        f"budgets: {{cpu: {pods}}}\n"
        "pools:\n"
        f"  cpu: {{min_count: {pods}, max_idle_count: {pods}, max_count: {pods}, "
        "idle_timeout_s: 600}\n"
    )


async def _submit(url: str, token: str, jobs: int, senders: int) -> list[str]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    ids: list[str] = [""] * jobs
    next_job = iter(range(jobs))
    async with aiohttp.ClientSession(headers=headers) as http:

        async def sender() -> None:
            for i in next_job:
                body = orjson.dumps({"input": {"i": i}})
                async with http.post(f"{url}/v1/functions/noop/jobs", data=body) as resp:
                    answer = orjson.loads(await resp.read())
                if resp.status not in (200, 201, 202):
                    raise RuntimeError(f"submit {i}: {resp.status} {answer}")
                ids[i] = answer["job_id"]

        await asyncio.gather(*(sender() for _ in range(senders)))
    return ids


async def _drained(
    url: str, token: str, ids: list[str], poll_s: float, mark: Callable[[], None]
) -> list[dict[str, Any]]:
    """Wait until every job has ended; returns the jobs that did not succeed. ``mark`` is
    called when the last job submitted has ended and again whenever an earlier one is found
    still running, so its last call is the moment the queue drained, before the sweep of
    ``GET``s over the rest (work per job that is the benchmark's, not the broker's)."""
    headers = {"Authorization": f"Bearer {token}"}
    failed: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(headers=headers) as http:

        async def ended(job_id: str) -> dict[str, Any] | None:
            async with http.get(f"{url}/v1/jobs/{job_id}") as resp:
                job: dict[str, Any] = orjson.loads(await resp.read())
            return job if job.get("state") in TERMINAL else None

        for n, job_id in enumerate(reversed(ids)):
            job = await ended(job_id)
            if job is None:
                while (job := await ended(job_id)) is None:
                    await asyncio.sleep(poll_s)
                mark()
            elif n == 0:
                mark()
            if job["state"] != "SUCCEEDED":
                failed.append({"job_id": job_id, "state": job["state"], "error": job.get("error")})
    return failed


async def _wait_pods(url: str, token: str, pods: int, timeout_s: float = 120.0) -> None:
    """Until the pool has ``pods`` ready pods (so no pod start is inside the measure)."""
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(headers=headers) as http:
        while time.monotonic() < deadline:
            async with http.get(f"{url}/v1/pools") as resp:
                body = orjson.loads(await resp.read())
            ready = sum(  # pods by "state:role"
                count
                for pool in body["pools"].values()
                for key, count in pool["pods"].items()
                if key.lower().startswith("idle:")
            )
            if ready >= pods:
                return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the pool never had {pods} ready pods: {body}")


def one_depth(
    jobs: int, pods: int, senders: int, backend: str, min_jobs: int = 0
) -> dict[str, Any]:
    """``jobs`` queued at once, drained; repeated in the same broker (each batch drained
    before the next) until at least ``min_jobs`` ran, so a shallow depth is measured over
    as many jobs as a deep one and one slow second of a loaded machine weighs as little."""
    batches = max(1, -(-min_jobs // jobs))
    with tempfile.TemporaryDirectory(prefix="fp-bench-backlog-") as tmp:
        home = Path(tmp)
        env = {"FIREPOOL_BACKEND": backend}
        if backend == "fake":  # its jobs run in the broker's process: no sandbox to have
            env["FIREPOOL_ALLOW_UNSANDBOXED"] = "1"
        server = start_broker(home, catalog(pods), extra_env=env)
        try:
            with server.client("deployer", Role.DEPLOY) as fp:
                fp.deploy(NOOP, name="noop", sku="cpu", entrypoint="noop:noop")
            token = server.token("bench")
            admin = server.token("admin", Role.ADMIN)
            asyncio.run(_wait_pods(server.url, admin, pods))
            cpu = wall = submitted = 0.0
            failed: list[dict[str, Any]] = []
            drained: list[tuple[float, float]] = []

            def mark() -> None:
                drained.append((process_cpu_s(server.proc.pid), time.perf_counter()))

            for _ in range(batches):
                drained.clear()
                cpu0, t0 = process_cpu_s(server.proc.pid), time.perf_counter()
                ids = asyncio.run(_submit(server.url, token, jobs, senders))
                submitted += time.perf_counter() - t0
                failed += asyncio.run(_drained(server.url, token, ids, 0.2, mark))
                cpu += drained[-1][0] - cpu0
                wall += drained[-1][1] - t0
        finally:
            server.stop()
            kill_pods(home)
    ran = jobs * batches
    return {
        "jobs": jobs,
        "batches": batches,
        "not_succeeded": len(failed),  # counted, not fatal: one odd job must not void a run
        "not_succeeded_first": failed[:3],
        "broker_cpu_ms_per_job": round(cpu * 1000 / ran, 3),
        "wall_ms_per_job": round(wall * 1000 / ran, 3),
        "submit_s": round(submitted, 3),
        "drain_s": round(wall, 3),
        "load_average": list(os.getloadavg()),
    }


def run(
    depths: list[int], pods: int, senders: int, backend: str, min_jobs: int = 0
) -> dict[str, Any]:
    results = [one_depth(d, pods, senders, backend, min_jobs) for d in depths]
    low, high = results[0], results[-1]
    return {
        "backend": backend,
        "pods": pods,
        "depths": results,
        "ratio": round(high["broker_cpu_ms_per_job"] / max(low["broker_cpu_ms_per_job"], 1e-9), 3),
        "goal": {"ratio": 1.25},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--depths", type=positive_int, nargs="+", default=[100, 1_000, 10_000],
        help="queue depths, shallowest first",
    )  # fmt: skip
    parser.add_argument("--pods", type=positive_int, default=4, help="the pool's cap")
    parser.add_argument("--senders", type=positive_int, default=8, help="concurrent submits")
    parser.add_argument("--backend", choices=["fake", "local"], default="fake")
    parser.add_argument(
        "--min-jobs", type=int, default=1_000,
        help="run each depth in batches (each drained before the next) until this many ran",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if len(args.depths) < 2 or args.depths != sorted(args.depths):
        parser.error("--depths: at least two depths, shallowest first")
    result = run(args.depths, args.pods, args.senders, args.backend, args.min_jobs)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:>10}: {value}")


if __name__ == "__main__":
    main()
