"""A load ramp: warm no-op sync invokes from 32 callers over real HTTP on loopback (issue 26).

Starts a broker (SQLite, local pods) in a temporary state directory and offers it load open
loop (each request sent at its time, whether or not earlier ones were answered), from
``--callers`` callers each with its own token and lease tag (their pods stay warm):

1. the ramp: ``--step-s`` seconds at each offered rate, from ``--start-rps`` up by
   ``--factor`` a step, until a step's p99 passes ``--p99-ms`` or a request fails (or
   ``--max-steps``); the knee is the last rate that held;
2. every job the ramp was given (a 200, or a 202 still running) is read until it has ended:
   the step past the knee leaves a backlog, which the hold must not inherit;
3. the hold: 80% of the knee for ``--hold-s`` seconds, the broker's resident memory read
   before and after it, then every job it was given read until it has ended.

The floor: bare Starlette (one JSON route, the same uvicorn loop and HTTP parser as the
broker) served in its own process on this machine, in the same run, driven closed loop by
the same number of callers; ``knee_over_floor`` is the knee's share of its requests/s.

    python -m benchmarks.load --json
    python -m benchmarks.load --json --hold-s 30

Loopback only; bounded in count (``--max-steps`` steps, each at most rate x step seconds)
and in time. Goals: no error but typed capacity refusals (429 ``QuotaExceeded``, 503
``Unavailable``), nothing lost (every accepted job ends), memory after the hold within 10%
of before it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from benchmarks.args import positive_int
from benchmarks.invoke import NOOP, pct
from gateway.auth import Role
from gateway.harness import REPO, free_port, kill_pods, start_broker, wait_ready

CATALOG = (
    "budgets: {cpu: 40}\n"
    "pools:\n"
    "  cpu: {min_count: 32, max_idle_count: 36, max_count: 36, step: 8, idle_timeout_s: 900}\n"
)
"""A pod per caller: a used pod is never handed to another caller (it is held for its owner,
then retired), so 32 callers keep 32 warm pods, with a few spare."""
CAPACITY_REFUSALS = frozenset({"429 QuotaExceeded", "503 Unavailable"})
"""Typed refusals of a broker at capacity: a caller is told to come back, nothing is lost."""
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
SETTLE_S = 120.0
"""Longest the accepted jobs still running after the hold are waited for."""
FLOOR_S = 5.0
"""How long the bare Starlette floor is driven."""


async def _bare(request: Request) -> Response:
    await request.body()
    return Response(b'{"ok":true}', media_type="application/json")


async def _ready(request: Request) -> Response:
    return Response(b'{"ready":true}', media_type="application/json")


bare_app = Starlette(routes=[Route("/invoke", _bare, methods=["POST"]), Route("/readyz", _ready)])
"""The floor: what uvicorn and Starlette alone answer on this machine (no auth, no broker)."""


@dataclass
class Step:
    """What one offered rate got back."""

    rps: float
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    accepted: list[str] = field(default_factory=list)
    """Jobs the broker took (200 or 202), to be read until they end."""
    unanswered: int = 0
    """Requests still in flight when the step's sending ended, then awaited."""

    def report(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "offered_rps": round(self.rps, 1),
            "sent": len(lat) + sum(self.errors.values()),
            "answered_rps": round(len(lat) / self.seconds, 1),
            "p50_ms": round(statistics.median(lat), 2) if lat else None,
            "p99_ms": round(pct(lat, 0.99), 2) if lat else None,
            "errors": dict(self.errors),
        }


