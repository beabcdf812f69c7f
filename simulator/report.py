"""``firepool simulate --report DIR``: run every reproduced table and figure, write Markdown
tables, PNG plots (matplotlib, Agg backend) and ``results.json`` into DIR.

Everything printed comes from running the simulation now; nothing is copied from the paper
except the paper's own values, shown beside ours for comparison.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from simulator import acceptance, studies
from simulator.cli import _clean

PAPER_C1 = {  # held / always-on, from App. C.1 (for the comparison column only)
    ("steady", "ka15"): 0.435, ("steady", "ka60"): 0.571, ("steady", "ka120"): 0.679,
    ("steady", "ka300"): 0.916, ("steady", "ka900"): 1.543, ("steady", "fresh"): 1.347,
    ("bursty", "ka15"): 0.371, ("bursty", "ka60"): 0.476, ("bursty", "ka120"): 0.615,
    ("bursty", "ka300"): 0.849, ("bursty", "ka900"): 1.484, ("bursty", "fresh"): 0.646,
    ("diurnal", "ka15"): 0.486, ("diurnal", "ka60"): 0.606, ("diurnal", "ka120"): 0.659,
    ("diurnal", "ka300"): 0.860, ("diurnal", "ka900"): 1.124, ("diurnal", "fresh"): 1.543,
}  # fmt: skip


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _table(header: list[str], rows: list[list[object]]) -> str:
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _acceptance(out: Path, rows: list[dict[str, Any]]) -> str:
    body = _table(
        ["row", "role", "paper", "band", "tag_mode", "simulated", "95% CI", "in band",
         "with tag_mode retire", "carried over (95% CI)"],
        [[r["title"], r["role"], r["paper"], f"{r['band'][0]:.2f}-{r['band'][1]:.2f}",
          r["tag_mode"], r["speedup"], "{:.2f}-{:.2f}".format(*r["speedup_ci95"]),
          "yes" if r["within_band"] else "no",
          "-" if r["speedup_tag_mode_retire"] is None else r["speedup_tag_mode_retire"],
          "{:.3g} ({:.2f}-{:.2f})".format(r["speedup_carry_over"],
                                          *r["speedup_carry_over_ci95"])]
         for r in rows],
    )  # fmt: skip
    body += (
        "\nThe verdict is on runs from an empty pool. *Carried over*: the same campaign with "
        "every run on the pool the run before it left, as the paper's crossover ran it "
        "(`--carry-over`; across arms with different settings the broker restarts on the "
        "next arm's catalog).\n"
    )
    detail = []
    for r in rows:
        for name, s in r["result"]["arms"].items():
            detail.append([
                r["key"], name, s["makespan_median_s"], s["start_p50_s"], s["start_p90_s"],
                json.dumps(s["paths"]), s["handover_wait_median_s"],
                s["handovers_by_standby_frac"],
            ])  # fmt: skip
    body += "\n" + _table(
        ["row", "arm", "makespan (s)", "start p50", "start p90", "paths", "handover wait",
         "by standby"], detail)  # fmt: skip
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["paper"] for r in rows], 0.4, label="paper (measured)")
    ax.bar([x + 0.2 for x in xs], [r["speedup"] for r in rows], 0.4, label="simulated")
    for x, r in zip(xs, rows, strict=True):
        ax.plot([x - 0.4, x + 0.4], [r["band"][0]] * 2, "k:", lw=0.8)
        ax.plot([x - 0.4, x + 0.4], [r["band"][1]] * 2, "k:", lw=0.8)
    ax.set_xticks(list(xs), [r["key"] for r in rows], rotation=20, fontsize=7)
    ax.set_ylabel("loop speedup (x)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "table5_6_speedups.png", dpi=120)
    plt.close(fig)
    return body


def _sensitivity(rows: list[dict[str, Any]]) -> str:
    """Rows against one constant each, cold and carried over."""

    def pair(d: dict[str, float]) -> str:
        return " / ".join(f"{v:.3g}" for v in d.values())

    header = ["row", "setting", "carry-over", "speedup", "in band", "makespans (s)",
              "new pods", "start p90 (s)"]  # fmt: skip
    table = [
        [r["key"], f"{r['setting']}={r['value']}", "yes" if r["carry_over"] else "no",
         r["speedup"], "yes" if r["within_band"] else "no", pair(r["makespans_s"]),
         pair(r["new_pods"]), pair(r["start_p90_s"])]
        for r in rows
    ]  # fmt: skip
    return (
        "Rows against the one constant each rests on most (`--set`), from an "
        "empty pool and with `--carry-over`; every other constant as shipped. Arms in the "
        "row's order (reference first). The adopted venues are not changed by this table.\n\n"
        + _table(header, table)
    )


def _scorecard(card: dict[str, Any]) -> str:
    """Every per-arm number of Table 5 and Table 6 against its B.4 band."""
    ok, n = card["held_out_within_band"], card["held_out"]
    paper_ok, paper_n = card["paper_simulator"]
    metrics = [
        [m["row"], m["arm"], m["metric"], m["paper"], m["simulated"], m["ratio"],
         "{:.2f}-{:.2f}".format(*m["band"]), "fitted" if m["fitted"] else "held out",
         "yes" if m["within_band"] else "no"]
        for m in card["metrics"]
    ]  # fmt: skip
    checks = [
        [c["row"], "yes" if c["ranking_kept"] else "no", c["p50_diff_s"],
         "-" if c["paper_p50_diff_s"] is None else c["paper_p50_diff_s"],
         "-" if c["sign_kept"] is None else "yes" if c["sign_kept"] else "no"]
        for c in card["checks"]
    ]  # fmt: skip
    metric_header = ["row", "arm", "metric", "paper", "simulated", "ratio", "band", "role",
                     "in band"]  # fmt: skip
    check_header = ["row", "reference arm's loop shorter", "paired start p50 diff (s)",
                    "paper", "same sign"]  # fmt: skip
    return (
        f"**{ok} of {n} held-out metrics within band ({100 * ok / n:.0f}%)**; the paper's own "
        f"simulator: {paper_ok} of {paper_n} ({100 * paper_ok / paper_n:.0f}%, B.4). Start "
        "p50 and handover wait are queue medians (band x0.69-1.44), makespans x0.76-1.31; "
        "p90s have no band in B.4 and are not counted.\n\n"
        + _table(metric_header, metrics)
        + "\nB.4 also asks that arms keep their ranking and effects their sign:\n\n"
        + _table(check_header, checks)
    )


def _frontier(out: Path, rows: list[dict[str, Any]], grid: list[dict[str, Any]]) -> str:
    body = _table(
        ["pattern", "arm", "held / always-on", "paper", "Δp50 (s)", "p90 (s)", "peak"],
        [[r["pattern"], r["arm"], r["held_rel"], PAPER_C1.get((r["pattern"], r["arm"]), "-"),
          r["dp50_s"], r["p90_s"], r["peak"]] for r in rows],
    )  # fmt: skip
    body += "\nFloor x idle-cap x keep-alive grid (bursty):\n\n" + _table(
        ["arm", "held / always-on", "Δp50 (s)", "p90 (s)"],
        [[r["arm"], r["held_rel"], r["dp50_s"], r["p90_s"]] for r in grid],
    )
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for r in grid:
        ax.scatter(r["held_rel"], max(r["p50_s"], 1e-3), c="tab:gray", s=12)
    for r in rows:
        if r["pattern"] == "bursty":
            ax.scatter(r["held_rel"], max(r["p50_s"], 1e-3), s=30)
            ax.annotate(r["arm"], (r["held_rel"], r["p50_s"]), fontsize=7)
    ax.axvspan(0.0, 1.0, alpha=0.05)
    ax.axvline(1.0, color="k", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("held pod-time / always-on pool at peak")
    ax.set_ylabel("start latency p50 (s)")
    ax.set_title("Figure 6b (simulated, 22 s pod start, bursty)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "fig6b_frontier.png", dpi=120)
    plt.close(fig)
    return body


def _fig7(out: Path, rows: list[dict[str, Any]], event: list[dict[str, Any]]) -> str:
    """The tick-dispatched sweep (adopted) with every think time; the event-dispatched one
    (no think time) dashed beside it, as a sensitivity."""
    cross = {w: studies.crossover(rows, w) for w in ("w-rl", "w-agent")}
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, kind in zip(axes, ("w-rl", "w-agent"), strict=True):
        for think in sorted({r["think_s"] for r in rows}):
            pts = sorted((r["body_s"], r["speedup"], r["lo"], r["hi"]) for r in rows
                         if r["workload"] == kind and r["think_s"] == think)  # fmt: skip
            xs = [p[0] for p in pts]
            ax.plot(xs, [p[1] for p in pts], marker=".", label=f"think {think:g} s")
            ax.fill_between(xs, [p[2] for p in pts], [p[3] for p in pts], alpha=0.15)
        dashed = sorted((r["body_s"], r["speedup"]) for r in event if r["workload"] == kind)
        ax.plot([x for x, _ in dashed], [y for _, y in dashed], color="k", ls="--", lw=0.8,
                label="think 0 s, event dispatch")  # fmt: skip
        ax.axhline(1.1, color="k", lw=0.6, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("job body length L (s)")
        ax.set_title(f"{kind}: crossover < 1.1x at {cross[kind] or float('nan'):.0f} s", fontsize=9)
    axes[0].set_ylabel("makespan Reuse Off / Reuse On")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "fig7_speedup_vs_body.png", dpi=120)
    plt.close(fig)

    def summary(sweep: list[dict[str, Any]]) -> str:
        at = {w: studies.crossover(sweep, w) for w in ("w-rl", "w-agent")}
        short = {w: [round(r["speedup"], 2) for r in sweep if r["workload"] == w
                     and r["think_s"] == 0 and r["body_s"] <= 2] for w in at}  # fmt: skip
        return (
            f"crossover (speedup < 1.1x, no think time) RL {_s(at['w-rl'])} s (paper ~196 s), "
            f"agent {_s(at['w-agent'])} s (paper ~104 s); at 1-2 s bodies RL {short['w-rl']} "
            f"(paper sweep 4.1-4.3x), agent {short['w-agent']} (paper 1.6-2.0x)"
        )

    return (
        f"Tick-driven dispatcher (adopted, as Table 5's Reuse Off columns): {summary(rows)}.\n\n"
        f"Event-driven dispatcher of §3 (sensitivity; the paper does not say which its sweep "
        f"ran): {summary(event)}.\n\n"
        + _table(
            ["workload", "think (s)", "body (s)", "speedup", "min", "max"],
            [
                [r["workload"], r["think_s"], r["body_s"], r["speedup"], r["lo"], r["hi"]]
                for r in rows
            ],
        )
    )


def _s(x: float | None) -> str:
    return "none" if x is None else f"{x:.0f}"


def _fig5_table(rows: list[dict[str, Any]]) -> str:
    return _table(["workload", "E", "arm", "warm-or-standby hit rate", "held / always-on",
                   "p90 start (s)"],
                  [[r["workload"], r["envs"], r["arm"], r["hit_rate"], r["held_rel"],
                    r["p90_s"]] for r in rows])  # fmt: skip


def _fig5(out: Path, rows: list[dict[str, Any]], by_caller: list[dict[str, Any]]) -> str:
    plt = _plt()
    fig, axes = plt.subplots(2, 3, figsize=(10, 5.5))
    for i, kind in enumerate(("rl-sessions", "sessions")):
        for arm in ("shared", "per-env", "per-env-split"):
            pts = sorted((r["envs"], r) for r in rows if r["workload"] == kind and r["arm"] == arm)
            xs = [p[0] for p in pts]
            for j, key in enumerate(("hit_rate", "held_rel", "p90_s")):
                axes[i][j].plot(xs, [p[1][key] for p in pts], marker="o", label=arm)
                axes[i][j].set_xscale("log", base=2)
                axes[i][j].set_title(f"{kind}: {key}", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "fig5_fragmentation.png", dpi=120)
    plt.close(fig)
    return (
        "One caller's sessions over E environments (paper, RL rollouts at E = 64: shared pool "
        "1.06x the always-on pool, a pool per environment 2.15x with its hit rate falling "
        "0.85 -> 0.68, the split budget pushing p90 start to 400 s). RL sessions arrive at "
        "0.05/s, calibrated on that 400 s (the paper gives no rate); agent sessions at "
        "0.1/s.\n\n"
        + _fig5_table(rows)
        + "\nThe same with 8 callers: owner-only reuse also splits the shared pool by caller.\n\n"
        + _fig5_table(by_caller)
    )


class _Bar(tqdm):
    """No monitor thread: ``run_many`` forks its workers only while this process has one
    thread (a fork copies no other thread), so a live monitor would make the report serial."""

    monitor_interval = 0


def report_dir(directory: str) -> Path:
    """Make ``directory`` (and its parents) for a report. Raises ``ValueError`` naming it if
    it cannot be made or written, so a bad ``--report`` fails before a minute of studies."""
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--report {directory}: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK):
        raise ValueError(f"--report {directory}: not writable")
    return out


def write_report(
    directory: str, quick: bool = False, seed: int = 1, workers: int = 1, progress: bool = True
) -> int:
    """Run every study into ``directory``; ``progress`` draws a bar on stderr, one step per
    acceptance row, sensitivity study and figure (about a minute in all on 2 cores)."""
    out = report_dir(directory)
    t0 = time.perf_counter()
    repeats = 3 if quick else 10
    seeds = 1 if quick else 3
    grid_arms = [f"f{f}-c{c}-ka{k}" for f in (0, 1, 4) for c in (0, 2) for k in (60, 300)]
    steps: list[tuple[str, Callable[[], Any]]] = [
        *((row.key, partial(acceptance.run_row, row, repeats, seed, workers=workers))
          for row in acceptance.ROWS),
        *((f"{key} x {setting}",
           partial(acceptance.sensitivity, key, setting, values, repeats, seed, workers))
          for key, setting, values in acceptance.SENSITIVITY),
        ("C.1 frontier", partial(studies.frontier, seeds=seeds, workers=workers)),
        ("C.1 grid", partial(studies.frontier, arms=grid_arms, patterns=("bursty",), seeds=1,
                             workers=workers)),
        ("Figure 7", partial(studies.speedup_sweep, replicates=1 if quick else 3,
                             workers=workers)),
        ("Figure 7, event dispatch", partial(studies.speedup_sweep, thinks=(0,),
                                             replicates=1 if quick else 3, workers=workers,
                                             dispatch="event")),
        ("Figure 5", partial(studies.fragmentation, seeds=seeds,
                             envs=(1, 4, 16, 64) if not quick else (1, 64), workers=workers)),
        ("Figure 5, 8 callers", partial(studies.fragmentation, seeds=seeds, envs=(1, 64),
                                        callers=8, workers=workers)),
    ]  # fmt: skip
    done: list[Any] = []
    with _Bar(total=len(steps), desc="report", unit="step", file=sys.stderr,
              disable=not progress) as bar:  # fmt: skip
        for name, step in steps:
            bar.set_postfix_str(name)
            done.append(step())
            bar.update()
    rows = len(acceptance.ROWS)
    acc: list[dict[str, Any]] = done[:rows]
    sens = [r for study in done[rows : rows + len(acceptance.SENSITIVITY)] for r in study]
    c1, grid, fig7, fig7_event, fig5, fig5_callers = done[rows + len(acceptance.SENSITIVITY) :]
    jobs = sum(int(r["result"]["simulated_jobs"]) for r in acc)
    acc_wall = sum(float(r["result"]["wall_s"]) for r in acc)
    card = acceptance.scorecard(acc)
    wall = time.perf_counter() - t0
    md = [
        "# Simulated reproduction of the Firepool paper\n",
        f"Wall time {wall:.0f} s; acceptance campaigns simulated {jobs} jobs at "
        f"{jobs / acc_wall:.0f} jobs/s ({workers} worker processes). Repeats per arm: "
        f"{repeats}; seeds per cell: {seeds}.\n",
        "## Table 5 / Table 6: loop speedups (band = paper x0.76-1.31)\n",
        _acceptance(out, acc),
        "![speedups](table5_6_speedups.png)\n",
        "### Every per-arm metric against the paper's own standard (B.4)\n",
        _scorecard(card),
        "### Sensitivity to one constant\n",
        _sensitivity(sens),
        "## App. C.1 / Figure 6b: held capacity vs start latency\n",
        _frontier(out, c1, grid),
        "![frontier](fig6b_frontier.png)\n",
        "## Figure 7: speedup against job length and think time\n",
        _fig7(out, fig7, fig7_event),
        "![fig7](fig7_speedup_vs_body.png)\n",
        "## Figure 5: environment fragmentation\n",
        _fig5(out, fig5, fig5_callers),
        "![fig5](fig5_fragmentation.png)\n",
    ]
    (out / "README.md").write_text("\n".join(md))
    results = {"wall_s": wall, "acceptance": acc, "scorecard": card, "sensitivity": sens,
               "c1": c1, "grid": grid, "fig7": fig7, "fig7_event": fig7_event, "fig5": fig5,
               "fig5_8_callers": fig5_callers}  # fmt: skip
    (out / "results.json").write_text(json.dumps(_clean(results), indent=1))
    print(f"report written to {out} in {wall:.0f} s")
    for r in acc:
        verdict = "in" if r["within_band"] else "OUT"
        print(f"  {r['key']:18s} {r['speedup']:6.2f}x (paper {r['paper']}x, band "
              f"{r['band'][0]:.2f}-{r['band'][1]:.2f}): {verdict}")  # fmt: skip
    print(f"  held-out metrics within band: {card['held_out_within_band']} of "
          f"{card['held_out']} (the paper's simulator: {card['paper_simulator'][0]} of "
          f"{card['paper_simulator'][1]})")  # fmt: skip
    return 0
