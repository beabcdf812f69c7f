"""The paper's loops against the real broker on local pods (§9.1, App. B.2-B.4; issue 6).

    python -m benchmarks.loops --workload w-agent --arms reuse-on,reuse-off,fresh \
        --repeats 5 --scale 0.25 --json

Runs the simulator's own caller programs (W-Agent, W-RL) in real time against a broker started
with ``gateway.harness.start_broker``: a ``Batch`` submits its jobs concurrently (one thread per
job, synchronous ``invoke``) and waits for all of them; a pause sleeps. Job bodies are a fixed
sleep (``benchmarks/loop_fn``), and bodies and pauses are multiplied by ``--scale`` so paired
repeats fit in minutes. Arms differ only in acquisition: ``reuse-on`` a stable tag per caller,
``reuse-off`` a fresh tag per job (retiring boundary), ``fresh`` a ``single_use`` function.
Arms are rotated per repeat and each arm's callers are fresh names, so no arm inherits another
arm's owner-held pods (never-used idle pods do carry over, as in the paper's crossover).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from benchmarks.run_log import RunLog, add_log_flag, open_log, still_to_run
from functions.sdk import Client
from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker
from simulator.cli import HelpFormatter
from simulator.experiment import Workload
from simulator.metrics import bootstrap_ci
from simulator.workloads import Batch, Program

FN_DIR = Path(__file__).resolve().parent / "loop_fn"
CATALOG = """budgets: {cpu: %(cap)d}
pools:
  cpu: {min_count: 0, max_idle_count: 2, max_count: %(cap)d, idle_timeout_s: 60,
        caller_hold_s: %(hold)s, step: %(cap)d}
