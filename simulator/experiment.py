"""Paired repeats of several arms on one venue and workload, summarised as the CLI's JSON.

Repeat ``r`` of every arm uses seed ``seed + r`` for the workload's bodies and pauses, so arms
are paired (App. B.4). Arms run in a rotated order per repeat (the Williams AB/BA sequence for
two). By default each run starts from an empty pool; ``Workload.carry_over`` instead starts
each run on the pool the previous run left, the carry-over the paper's crossover balanced.
"""

from __future__ import annotations

import fcntl
import math
import os
import pickle
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from simulator.arms import Arm, build_catalog
from simulator.engine import Simulation
from simulator.metrics import RunMetrics, arm_summary, paired, summarize
from simulator.venue import Venue
from simulator.workloads import Program, agent, rl_trainer, sessions, stream, zipf_env

WORKLOADS = ("w-agent", "w-rl", "standby", "sessions", "rl-sessions")


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    agents: int = 4
    body_s: float | None = None
    """Fixed job body length (Figure 7); ``None``: the paper's ranges."""
    think_s: float | None = None
    """Fixed think time between calls and iterations; ``None``: the paper's ranges."""
    pattern: str = "steady"
    rate: float = 0.02
    """Session arrivals per second (``sessions``, ``rl-sessions``)."""
    duration_s: float = 7200.0
    envs: int = 1
    jobs: int = 30
    """Sequential jobs of the standby benchmark."""
    callers: int = 8
    """Distinct callers the sessions of ``sessions`` / ``rl-sessions`` belong to."""
    carry_over: bool = False
    """Run the campaign as the paper did (App. B.4): every run starts on the pool the run
    before it left (whichever arm that was, in the crossover order), after a pause of
    ``gap_s``; the campaign's first run starts on what its repeat's last arm leaves. Needs
    arms with the same pools; their settings may differ (``Simulation.reconfigure``).
    ``False``: every run starts on an empty pool."""
    gap_s: float = 10.0
    scale: float = 1.0
    """Multiply every body and pause (``benchmarks.loops --scale`` does the same)."""

    def __post_init__(self) -> None:
        """Raises ``ValueError`` naming the first field out of range (the CLI exits 2 on it):
        a negative body or pause, or no agents, would otherwise simulate quietly."""
        if self.name not in WORKLOADS:
            raise ValueError(f"unknown workload {self.name!r}; known: {', '.join(WORKLOADS)}")
        at_least_one = {"agents": self.agents, "envs": self.envs, "jobs": self.jobs,
                        "callers": self.callers}  # fmt: skip
        for field, count in at_least_one.items():
            if count < 1:
                raise ValueError(f"{field} must be at least 1, not {count}")
        positive = {"rate": self.rate, "duration_s": self.duration_s, "scale": self.scale}
        non_negative = {"body_s": self.body_s, "think_s": self.think_s, "gap_s": self.gap_s}
        for field, value in {**positive, **non_negative}.items():
            if value is None:
                continue
            low_ok = value > 0 if field in positive else value >= 0
            if not (low_ok and math.isfinite(value)):
                kind = "positive" if field in positive else "zero or more"
                raise ValueError(f"{field} must be finite and {kind}, not {value:g}")

    def programs(self, seed: int) -> list[tuple[str, Program]]:
        body = None if self.body_s is None else (self.body_s, self.body_s)
        think = None if self.think_s is None else (self.think_s, self.think_s)
        akw: dict[str, object] = {}
        if body is not None:
            akw["body"] = body
        if think is not None:
            akw["think"] = think
            akw["between"] = think
        if self.name == "w-agent":
            return [(f"agent{i}", agent(stream(seed, "agent", i), **akw))  # type: ignore[arg-type]
                    for i in range(self.agents)]  # fmt: skip
        if self.name == "w-rl":
            rkw: dict[str, object] = {} if body is None else {"body": body}
            if self.think_s:
                rkw["think_s"] = self.think_s
            return [("trainer", rl_trainer(stream(seed, "rl"), **rkw))]  # type: ignore[arg-type]
        if self.name == "standby":
            return [("caller", agent(stream(seed, "standby"), max_jobs=self.jobs, **akw))]  # type: ignore[arg-type]
        if self.name in ("sessions", "rl-sessions"):
            arrivals = sessions(
                seed, self.pattern, self.rate, self.duration_s, self._session,
                prefix="s", callers=self.callers,
            )  # fmt: skip
            return [("arrivals", arrivals)]
        raise ValueError(f"unknown workload {self.name!r}; known: {', '.join(WORKLOADS)}")

    def _session(self, rng: object, i: int) -> Program:
        import random

        assert isinstance(rng, random.Random)
        env = zipf_env(rng, self.envs) if self.envs > 1 else 0
        if self.name == "rl-sessions":
            return _with_env(rl_trainer(rng, iterations=4), env)
        return agent(rng, env=env)


