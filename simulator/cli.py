"""``firepool simulate``: paired simulated repeats, the paper reproduction, venue calibration:

    firepool simulate --venue h200 --workload w-agent --arms reuse-on,reuse-off,fresh --json
    firepool simulate --report DIR          # every table and figure reproduced, with plots
    firepool simulate calibrate [--out F]   # measure the local venue on this machine

Every flag below is checked (exit 2 naming it); docs/simulator.md has the details.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from functions.errors import FirepoolError
from pool_manager.catalog import TAG_MODES
from simulator.arms import arm_names
from simulator.experiment import (
    WORKLOADS,
    Workload,
    report,
    run_arms,
    with_dispatch,
)
from simulator.venue import load_venue, venue_names, with_settings


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default after its help."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="firepool simulate", description=__doc__,
                                formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument(
        "--venue",
        default="h200",
        help=f"one of {', '.join(venue_names())}, or a venue YAML file (docs/simulator.md)",
    )
    p.add_argument(
        "--workload",
        default="w-agent",
        choices=WORKLOADS,
        help="the paper's agent or RL loop, the standby benchmark (one caller's sequential "
        "jobs), or open-loop agent or RL sessions (--pattern, --rate, --duration, --envs)",
    )
    p.add_argument(
        "--arms",
        default="reuse-on,reuse-off,fresh",
        help="comma-separated; the first is the reference for paired effects. reuse-on, "
        "reuse-off, fresh, standby-on, standby-off, shared, per-env, per-env-split, "
        "ka<keep-alive s>, f<floor>-c<idle cap>-ka<keep-alive s>",
    )
    p.add_argument("--repeats", type=int, default=10, help="paired repeats per arm")
    p.add_argument("--seed", type=int, default=1, help="first repeat's seed (repeat i: seed+i)")
    p.add_argument("--agents", type=int, default=4, help="W-Agent concurrent agents")
    p.add_argument("--jobs", type=int, default=30, help="standby benchmark: sequential jobs")
    p.add_argument(
        "--dispatch",
        choices=("event", "tick"),
        default=None,
        help="override the venue's dispatcher mode",
    )
    p.add_argument(
        "--tag-mode",
        choices=TAG_MODES,
        default=None,
        help="override the pool's tag_mode (switch: the paper's earlier Reuse Off rule)",
    )
    p.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override a venue constant for a sensitivity run, e.g. job_overhead=0, "
        "termination=45/60 (median/p90), start_phases.agent_ready=3, pool.idle_timeout_s=60; "
        "repeatable",
    )
    p.add_argument("--body", type=float, default=None, help="fixed job body length (s)")
    p.add_argument("--think", type=float, default=None, help="fixed think time (s)")
    p.add_argument(
        "--pattern",
        default="steady",
        choices=("steady", "bursty", "diurnal"),
        help="session arrivals: constant, a quarter of each hour at 3.4x, or a sinusoid",
    )
    p.add_argument("--rate", type=float, default=0.02, help="session arrivals per second")
    p.add_argument("--duration", type=float, default=7200.0, help="arrival window (s)")
    p.add_argument("--envs", type=int, default=1, help="distinct environments (Zipf s=1)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply bodies and pauses")
    p.add_argument(
        "--carry-over",
        action="store_true",
        help="start each run on the pool the previous run (any arm) left, as the paper's "
        "crossover campaigns did (between arms with other pool settings the broker restarts "
        "on the next arm's catalog); arms must have the same pools",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes running independent runs (results do not depend on it); "
        "default: one per CPU",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--report",
        metavar="DIR",
        default=None,
        help="run the paper reproduction and write Markdown + PNG into DIR",
    )
    p.add_argument("--quick", action="store_true", help="--report with fewer repeats")
    return p  # fmt: skip


def _clean(obj: Any) -> Any:
    """JSON without NaN: ``null`` instead."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]  # ``firepool simulate -- --venue ...``
    if argv and argv[0] == "calibrate":
        from simulator.calibrate import main as calibrate_main

        return calibrate_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.report is not None:
        from simulator.report import report_dir, write_report

        try:
            report_dir(args.report)
        except ValueError as exc:  # a DIR that cannot be made or written
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return write_report(args.report, quick=args.quick, seed=args.seed, workers=args.workers)
    try:
        venue = with_dispatch(load_venue(args.venue), args.dispatch)
        if args.tag_mode is not None:
            venue = venue.with_pool(tag_mode=args.tag_mode)
        venue = with_settings(venue, args.set)
        arms = arm_names(args.arms)
    except (ValueError, FirepoolError) as exc:  # a bad flag or venue value
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not arms or args.repeats < 1 or args.workers < 1:
        print("error: need at least one arm, one repeat and one worker", file=sys.stderr)
        return 2
    try:
        workload = Workload(
            args.workload, agents=args.agents, body_s=args.body, think_s=args.think,
            pattern=args.pattern, rate=args.rate, duration_s=args.duration, envs=args.envs,
            jobs=args.jobs, scale=args.scale, carry_over=args.carry_over,
        )  # fmt: skip
        results, jobs, wall = run_arms(
            venue, workload, arms, args.repeats, args.seed, workers=args.workers
        )
    except (ValueError, FirepoolError) as exc:  # a bad flag or venue value
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # a run that cannot finish (e.g. a pool with no ceiling)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = _clean(report(venue, workload, results, jobs, wall))
    out["workers"] = args.workers
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{venue.name} / {workload.name}: {args.repeats} paired repeats, "
          f"{jobs} jobs in {wall:.2f} s ({out['simulated_jobs_per_s']:.0f} jobs/s)")  # fmt: skip
    for name, s in out["arms"].items():
        line = (
            f"  {name:>12}: makespan {s['makespan_median_s']:.1f} s, start p50 "
            f"{s['start_p50_s']:.2f} s p90 {s['start_p90_s']:.2f} s, paths {s['paths']}"
        )
        for key, eff in s.items():
            if key.startswith("vs_"):
                line += f", {eff['speedup']:.2f}x {key}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
