"""Held capacity against start latency on the real broker (paper C.1, Figure 6a; issue 6).

    python -m benchmarks.frontier --arms ka3,f1-c2-ka3,ka45 --pattern bursty --rate 0.02 \
        --duration 3600 --scale 0.05 --repeats 2 --json

Runs the simulator's ``sessions`` workload (agent sessions arriving as a Poisson process,
``--pattern`` steady, bursty or diurnal, sessions belonging to ``--callers`` callers) in real
time against a broker on local pods, once per arm and repeat. Every delay of the workload
(arrivals, bodies, think times) is multiplied by ``--scale``; keep-alives are not, so name the
arms in the compressed time (``ka3`` at ``--scale 0.05`` is a 60 s keep-alive). Each arm gets
its own broker whose catalog is exactly the one ``firepool simulate --venue local --arms …``
builds, so the simulator runs the same experiment:

    firepool simulate --venue local --workload sessions --arms ka3,f1-c2-ka3,ka45 \
        --pattern bursty --rate 0.02 --duration 3600 --scale 0.05 --repeats 2

Held capacity is the broker's ledger counter (``/v1/pools`` ``held_unit_seconds``) from just
before the first session to when the pool has drained back to its floor after the last job,
the simulator's definition; the always-on pool is the run's peak of jobs running at once
(dispatch to the answer, which comes once the pod is reset and released, as the simulator's
busy pods) for its makespan (first submission to last
completion).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm import tqdm

from benchmarks.loops import FN_DIR, Recorder, _held_unit_seconds, _invoke, peak_concurrency
from benchmarks.run_log import add_log_flag, open_log, still_to_run
from functions.sdk import Client
from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker
from pool_manager.catalog import Catalog
from simulator.arms import arm_names, build_catalog
from simulator.cli import HelpFormatter
from simulator.experiment import Workload
from simulator.venue import load_venue
from simulator.workloads import Batch, Program, Spawn


def catalog_yaml(catalog: Catalog) -> str:
    """The broker's catalog file for a simulator catalog (every pool knob, the budgets)."""
    pools = {}
    for sku, spec in catalog.pools.items():
        knobs = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        del knobs["sku"]
        knobs["preload"] = list(knobs["preload"])
        pod_template = knobs.pop("pod_template")  # the catalog file's ``template`` mapping
        if pod_template is not None:
            knobs["template"] = pod_template.to_json()
        pools[sku] = knobs
    return yaml.safe_dump({"budgets": dict(catalog.budgets), "pools": pools}, sort_keys=False)


class _Sessions:
    """Runs caller programs in threads: a ``Batch`` invokes its jobs (one thread each) and
    waits for them, a delay sleeps ``scale`` times as long, a ``Spawn`` starts a program."""

    def __init__(self, server: BrokerServer, scale: float, rec: Recorder) -> None:
        self.server, self.scale, self.rec = server, scale, rec
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def spawn(self, caller: str, program: Program) -> None:
        thread = threading.Thread(target=self._run, args=(caller, program), daemon=True)
        with self.lock:
            self.threads.append(thread)
        thread.start()

    def _run(self, caller: str, program: Program) -> None:
        with self.server.client(caller) as client:
            for cmd in program:
                if isinstance(cmd, Spawn):
                    self.spawn(cmd.caller, cmd.program)
                elif isinstance(cmd, Batch):
                    jobs = [
                        threading.Thread(target=self._job, args=(client, body, caller))
                        for body in cmd.bodies
                    ]
                    for job in jobs:
                        job.start()
                    for job in jobs:
                        job.join()
                else:
                    time.sleep(float(cmd) * self.scale)  # type: ignore[arg-type]

    def _job(self, client: Client, body: float, caller: str) -> None:
        """One synchronous invoke; an error is recorded as a failed job, never lost with its
        thread."""
        t0 = time.time()
        try:
            _invoke(client, "sleep", body * self.scale, caller, self.rec)
        except Exception as exc:
            row = {"state": f"error: {exc}", "path": None, "start_s": None, "t0": t0,
                   "t1": time.time(), "busy": None}  # fmt: skip
            with self.rec.lock:
                self.rec.jobs.append(row)

    def join(self) -> None:
        """Until every program, spawned ones included, has ended."""
        while True:
            with self.lock:
                alive = [t for t in self.threads if t.is_alive()]
            if not alive:
                return
            for thread in alive:
                thread.join()


