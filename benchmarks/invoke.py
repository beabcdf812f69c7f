"""Sync-invoke latency of a no-op function over real HTTP on loopback (issue 2).

Starts a broker (SQLite, local pods) in a temporary state directory, then measures:
- ``warm_p50_ms`` / ``warm_p99_ms``: one caller, a stable lease tag, ``--calls`` sequential
  sync invokes on one keep-alive connection (after ``--warmup`` calls);
- ``new_pod_p50_ms``: a single-use function, so every call waits for a pod to be created.

    python -m benchmarks.invoke --json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from tqdm import tqdm

from gateway.auth import Role
from gateway.harness import kill_pods, start_broker

NOOP = Path(__file__).resolve().parent.parent / "examples" / "functions" / "noop"
CATALOG = (
    "budgets: {cpu: 16}\n"
    "pools:\n"
    "  cpu: {min_count: 1, max_idle_count: 2, max_count: 8, idle_timeout_s: 600}\n"
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _calls(
    url: str,
    token: str,
    name: str,
    n: int,
    tag: str | None,
    progress: bool,
    phases: dict[str, list[float]] | None = None,
) -> tuple[list[float], dict[str, int]]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    latencies: list[float] = []
    paths: dict[str, int] = {}
    async with aiohttp.ClientSession(headers=headers) as http:
        for i in tqdm(range(n), desc=name, disable=not progress, file=sys.stderr):
            body: dict[str, Any] = {"input": {"i": i}}
            if tag is not None:
                body["lease_tag"] = tag
            t0 = time.perf_counter()
            async with http.post(
                f"{url}/v1/functions/{name}:invoke", data=orjson.dumps(body)
            ) as resp:
                job = orjson.loads(await resp.read())
            latencies.append((time.perf_counter() - t0) * 1000)
            if resp.status != 200 or job.get("state") != "SUCCEEDED":
                raise RuntimeError(f"call {i} failed: {resp.status} {job}")
            path = (job.get("acquisition") or {}).get("path", "?")
            paths[path] = paths.get(path, 0) + 1
            if phases is not None:
                t = job["timings"]
                att = job["attempts"][-1]
                for key, a, b in (
                    ("submit_to_start", t["submitted"], t["started"]),
                    ("start_to_first_instruction", t["started"], t["first_instruction"]),
                    ("first_instruction_to_exit", t["first_instruction"], att["finished"]),
                ):
                    phases.setdefault(key, []).append((b - a) * 1000)
                # the rest: HTTP in and out, reset, the completion commit
                inside = (att["finished"] - t["submitted"]) * 1000
                phases.setdefault("http_reset_and_commit", []).append(latencies[-1] - inside)
    return latencies, paths


def run(calls: int, warmup: int, new_pod_calls: int, progress: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fp-bench-") as tmp:
        home = Path(tmp)
        server = start_broker(home, CATALOG)
        try:
            with server.client("deployer", Role.DEPLOY) as fp:
                fp.deploy(NOOP, name="noop", sku="cpu", entrypoint="noop:noop")
                fp.deploy(
                    NOOP, name="noop-fresh", sku="cpu", entrypoint="noop:noop", single_use=True
                )
            token = server.token("bench")
            asyncio.run(_calls(server.url, token, "noop", warmup, "bench", False))
            phases: dict[str, list[float]] = {}
            warm, warm_paths = asyncio.run(
                _calls(server.url, token, "noop", calls, "bench", progress, phases)
            )
            fresh_token = server.token("bench-fresh")
            fresh, fresh_paths = asyncio.run(
                _calls(server.url, fresh_token, "noop-fresh", new_pod_calls, None, progress)
            )
        finally:
            server.stop()
            kill_pods(home)
    return {
        "warm_p50_ms": round(statistics.median(warm), 3),
        "warm_p99_ms": round(pct(warm, 0.99), 3),
        "warm_mean_ms": round(statistics.fmean(warm), 3),
        "warm_calls": len(warm),
        "warm_paths": warm_paths,
        "warm_phase_p50_ms": {k: round(statistics.median(v), 3) for k, v in phases.items()},
        "new_pod_p50_ms": round(statistics.median(fresh), 3),
        "new_pod_calls": len(fresh),
        "new_pod_paths": fresh_paths,
        "goal": {"warm_p50_ms": 15, "warm_p99_ms": 40},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--new-pod-calls", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = run(args.calls, args.warmup, args.new_pod_calls, progress=not args.json)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value}")


if __name__ == "__main__":
    main()
