"""A/B of the no-loss benchmarks between two checkouts, run alternately in one sitting.

The machine is shared and drifts (2x within a day), so a number is only worth comparing with
one measured beside it: each round runs every benchmark in checkout A, then in checkout B
(the next round B first), and the report gives each side's median and the ratio B/A.

    python -m benchmarks.ab --a /tmp/base --b . --rounds 3 --json

Each checkout runs its own code with its own interpreter (``DIR/.venv/bin/python``, made by
``make venv`` there). The benchmarks and the figure each one is judged by:

- ``invoke``: ``warm_p50_ms``, a warm no-op sync call over real HTTP (lower is better);
- ``tracker``: ``claims_per_cpu_s``, claim/release cycles per CPU-second (higher is better);
- ``dispatch``: ``jobs_per_s`` on SQLite, submit to finish through the store (higher is better).

``within`` says whether B is no worse than A by more than ``--tolerance`` (5%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.args import positive_int


@dataclass(frozen=True)
class Bench:
    name: str
    argv: tuple[str, ...]
    figure: str
    higher_is_better: bool


BENCHES = (
    Bench("invoke", ("-m", "benchmarks.invoke", "--json"), "warm_p50_ms", False),
    Bench("tracker", ("-m", "benchmarks.tracker", "--json"), "claims_per_cpu_s", True),
    Bench(
        "dispatch", ("-m", "benchmarks.dispatch", "--store", "sqlite", "--json"), "jobs_per_s", True
    ),
)


def run_one(tree: Path, bench: Bench, timeout_s: float) -> float:
    """One run of ``bench`` in ``tree``: its figure, from the last line it prints."""
    python = tree / ".venv" / "bin" / "python"
    done = subprocess.run(
        [str(python), *bench.argv],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{bench.name} in {tree} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    return float(json.loads(done.stdout.strip().splitlines()[-1])[bench.figure])


def compare(
    a: Path, b: Path, benches: list[Bench], rounds: int, tolerance: float, timeout_s: float
) -> dict[str, Any]:
    runs: dict[str, dict[str, list[float]]] = {x.name: {"a": [], "b": []} for x in benches}
    with tqdm(total=rounds * 2 * len(benches), desc="A/B", file=sys.stderr) as bar:
        for r in range(rounds):
            order = [("a", a), ("b", b)] if r % 2 == 0 else [("b", b), ("a", a)]
            for bench in benches:
                for side, tree in order:
                    bar.set_postfix_str(f"{bench.name} {side}")
                    runs[bench.name][side].append(run_one(tree, bench, timeout_s))
                    bar.update()
    report: dict[str, Any] = {"a": str(a), "b": str(b), "rounds": rounds}
    for bench in benches:
        med_a = statistics.median(runs[bench.name]["a"])
        med_b = statistics.median(runs[bench.name]["b"])
        ratio = med_b / med_a if med_a else float("inf")
        worse = (1 / ratio if ratio else float("inf")) if bench.higher_is_better else ratio
        report[bench.name] = {
            "figure": bench.figure,
            "higher_is_better": bench.higher_is_better,
            "a_runs": runs[bench.name]["a"],
            "b_runs": runs[bench.name]["b"],
            "a_median": med_a,
            "b_median": med_b,
            "ratio_b_over_a": round(ratio, 4),
            "within": worse <= 1 + tolerance,
        }
    return report


def checkout(text: str) -> Path:
    tree = Path(text).resolve()
    if not (tree / ".venv" / "bin" / "python").is_file():
        raise argparse.ArgumentTypeError(f"{tree} has no .venv/bin/python: run `make venv` there")
    return tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=checkout, required=True, help="the reference checkout")
    parser.add_argument("--b", type=checkout, default=checkout("."), help="the one measured")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument(
        "--only", choices=[x.name for x in BENCHES], action="append", help="these benchmarks"
    )
    parser.add_argument("--tolerance", type=float, default=0.05, help="allowed loss (0.05: 5%%)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    benches = [x for x in BENCHES if not args.only or x.name in args.only]
    report = compare(args.a, args.b, benches, args.rounds, args.tolerance, args.timeout)
    if args.json:
        print(json.dumps(report))
    else:
        for bench in benches:
            row = report[bench.name]
            print(
                f"{bench.name:>9} {row['figure']}: A {row['a_median']:.4g}  B "
                f"{row['b_median']:.4g}  B/A {row['ratio_b_over_a']:.3f}  "
                f"{'ok' if row['within'] else 'LOSS'}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