def _settled(admin: Client, floor: int, timeout_s: float) -> bool:
    """Wait until the pool holds exactly its floor, every pod idle (none starting, busy or
    retiring); ``False`` if that took longer than ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = admin.pools()["pools"]["cpu"]["pods"]
        idle = sum(n for key, n in pods.items() if key.startswith("IDLE:"))
        if sum(pods.values()) == floor == idle:
            return True
        time.sleep(0.1)
    return False


def run_arm(
    catalog: Catalog, workload: Workload, seed: int, scale: float, home: Path
) -> dict[str, Any]:
    """One run on a fresh broker with ``catalog``; see the module docstring for the metrics."""
    spec = catalog.pools["cpu"]
    server = start_broker(home, catalog_yaml(catalog))
    rec = Recorder()
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(FN_DIR, name="sleep", sku="cpu", entrypoint="sleeper:run")
        with server.client("frontier-admin", Role.ADMIN) as admin:
            _settled(admin, spec.min_count, 30.0)  # the floor's pods are up
            held0 = _held_unit_seconds(admin)
            sessions = _Sessions(server, scale, rec)
            [(caller, program)] = workload.programs(seed)
            sessions.spawn(caller, program)
            sessions.join()
            drained = _settled(admin, spec.min_count, spec.hold_s + spec.idle_timeout_s + 60.0)
            held = _held_unit_seconds(admin) - held0
    finally:
        server.stop()
        kill_pods(home)
    starts = [j["start_s"] for j in rec.jobs if j["start_s"] is not None]
    makespan = max(j["t1"] for j in rec.jobs) - min(j["t0"] for j in rec.jobs) if rec.jobs else 0.0
    peak = peak_concurrency([j["busy"] for j in rec.jobs if j["busy"] is not None])
    return {
        "jobs": len(rec.jobs),
        "failed": sum(1 for j in rec.jobs if j["state"] != "SUCCEEDED"),
        "makespan_s": makespan,
        "starts": starts,
        "paths": Counter(str(j["path"]) for j in rec.jobs),
        "held_pod_s": held,
        "always_on_s": peak * makespan,
        "drained": drained,
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per arm: medians over repeats of held / always-on and of the start percentiles."""
    out: dict[str, Any] = {}
    for arm, rs in runs.items():
        rel = [r["held_pod_s"] / r["always_on_s"] for r in rs if r["always_on_s"] > 0]
        paths: Counter[str] = Counter()
        for r in rs:
            paths.update(r["paths"])
        out[arm] = {
            "held_vs_always_on": float(np.median(rel)) if rel else None,
            "held_pod_s": float(np.median([r["held_pod_s"] for r in rs])),
            "start_p50_s": float(np.median([np.percentile(r["starts"], 50) for r in rs])),
            "start_p90_s": float(np.median([np.percentile(r["starts"], 90) for r in rs])),
            "jobs": sum(r["jobs"] for r in rs),
            "failed_jobs": sum(r["failed"] for r in rs),
            "paths": dict(sorted(paths.items())),
            "all_drained": all(r["drained"] for r in rs),
        }
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.frontier", description=__doc__,
                                formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("--arms", default="ka3,f1-c2-ka3,ka45",
                   help="simulator arm names, keep-alives in compressed seconds")  # fmt: skip
    p.add_argument(
        "--pattern",
        default="bursty",
        choices=("steady", "bursty", "diurnal"),
        help="session arrivals: constant, a quarter of each hour at 3.4x, or a sinusoid",
    )
    p.add_argument("--rate", type=float, default=0.02, help="sessions per (uncompressed) second")
    p.add_argument("--duration", type=float, default=3600.0, help="arrival window (uncompressed s)")
    p.add_argument("--callers", type=int, default=8, help="distinct callers the sessions belong to")
    p.add_argument("--scale", type=float, default=0.05, help="multiply every workload delay")
    p.add_argument("--repeats", type=int, default=2, help="repeats per arm, each on its own broker")
    p.add_argument(
        "--seed",
        type=int,
        default=1,
        help="first repeat's seed (repeat i: seed+i), as in the simulator",
    )
    add_log_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        arms = arm_names(args.arms)
        workload = Workload("sessions", pattern=args.pattern, rate=args.rate,
                            duration_s=args.duration, callers=args.callers)  # fmt: skip
    except ValueError as exc:
        p.error(str(exc))
    if not arms or args.repeats < 1 or not args.scale > 0:
        p.error("need an arm, --repeats >= 1 and a positive --scale")
    venue = load_venue("local")
    campaign = {"benchmark": "frontier", "arms": [a.name for a in arms],
                "pattern": args.pattern, "rate": args.rate, "duration": args.duration,
                "callers": args.callers, "scale": args.scale, "seed": args.seed,
                "venue": dataclasses.asdict(venue.pool)}  # fmt: skip
    log = open_log(p, args.log, campaign)
    done: dict[tuple[int, str], dict[str, Any]] = dict(log.done) if log else {}
    plan = [(r, arm.name) for r in range(args.repeats) for arm in arms]
    t0 = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="firepool-frontier-") as tmp,
        tqdm(total=len(plan), desc="frontier", unit="run", file=sys.stderr) as bar,
    ):
        todo = still_to_run(plan, log, bar)
        for r, name in todo:
            arm = next(a for a in arms if a.name == name)
            bar.set_postfix_str(f"repeat {r + 1} {name}")
            home = Path(tmp) / f"r{r}-{name}"
            run = run_arm(build_catalog(venue, arm), workload, args.seed + r, args.scale, home)
            if log is not None:
                log.add(r, name, run)
            done[(r, name)] = run
            bar.update()
            rel = run["held_pod_s"] / run["always_on_s"] if run["always_on_s"] else float("nan")
            bar.write(f"repeat {r + 1} {name}: {run['jobs']} jobs, held {rel:.2f}x "
                      f"always-on, {run['failed']} failed", file=sys.stderr)  # fmt: skip
    runs = {a.name: [done[(r, a.name)] for r in range(args.repeats)] for a in arms}
    out = {"arms": summarize(runs), "pattern": args.pattern, "rate": args.rate,
           "duration_s": args.duration, "callers": args.callers, "scale": args.scale,
           "repeats": args.repeats, "wall_s": time.perf_counter() - t0}  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for name, s in out["arms"].items():
            p50, p90 = s["start_p50_s"], s["start_p90_s"]
            print(f"{name:>14}: held {s['held_vs_always_on']:.2f}x always-on, start p50 "
                  f"{p50:.3f} s p90 {p90:.3f} s, {s['jobs']} jobs")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