def _after(delay: float, program: Program) -> Program:
    yield delay
    yield from program


def _with_env(program: Program, env: int) -> Program:
    from simulator.workloads import Batch

    for cmd in program:
        yield Batch(cmd.bodies, env, cmd.slots) if isinstance(cmd, Batch) else cmd


@dataclass(slots=True)
class ArmRuns:
    arm: Arm
    runs: list[RunMetrics]


def run_once(
    venue: Venue, arm: Arm, workload: Workload, seed: int, before: tuple[Arm, int] | None = None
) -> tuple[RunMetrics, int]:
    """One run. ``before``: the arm and seed of the run that ran on this pool just before
    (``Workload.carry_over``); what it measured is discarded."""
    if before is not None:
        prev_arm, prev_seed = before
        sim = Simulation(venue, prev_arm, seed, envs=workload.envs, scale=workload.scale)
        sim.warm_up(workload.programs(prev_seed))
        sim.reconfigure(arm)
        for caller, program in workload.programs(seed):
            sim.add(caller, _after(workload.gap_s, program))
    else:
        sim = Simulation(venue, arm, seed, envs=workload.envs, scale=workload.scale)
        for caller, program in workload.programs(seed):
            sim.add(caller, program)
    result = sim.run()
    return summarize(result), len(result.jobs)


Task = tuple[Venue, Arm, Workload, int, tuple[Arm, int] | None]
"""The arguments of one ``run_once``."""


def _run_task(task: Task) -> tuple[RunMetrics, int]:
    return run_once(*task)


def run_many(tasks: Sequence[Task], workers: int = 1) -> list[tuple[RunMetrics, int]]:
    """``run_once`` over ``tasks``, results in task order. ``workers`` > 1 runs them in that
    many processes, this one and ``workers - 1`` forked children (only from a
    single-threaded process); each run depends only on its own arguments, so the results are
    the same either way."""
    workers = max(1, min(workers, len(tasks)))
    if workers == 1 or threading.active_count() > 1 or not hasattr(os, "memfd_create"):
        # Forking a multi-threaded process can deadlock a child on a lock some other thread
        # held (Python 3.12+ warns), and the shared counter needs Linux's memfd; the results
        # are the same in one process.
        return [_run_task(task) for task in tasks]  # not ``map``: a StopIteration would end it
    return _run_forked(tasks, workers)


def _run_forked(tasks: Sequence[Task], workers: int) -> list[tuple[RunMetrics, int]]:
    """This process and ``workers - 1`` forked children each take the next task from one
    shared counter until none is left (so a core another program slows takes fewer), and
    each child sends its ``(index, result)`` pairs back through a pipe once, at its end.

    A fork costs well under a millisecond here, where a ``multiprocessing.Pool`` of the same
    size costs ~11 ms (new interpreters' handler threads, every task pickled) and importing
    ``multiprocessing``'s locks ~8 ms, against ~100 ms for a campaign of small runs.
    Children inherit the tasks, so only results are pickled."""
    counter = _Counter()
    children: list[tuple[int, int]] = []  # (pid, read end of its pipe)
    try:
        for _ in range(workers - 1):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: run a share, send it, exit without the parent's cleanup
                os.close(read)
                code = 1
                try:
                    payload: object = _share(tasks, counter)
                except BaseException as exc:  # re-raised in the parent
                    payload = exc
                try:
                    with os.fdopen(write, "wb") as pipe:
                        try:
                            pickle.dump(payload, pipe, pickle.HIGHEST_PROTOCOL)
                        except pickle.PicklingError:  # an exception that does not pickle
                            pickle.dump(RuntimeError(repr(payload)), pipe)
                    code = 0
                finally:
                    os._exit(code)
            os.close(write)
            children.append((pid, read))
        results = dict(_share(tasks, counter))
        for _, read in children:
            with os.fdopen(read, "rb", closefd=False) as pipe:
                data = pipe.read()
            got = pickle.loads(data) if data else RuntimeError("a worker process died")
            if isinstance(got, BaseException):
                raise got
            results.update(got)
        return [results[i] for i in range(len(tasks))]
    finally:
        counter.skip_to(len(tasks))  # after an error: the children take no further task
        for pid, read in children:
            os.close(read)
            os.waitpid(pid, 0)
        counter.close()