async def _one(
    http: aiohttp.ClientSession, url: str, token: str, tag: str, step: Step, i: int
) -> None:
    body = orjson.dumps({"input": {"i": i}, "lease_tag": tag})
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    t0 = time.perf_counter()
    try:
        async with http.post(url, data=body, headers=headers) as resp:
            raw = await resp.read()
            status = resp.status
    except (TimeoutError, aiohttp.ClientError) as exc:
        step.errors[type(exc).__name__] += 1
        return
    elapsed = (time.perf_counter() - t0) * 1000
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        step.errors[f"{status} not JSON"] += 1
        return
    if status == 200 and answer.get("state") == "SUCCEEDED":
        step.latencies_ms.append(elapsed)
        step.accepted.append(answer["id"])
    elif status == 202:
        step.latencies_ms.append(elapsed)
        step.accepted.append(answer["job_id"])
    else:
        error = answer.get("error") or {}
        step.errors[f"{status} {error.get('class', answer.get('state', '?'))}"] += 1


async def offer(url: str, tokens: list[str], rps: float, seconds: float, first: int = 0) -> Step:
    """Send ``rps`` requests a second for ``seconds``, spread evenly and round robin over
    the callers (``tokens``), open loop; then wait for every answer."""
    step = Step(rps, seconds)
    target = f"{url}/v1/functions/noop:invoke"
    count = max(1, int(rps * seconds))
    timeout = aiohttp.ClientTimeout(total=90)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        tasks: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(count):
            delay = start + i / rps - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            caller = (first + i) % len(tokens)
            coro = _one(http, target, tokens[caller], f"load{caller}", step, first + i)
            tasks.append(loop.create_task(coro))
        step.unanswered = sum(not t.done() for t in tasks)
        await asyncio.gather(*tasks)
    return step


async def warm_up(url: str, tokens: list[str], rounds: int = 2) -> Step:
    """Each caller's first invokes, one at a time per caller: its pod becomes its own."""
    step = Step(0.0, 1.0)
    target = f"{url}/v1/functions/noop:invoke"
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def caller(i: int) -> None:
            for r in range(rounds):
                await _one(http, target, tokens[i], f"load{i}", step, r * len(tokens) + i)

        await asyncio.gather(*(caller(i) for i in range(len(tokens))))
    return step


async def _settle(url: str, token: str, jobs: list[str]) -> dict[str, int]:
    """Read each job (as an admin) until it has ended, for at most ``SETTLE_S``; returns the
    count by state, ``LOST`` for one the broker does not know."""
    states: Counter[str] = Counter()
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + SETTLE_S
    async with aiohttp.ClientSession(headers=headers) as http:
        for job_id in jobs:
            while True:
                async with http.get(f"{url}/v1/jobs/{job_id}") as resp:
                    answer = orjson.loads(await resp.read())
                state = answer.get("state", "LOST") if resp.status == 200 else "LOST"
                if state in TERMINAL or state == "LOST" or time.monotonic() > deadline:
                    states[state] += 1
                    break
                await asyncio.sleep(0.2)
    return dict(states)


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid``, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for {pid}")


async def _closed_loop(url: str, callers: int, seconds: float) -> float:
    """Requests/s ``callers`` callers get, each sending its next as soon as it is answered."""
    done = 0
    stop = time.perf_counter() + seconds
    body = orjson.dumps({"input": {"i": 0}, "lease_tag": "floor"})

    async def caller(http: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            async with http.post(url, data=body) as resp:
                await resp.read()
            done += 1

    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(caller(http) for _ in range(callers)))
    return done / (time.perf_counter() - started)


