"""Sync-invoke latency of a no-op function over real HTTP on loopback (issues 2 and 25).

Starts a broker (SQLite, local pods) in a temporary state directory and the floor server
(``benchmarks.floor_server``: the same no-op forked from the same preloaded zygote in the same
sandbox, with no queue, store or reset), then, in ``--rounds`` alternating rounds of
``--calls`` sequential calls each (one keep-alive connection, after ``--warmup`` calls):
- ``warm_p50_ms`` / ``warm_p99_ms``: one caller, a stable lease tag, sync invokes of the
  broker; ``floor_p50_ms`` / ``floor_p99_ms``: the same calls to the floor server, and the
  ratios ``warm_p50_ms / floor_p50_ms`` and ``warm_p99_ms / floor_p50_ms`` (the goals: 2, 4);
- ``broker_cpu_ms_per_call``: the broker process's CPU (/proc) over the broker rounds, per
  call; ``pod_cpu_ms_per_call``: the same for every process of the pods (the sandbox, the
  agent, the zygote and the jobs it reaped); ``floor_cpu_ms_per_call``: the floor server's
  whole tree over the floor rounds;
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
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from tqdm import tqdm

from benchmarks.args import non_negative_int, positive_int
from benchmarks.proc_cpu import process_cpu_s, tree_cpu_s
from gateway.auth import Role
from gateway.harness import REPO, free_port, kill_pods, start_broker
from pod_runtime import launch, proctree
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


@contextlib.contextmanager
def floor_server(home: Path) -> Iterator[tuple[str, int]]:
    """Run ``benchmarks.floor_server`` in a pod's sandbox (bubblewrap where it works, as
    ``pod_runtime.launch`` builds it for a pod: ``home`` hidden, the pod directory bound
    writable); yields its URL and the pid at the root of its process tree."""
    pod_dir = home / "floor"
    pod_dir.mkdir()
    port = free_port()
    server = [
        sys.executable, "-P", "-m", "benchmarks.floor_server", "--pod-dir", str(pod_dir),
        "--port", str(port), "--package", str(NOOP), "--entrypoint", "noop:noop",
    ]  # fmt: skip
    sandboxed, _ = launch.sandbox_status()
    argv = server
    if sandboxed:
        # The pods' sandbox, with the host's network: the benchmark calls the floor on loopback.
        argv = [*launch.bwrap_argv(pod_dir, "host", None, sys.executable, [home]), *server]
    env = dict(os.environ, PYTHONPATH=str(REPO))  # ``-P``: the module's tree, by name
    with (home / "floor.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"floor server did not start: {(home / 'floor.log').read_text()}")
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        # Its sandbox starts new sessions: every descendant is killed by pid.
        for pid in [proc.pid, *proctree.descendants(proctree.scan(), proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


async def _floor_calls(url: str, n: int) -> list[float]:
    """``n`` sequential no-op calls to the floor server on one keep-alive connection."""
    latencies: list[float] = []
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as http:
        for i in range(n):
            t0 = time.perf_counter()
            async with http.post(f"{url}/invoke", data=orjson.dumps({"input": {"i": i}})) as resp:
                answer = orjson.loads(await resp.read())
            latencies.append((time.perf_counter() - t0) * 1000)
            if resp.status != 200 or answer.get("output") != {"i": i}:
                raise RuntimeError(f"floor call {i} failed: {resp.status} {answer}")
    return latencies


def pod_roots(home: Path) -> list[int]:
    """The launcher pids of the broker's local pods (their metadata files)."""
    roots = []
    for meta in (home / "pods").glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            pid = orjson.loads(meta.read_bytes()).get("pid")
            if isinstance(pid, int):
                roots.append(pid)
    return roots


def run(
    calls: int, warmup: int, new_pod_calls: int, progress: bool, rounds: int = 5
) -> dict[str, Any]:
    warm: list[float] = []
    floor: list[float] = []
    per_round: list[dict[str, float]] = []
    cpu = {"broker": 0.0, "pod": 0.0, "floor": 0.0}
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
            with floor_server(home) as (floor_url, floor_pid):
                asyncio.run(_calls(server.url, token, "noop", warmup, "bench", False))
                asyncio.run(_floor_calls(floor_url, warmup))
                phases: dict[str, list[float]] = {}
                warm_paths: dict[str, int] = {}
                for _ in range(rounds):
                    pods = pod_roots(home)
                    broker0, pod0 = process_cpu_s(server.proc.pid), tree_cpu_s(pods)
                    times, paths = asyncio.run(
                        _calls(server.url, token, "noop", calls, "bench", progress, phases)
                    )
                    cpu["broker"] += process_cpu_s(server.proc.pid) - broker0
                    cpu["pod"] += tree_cpu_s(pods) - pod0
                    for path, count in paths.items():
                        warm_paths[path] = warm_paths.get(path, 0) + count
                    floor0 = tree_cpu_s([floor_pid])
                    floor_times = asyncio.run(_floor_calls(floor_url, calls))
                    cpu["floor"] += tree_cpu_s([floor_pid]) - floor0
                    warm += times
                    floor += floor_times
                    per_round.append(
                        {
                            "warm_p50_ms": round(statistics.median(times), 3),
                            "floor_p50_ms": round(statistics.median(floor_times), 3),
                        }
                    )
            fresh_token = server.token("bench-fresh")
            fresh, fresh_paths = asyncio.run(
                _calls(server.url, fresh_token, "noop-fresh", new_pod_calls, None, progress)
            )
        finally:
            server.stop()
            kill_pods(home)
    measured = calls * rounds
    warm_p50, warm_p99 = statistics.median(warm), pct(warm, 0.99)
    floor_p50, floor_p99 = statistics.median(floor), pct(floor, 0.99)
    return {
        "warm_p50_ms": round(warm_p50, 3),
        "warm_p99_ms": round(warm_p99, 3),
        "warm_mean_ms": round(statistics.fmean(warm), 3),
        "floor_p50_ms": round(floor_p50, 3),
        "floor_p99_ms": round(floor_p99, 3),
        "warm_p50_over_floor_p50": round(warm_p50 / floor_p50, 3),
        "warm_p99_over_floor_p50": round(warm_p99 / floor_p50, 3),
        "broker_cpu_ms_per_call": round(cpu["broker"] * 1000 / measured, 3),
        "pod_cpu_ms_per_call": round(cpu["pod"] * 1000 / measured, 3),
        "floor_cpu_ms_per_call": round(cpu["floor"] * 1000 / measured, 3),
        "floor_sandboxed": launch.sandbox_status()[0],
        "rounds": per_round,
        "warm_calls": len(warm),
        "warm_paths": warm_paths,
        "warm_phase_p50_ms": {k: round(statistics.median(v), 3) for k, v in phases.items()},
        "warm_phase_p90_ms": {k: round(pct(v, 0.9), 3) for k, v in phases.items()},
        "new_pod_p50_ms": round(statistics.median(fresh), 3),
        "new_pod_calls": len(fresh),
        "new_pod_paths": fresh_paths,
        "load_average": list(os.getloadavg()),
        "goal": {"warm_p50_over_floor_p50": 2, "warm_p99_over_floor_p50": 4},
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
    parser.add_argument("--calls", type=positive_int, default=200, help="per round")
    parser.add_argument(
        "--rounds", type=positive_int, default=5, help="alternating broker and floor rounds"
    )
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
    result = run(
        args.calls, args.warmup, args.new_pod_calls, progress=not args.json, rounds=args.rounds
    )
    if args.write_venue is not None:
        write_venue(args.write_venue, result)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value}")


if __name__ == "__main__":
    main()