"""


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: list[dict[str, Any]] = []


def _invoke(client: Client, fn: str, body: float, tag: str | None, rec: Recorder) -> None:
    t0 = time.time()
    job = client.invoke(fn, {"s": body}, lease_tag=tag)
    t1 = time.time()
    timings = job.get("timings") or {}
    first = timings.get("first_instruction")
    submitted = timings.get("submitted") or t0
    row = {
        "state": job.get("state"),
        "path": (job.get("acquisition") or {}).get("path"),
        "start_s": (first - submitted) if first else None,
        "t0": t0,
        "t1": t1,
        # dispatched -> answered, which the broker does only once the pod is reset and
        # released: the pod's time taken by the job, as the simulator's busy pods (its
        # always-on pool's peak)
        "busy": (timings.get("started") or first, t1) if first else None,
    }
    with rec.lock:
        rec.jobs.append(row)


def _run_caller(server: BrokerServer, caller: str, program: Program, arm: str, scale: float,
                rec: Recorder) -> None:  # fmt: skip
    fn = "sleep-fresh" if arm == "fresh" else "sleep"
    seq = 0
    with server.client(caller) as client, ThreadPoolExecutor(16) as pool:
        for cmd in program:
            if isinstance(cmd, Batch):
                futures = []
                for body in cmd.bodies:
                    seq += 1
                    tag = None if arm == "fresh" else caller
                    if arm == "reuse-off":
                        tag = f"{caller}/{seq}"
                    futures.append(pool.submit(_invoke, client, fn, body * scale, tag, rec))
                for f in futures:
                    f.result()
            else:
                time.sleep(float(cmd) * scale)  # type: ignore[arg-type]


def _held_unit_seconds(admin: Client) -> float:
    return float(admin.pools()["budgets"]["cpu"]["held_unit_seconds"])


def peak_concurrency(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at once (an end at the same instant as a start closes first)."""
    events = sorted([(b, 1) for b, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda ev: (ev[0], ev[1]))  # fmt: skip
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def run_arm(server: BrokerServer, workload: Workload, arm: str, seed: int, repeat: int,
            scale: float) -> dict[str, Any]:  # fmt: skip
    """One run. Held capacity is the broker's ledger counter over the run's window, so it
    also counts pods the previous arm left (idle within their keep-alive), and not what this
    run leaves after its last job; the simulator's ``held_pod_s`` counts a run's own pods
    until they are gone. The always-on pool is the run's peak of jobs running at once (from
    dispatch to finish) for the whole makespan."""
    rec = Recorder()
    threads = [
        threading.Thread(target=_run_caller,
                         args=(server, f"{arm}-r{repeat}-{caller}", program, arm, scale, rec))
        for caller, program in workload.programs(seed)
    ]  # fmt: skip
    with server.client("loops-admin", Role.ADMIN) as admin:
        held0 = _held_unit_seconds(admin)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        held = _held_unit_seconds(admin) - held0
    starts = [j["start_s"] for j in rec.jobs if j["start_s"] is not None]
    makespan = max(j["t1"] for j in rec.jobs) - min(j["t0"] for j in rec.jobs)
    peak = peak_concurrency([j["busy"] for j in rec.jobs if j["busy"] is not None])
    return {
        "makespan_s": makespan,
        "starts": starts,
        "paths": Counter(str(j["path"]) for j in rec.jobs),
        "failed": sum(1 for j in rec.jobs if j["state"] != "SUCCEEDED"),
        "held_pod_s": held,
        "held_vs_always_on": held / (peak * makespan) if peak and makespan > 0 else None,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loops", description=__doc__,
                                formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument(
        "--workload",
        choices=("w-agent", "w-rl"),
        default="w-agent",
        help="the paper's agent loop or RL loop (the simulator's workloads)",
    )
    p.add_argument(
        "--arms",
        default="reuse-on,reuse-off,fresh",
        help="comma-separated, of reuse-on, reuse-off, fresh; the first is the reference",
    )
    p.add_argument(
        "--repeats", type=int, default=5, help="paired repeats per arm (arms rotated per repeat)"
    )
    p.add_argument("--agents", type=int, default=2, help="W-Agent concurrent agents")
    p.add_argument("--scale", type=float, default=0.25, help="multiply bodies and pauses")
    p.add_argument("--cap", type=int, default=8, help="pool ceiling and CPU budget (pods)")
    p.add_argument(
        "--seed",
        type=int,
        default=1,
        help="first repeat's seed (repeat i: seed+i), as in the simulator",
    )
    p.add_argument("--hold", type=float, default=10.0, help="owner hold (caller_hold_s)")
    p.add_argument(
        "--settle",
        type=float,
        default=12.0,
        help="pause between arms so the previous arm's owner holds expire",
    )
    p.add_argument("--home", default=None, help="keep the broker's state (and broker.log) here")
    add_log_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ("reuse-on", "reuse-off", "fresh")]
    if bad or not arms:
        p.error(f"unknown arm {bad[0]!r}" if bad else "--arms names no arm")
    twice = [a for i, a in enumerate(arms) if a in arms[:i]]
    if twice:
        p.error(f"arm {twice[0]!r} is named twice")
    for flag, value, least in (("--repeats", args.repeats, 1), ("--agents", args.agents, 1),
                               ("--cap", args.cap, 1), ("--settle", args.settle, 0),
                               ("--hold", args.hold, 0)):  # fmt: skip
        if not value >= least:
            p.error(f"{flag} must be at least {least}, not {value:g}")
    if not args.scale > 0:
        p.error(f"--scale must be positive, not {args.scale:g}")
    workload = Workload(args.workload, agents=args.agents)
    campaign = {"benchmark": "loops", "workload": args.workload, "arms": arms,
                "agents": args.agents, "scale": args.scale, "cap": args.cap, "seed": args.seed,
                "hold": args.hold, "settle": args.settle}  # fmt: skip
    log = open_log(p, args.log, campaign)
    done: dict[tuple[int, str], dict[str, Any]] = dict(log.done) if log else {}
    plan = [(r, arm) for r in range(args.repeats)
            for arm in arms[r % len(arms) :] + arms[: r % len(arms)]]  # fmt: skip
    t_start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="firepool-loops-") as tmp,
        tqdm(total=len(plan), desc=args.workload, unit="run", file=sys.stderr) as bar,
    ):
        todo = still_to_run(plan, log, bar)
        home = Path(args.home) if args.home else Path(tmp)
        if todo:
            server = start_broker(home, CATALOG % {"cap": args.cap, "hold": args.hold})
            try:
                _run_campaign(server, workload, todo, args, log, done, bar)
            finally:
                server.stop()
                kill_pods(home)
    runs = {a: [done[(r, a)] for r in range(args.repeats)] for a in arms}
    out = summarize(runs, arms)
    out.update(workload=args.workload, scale=args.scale, repeats=args.repeats,
               agents=args.agents if args.workload == "w-agent" else None,
               hold_s=args.hold, settle_s=args.settle, cap=args.cap,
               wall_s=time.perf_counter() - t_start)  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for arm, s in out["arms"].items():
            p50, p90 = s["start_p50_s"], s["start_p90_s"]
            print(f"{arm:>10}: makespan median {s['makespan_median_s']:.2f} s, "
                  f"start p50 {p50:.3f} s p90 {p90:.3f} s, held {s['held_pod_s']:.1f} pod-s "
                  f"({s['held_vs_always_on']:.2f}x always-on), paths {s['paths']}")  # fmt: skip
    return 0


