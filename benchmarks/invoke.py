"""Sync-invoke latency of a no-op function over real HTTP on loopback (issue 2).

Starts a broker (SQLite, local pods) in a temporary state directory, then measures:
- ``warm_p50_ms`` / ``warm_p99_ms``: one caller, a stable lease tag, ``--calls`` sequential
  sync invokes on one keep-alive connection (after ``--warmup`` calls);
- ``new_pod_p50_ms``: a single-use function, so every call waits for a pod to be created;
- ``warm_phase_p50_ms`` / ``warm_phase_p90_ms``: where a warm call's time goes, from the
  job's own timings (submit, claim, the pod's receipt, first instruction, exit).

    python -m benchmarks.invoke --json
    python -m benchmarks.invoke --write-venue simulator/venues/local.yaml

``--write-venue`` puts the warm path's costs into the simulator's venue (``write_venue``).
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
import yaml
from tqdm import tqdm

from benchmarks.args import non_negative_int, positive_int
from gateway.auth import Role
from gateway.harness import kill_pods, start_broker
from simulator.venue import check_venue_target, save_venue

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
        # No tqdm at all without a bar: even a disabled one starts tqdm's monitor thread,
        # which outlives the run (and would stop the simulator's ``run_many`` from forking).
        calls = tqdm(range(n), desc=name, file=sys.stderr) if progress else range(n)
        for i in calls:
            body: dict[str, Any] = {"input": {"i": i}}
            if tag is not None:
                body["lease_tag"] = tag
            t0 = time.perf_counter()
            async with http.post(
                f"{url}/v1/functions/{name}:invoke", data=orjson.dumps(body)
            ) as resp:
                job = orjson.loads(await resp.read())
            answered = time.time()  # the jobs' timings are wall-clock times too
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
                    # the two parts of the previous one: commit and hand-off to the pod's
                    # agent, then the agent to the function's first instruction
                    ("start_to_pod", t["started"], att["started"]),
                    ("pod_to_first_instruction", att["started"], t["first_instruction"]),
                    ("first_instruction_to_exit", t["first_instruction"], att["finished"]),
                    # the outcome's commit, the pod's reset and release, then the answer
                    # (sent only once the pod is released)
                    ("exit_to_answer", att["finished"], answered),
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
        "warm_phase_p90_ms": {k: round(pct(v, 0.9), 3) for k, v in phases.items()},
        "new_pod_p50_ms": round(statistics.median(fresh), 3),
        "new_pod_calls": len(fresh),
        "new_pod_paths": fresh_paths,
        "goal": {"warm_p50_ms": 15, "warm_p99_ms": 40},
    }


def write_venue(path: Path, result: dict[str, Any]) -> None:
    """Write the warm path's measured costs into a simulator venue YAML (the ``local``
    venue's), keeping every other constant: ``accept_s`` is submit -> the dispatcher's claim,
    ``handoff`` the claim -> the pod's agent holding the attempt (the durable commit
    included, so ``dispatch_s`` is 0), ``first_instruction`` the agent -> the function's
    first instruction and ``reset_s`` the function's exit -> the caller's answer, which the
    broker sends once the outcome is committed and the pod reset and released.
    ``firepool simulate calibrate`` measures the pod starts; the simulator may not import
    the broker, so the broker's costs are measured here."""
    p50, p90 = result["warm_phase_p50_ms"], result["warm_phase_p90_ms"]

    def dist(key: str) -> dict[str, float]:
        return {"median": round(p50[key] / 1000, 5), "p90": round(p90[key] / 1000, 5)}

    data: dict[str, Any] = yaml.safe_load(path.read_text())
    data["accept_s"] = round(p50["submit_to_start"] / 1000, 5)
    data["dispatch_s"] = 0.0
    data["handoff"] = dist("start_to_pod")
    data["first_instruction"] = dist("pod_to_first_instruction")
    data["reset_s"] = round(p50["exit_to_answer"] / 1000, 5)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    how = f"measured {stamp}: python -m benchmarks.invoke, {result['warm_calls']} warm calls"
    notes = dict(data.get("notes") or {})
    notes["accept_s"] = f"{how}, submit -> claimed (p50)"
    notes["dispatch_s"] = "0: the durable commit is measured inside handoff"
    notes["handoff"] = f"{how}, claimed -> the pod's agent has the attempt (commit included)"
    notes["first_instruction"] = f"{how}, agent -> the function's first instruction"
    notes["reset_s"] = f"{how}, exit -> answered (commit, reset, release; p50)"
    data["notes"] = notes
    save_venue(path, data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=positive_int, default=600)
    parser.add_argument("--warmup", type=non_negative_int, default=30)
    parser.add_argument("--new-pod-calls", type=positive_int, default=10)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--write-venue",
        type=Path,
        metavar="YAML",
        help="also write the warm path's costs into this simulator venue file "
        "(simulator/venues/local.yaml after `firepool simulate calibrate`)",
    )
    args = parser.parse_args()
    if args.calls < 10 or args.warmup < 0 or args.new_pod_calls < 1:
        parser.error("need --calls >= 10 (a p90), --warmup >= 0 and --new-pod-calls >= 1")
    if args.write_venue is not None:
        try:  # an existing venue: only the warm path's constants are measured here
            check_venue_target(args.write_venue, new_ok=False)
        except ValueError as exc:
            parser.error(f"--write-venue: {exc}")
    result = run(args.calls, args.warmup, args.new_pod_calls, progress=not args.json)
    if args.write_venue is not None:
        write_venue(args.write_venue, result)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value}")


if __name__ == "__main__":
    main()