def floor_rps(callers: int) -> float:
    """Bare Starlette's requests/s here (``bare_app`` in a uvicorn process of its own)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fp-floor-") as tmp:
        log = Path(tmp) / "floor.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "benchmarks.load:bare_app", "--port",
                 str(port), "--loop", "uvloop", "--http", "httptools", "--log-level",
                 "warning", "--no-access-log"],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, proc, log)
            asyncio.run(_closed_loop(f"{url}/invoke", callers, 1.0))  # warm-up
            return asyncio.run(_closed_loop(f"{url}/invoke", callers, FLOOR_S))
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def run(
    callers: int,
    start_rps: float,
    factor: float,
    step_s: float,
    p99_ms: float,
    max_steps: int,
    hold_s: float,
    progress: bool,
) -> dict[str, Any]:
    def say(text: str) -> None:
        if progress:
            print(text, file=sys.stderr, flush=True)

    floor = floor_rps(callers)
    say(f"floor: bare Starlette {floor:.0f} req/s")
    with tempfile.TemporaryDirectory(prefix="fp-load-") as tmp:
        home = Path(tmp)
        server = start_broker(home, CATALOG)
        try:
            with server.client("deployer", Role.DEPLOY) as fp:
                fp.deploy(NOOP, name="noop", sku="cpu", entrypoint="noop:noop")
            tokens = [server.token(f"load{i}") for i in range(callers)]
            sent = 0
            warm = asyncio.run(warm_up(server.url, tokens))
            sent += 2 * len(tokens)
            steps: list[Step] = []
            knee: float | None = None
            rps = start_rps
            for _ in range(max_steps):
                step = asyncio.run(offer(server.url, tokens, rps, step_s, sent))
                sent += int(rps * step_s)
                steps.append(step)
                say(f"ramp: {step.report()}")
                p99 = pct(step.latencies_ms, 0.99) if step.latencies_ms else float("inf")
                if step.errors or p99 > p99_ms:
                    break
                knee = rps
                rps *= factor
            held_rps = 0.8 * (knee if knee is not None else start_rps)
            admin = server.token("load-admin", Role.ADMIN)
            ramped = [j for s in [warm, *steps] for j in s.accepted]
            ended = Counter(asyncio.run(_settle(server.url, admin, ramped)))  # the backlog
            rss_before = rss_mib(server.proc.pid)
            hold = asyncio.run(offer(server.url, tokens, held_rps, hold_s, sent))
            rss_after = rss_mib(server.proc.pid)
            say(f"hold: {hold.report()}")
            ended.update(asyncio.run(_settle(server.url, admin, hold.accepted)))
            accepted = ramped + hold.accepted
        finally:
            server.stop()
            kill_pods(home)
    errors: Counter[str] = Counter()
    for s in [warm, *steps, hold]:
        errors.update(s.errors)
    not_ended = len(accepted) - sum(n for state, n in ended.items() if state in TERMINAL)
    other_errors = sum(n for name, n in errors.items() if name not in CAPACITY_REFUSALS)
    rss_growth = (rss_after - rss_before) / rss_before
    return {
        "callers": callers,
        "knee_rps": None if knee is None else round(knee, 1),
        "floor_bare_starlette_rps": round(floor, 1),
        "knee_over_floor": None if knee is None else round(knee / floor, 3),
        "steps": [s.report() for s in steps],
        "hold": {**hold.report(), "seconds": hold_s},
        "errors_by_class": dict(errors),
        "accepted_jobs": len(accepted),
        "ended_jobs_by_state": dict(ended),
        "jobs_not_ended": not_ended,
        "broker_rss_mib_before_hold": rss_before,
        "broker_rss_mib_after_hold": rss_after,
        "rss_growth": round(rss_growth, 4),
        "goals_met": {
            "no_errors_but_capacity_refusals": other_errors == 0,
            "nothing_lost": not_ended == 0,
            "memory_within_10pct": rss_growth <= 0.10,
        },
        "goal": {"p99_ms_at_knee": p99_ms, "rss_growth_max": 0.10, "other_errors": 0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--callers", type=positive_int, default=32)
    parser.add_argument("--start-rps", type=positive_int, default=10)
    parser.add_argument("--factor", type=float, default=1.4)
    parser.add_argument("--step-s", type=positive_int, default=5)
    parser.add_argument("--p99-ms", type=positive_int, default=250)
    parser.add_argument("--max-steps", type=positive_int, default=12)
    parser.add_argument("--hold-s", type=positive_int, default=120)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if not 1.05 <= args.factor <= 4:
        parser.error("--factor must be in [1.05, 4]")
    result = run(
        args.callers,
        args.start_rps,
        args.factor,
        args.step_s,
        args.p99_ms,
        args.max_steps,
        args.hold_s,
        progress=not args.json,
    )
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")


if __name__ == "__main__":
    main()