def _run_campaign(
    server: BrokerServer,
    workload: Workload,
    todo: list[tuple[int, str]],
    args: argparse.Namespace,
    log: RunLog | None,
    done: dict[tuple[int, str], dict[str, Any]],
    bar: tqdm[Any],
) -> None:
    """Run ``todo`` ((repeat, arm) in order) on ``server``, each into ``done`` and the log."""
    with server.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(FN_DIR, name="sleep", sku="cpu", entrypoint="sleeper:run")
        fp.deploy(FN_DIR, name="sleep-fresh", sku="cpu", entrypoint="sleeper:run",
                  single_use=True)  # fmt: skip
    for r, arm in todo:
        # Without the pause, the previous arm's callers still hold their pods: on a full
        # ceiling the next arm waits for hold breaking (60 s minimum tenure).
        bar.set_postfix_str(f"repeat {r + 1} {arm}: settling")
        time.sleep(args.settle)
        bar.set_postfix_str(f"repeat {r + 1} {arm}")
        run = run_arm(server, workload, arm, args.seed + r, r, args.scale)
        if log is not None:
            log.add(r, arm, run)
        done[(r, arm)] = run
        bar.update()
        bar.write(f"repeat {r + 1} {arm}: makespan {run['makespan_s']:.2f} s, "
                  f"held {run['held_pod_s']:.1f} pod-s, {run['failed']} failed",
                  file=sys.stderr)  # fmt: skip


def _median_of(values: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """For ``bootstrap_ci``: the median of each resample (one row of indices each)."""
    return lambda idx: np.median(values[idx], axis=1)


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def summarize(runs: dict[str, list[dict[str, Any]]], arms: list[str]) -> dict[str, Any]:
    ref = np.array([r["makespan_s"] for r in runs[arms[0]]])
    out: dict[str, Any] = {"arms": {}}
    for arm in arms:
        ms = np.array([r["makespan_s"] for r in runs[arm]])
        starts = [s for r in runs[arm] for s in r["starts"]]
        paths: Counter[str] = Counter()
        for r in runs[arm]:
            paths.update(r["paths"])
        s: dict[str, Any] = {
            "makespan_s": [float(x) for x in ms],
            "makespan_median_s": float(np.median(ms)),
            "start_p50_s": float(np.percentile(starts, 50)) if starts else None,
            "start_p90_s": float(np.percentile(starts, 90)) if starts else None,
            "paths": dict(sorted(paths.items())),
            "failed_jobs": sum(r["failed"] for r in runs[arm]),
            "held_pod_s": _median_or_none([r.get("held_pod_s") for r in runs[arm]]),
            "held_vs_always_on": _median_or_none([r.get("held_vs_always_on") for r in runs[arm]]),
        }
        if arm != arms[0]:
            n = min(len(ms), len(ref))
            s["speedup_vs_" + arms[0]] = float(np.median(ms[:n]) / np.median(ref[:n]))
            s["makespan_diff_median_s"] = float(np.median(ms[:n] - ref[:n]))
            s["makespan_diff_ci95"] = bootstrap_ci(n, _median_of(ms[:n] - ref[:n]))
        out["arms"][arm] = s
    return out


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