class _Counter:
    """A task counter shared by forked processes: an 8-byte anonymous file, incremented
    under a POSIX record lock (held per process, so a fork does not share it)."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("run_many", os.MFD_CLOEXEC)
        os.pwrite(self.fd, bytes(8), 0)

    def take(self) -> int:
        """The next index, each handed to exactly one process."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        try:
            i = int.from_bytes(os.pread(self.fd, 8, 0), "little")
            os.pwrite(self.fd, (i + 1).to_bytes(8, "little"), 0)
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)
        return i

    def skip_to(self, n: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        try:
            os.pwrite(self.fd, n.to_bytes(8, "little"), 0)
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)


def _share(tasks: Sequence[Task], counter: _Counter) -> list[tuple[int, tuple[RunMetrics, int]]]:
    """Run the next task no process has taken, until none is left."""
    out = []
    while (i := counter.take()) < len(tasks):
        out.append((i, _run_task(tasks[i])))
    return out


def run_arms(
    venue: Venue,
    workload: Workload,
    arms: Sequence[Arm],
    repeats: int,
    seed: int = 1,
    workers: int = 1,
) -> tuple[list[ArmRuns], int, float]:
    """Every arm ``repeats`` times, in a rotated order per repeat (for two arms the
    Williams AB/BA sequence); returns the runs, jobs simulated and wall seconds.

    ``workers`` > 1 runs the independent runs in that many processes (``run_many``); every
    run is a function of its arm, seed and predecessor only, so the results are identical."""
    catalogs = [build_catalog(venue, a, workload.envs) for a in arms] if workload.carry_over else []
    if any(c.pools.keys() != catalogs[0].pools.keys() for c in catalogs):
        names = ", ".join(a.name for a in arms)
        raise ValueError(f"carry-over needs arms with the same pools, not {names}")
    out = [ArmRuns(a, []) for a in arms]
    sequence: list[tuple[int, int]] = []  # (arm, seed) in run order
    for r in range(repeats):
        order = list(range(len(arms)))
        sequence += [(i, seed + r) for i in order[r % len(order) :] + order[: r % len(order)]]
    tasks: list[Task] = []
    for k, (i, run_seed) in enumerate(sequence):
        before = None
        if workload.carry_over:
            j, prev_seed = sequence[k - 1] if k else sequence[len(arms) - 1]
            before = (arms[j], prev_seed)
        tasks.append((venue, arms[i], workload, run_seed, before))
    jobs = 0
    t0 = time.perf_counter()
    for (i, _), (metrics, n) in zip(sequence, run_many(tasks, workers), strict=True):
        out[i].runs.append(metrics)
        jobs += n
    return out, jobs, time.perf_counter() - t0


def report(venue: Venue, workload: Workload, results: Sequence[ArmRuns], jobs: int,
           wall_s: float) -> dict[str, Any]:  # fmt: skip
    """The ``--json`` object: per arm, and each arm paired against the first."""
    arms: dict[str, Any] = {}
    ref = results[0]
    for ar in results:
        summary = arm_summary(ar.runs)
        if ar is not ref:
            summary["vs_" + ref.arm.name] = paired(ref.runs, ar.runs)
        arms[ar.arm.name] = summary
    return {
        "venue": venue.name,
        "dispatch_mode": venue.dispatch_mode,
        "workload": workload.name,
        "agents": workload.agents if workload.name == "w-agent" else None,
        "arms": arms,
        "simulated_jobs": jobs,
        "wall_s": wall_s,
        "simulated_jobs_per_s": jobs / wall_s if wall_s > 0 else float("inf"),
    }


def with_dispatch(venue: Venue, mode: str | None) -> Venue:
    return venue if mode is None else replace(venue, dispatch_mode=mode)
