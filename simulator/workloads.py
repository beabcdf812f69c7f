"""Workloads as caller programs (paper §9, App. B.2): generators the event loop drives.

A caller program yields one command at a time:

* a ``float``: think for that many seconds;
* a ``Batch``: submit these jobs now and resume when *all* have completed (a barrier);
* a ``Spawn``: start another caller program now (open-loop session arrivals).

Job bodies are fixed durations drawn from the program's own random stream, seeded from the
repeat's seed and the caller, so every arm of a paired repeat sees the same bodies and pauses:
arms differ only in how pods are acquired.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass

Command = "float | Batch | Spawn"


@dataclass(frozen=True, slots=True)
class Batch:
    bodies: tuple[float, ...]
    env: int = 0
    """Environment (image) of these jobs; only the fragmentation study uses more than one."""
    slots: tuple[str, ...] = ()
    """Per job, the sub-caller that submits it (``<program's caller>/<slot>``); empty: the
    program's caller submits every job."""


@dataclass(frozen=True, slots=True)
class Spawn:
    caller: str
    program: Generator[object, None, None]


Program = Generator[object, None, None]


def stream(seed: int, *key: object) -> random.Random:
    """A random stream that depends only on the seed and the key (never on the arm)."""
    return random.Random(f"{seed}/" + "/".join(map(str, key)))


# -- the paper's loops ---------------------------------------------------------------------
def rl_trainer(
    rng: random.Random,
    iterations: int = 4,
    rollouts: int = 8,
    evals: int = 2,
    body: tuple[float, float] = (1.5, 4.0),
    think_s: float = 0.0,
    env: int = 0,
    per_slot: bool = False,
) -> Program:
    """W-RL: per iteration, ``rollouts`` parallel jobs, barrier, ``evals``, barrier, one update.

    One trainer submits every job; ``per_slot`` makes each slot (rollout worker ``k``,
    evaluator ``k``, the updater) its own caller instead."""
    lo, hi = body
    for it in range(iterations):
        for stage, n in (("rollout", rollouts), ("eval", evals), ("update", 1)):
            slots = tuple(f"{stage}{k}" for k in range(n)) if per_slot else ()
            yield Batch(tuple(rng.uniform(lo, hi) for _ in range(n)), env, slots)
        if think_s and it < iterations - 1:
            yield think_s


def agent(
    rng: random.Random,
    iterations: int = 3,
    calls: tuple[int, int] = (2, 4),
    body: tuple[float, float] = (0.5, 1.6),
    think: tuple[float, float] = (0.5, 2.0),
    between: tuple[float, float] = (2.0, 5.0),
    max_jobs: int | None = None,
    env: int = 0,
) -> Program:
    """W-Agent: ``iterations`` of 2-4 sequential tool calls, think pauses between calls and a
    longer pause between iterations. ``max_jobs`` stops after that many calls (standby
    benchmark: 30 sequential jobs, iterating as long as needed)."""
    done = 0
    it = 0
    while True:
        n = rng.randint(*calls)
        for call in range(n):
            yield Batch((rng.uniform(*body),), env)
            done += 1
            if max_jobs is not None and done >= max_jobs:
                return
            if call < n - 1:
                yield rng.uniform(*think)
        it += 1
        if max_jobs is None and it >= iterations:
            return
        yield rng.uniform(*between)


# -- open-loop arrivals (C.1 frontier, Figure 5) -------------------------------------------
def rate_fn(pattern: str, rate: float, period_s: float = 3600.0) -> Callable[[float], float]:
    """Session arrivals per second at time t: ``steady``, ``bursty`` (a quarter of each
    period at 3.4x the mean rate, the rest at 0.2x) or ``diurnal`` (a sinusoid, 0.1x-1.9x)."""
    if pattern == "steady":
        return lambda t: rate
    if pattern == "bursty":
        return lambda t: rate * (3.4 if (t % period_s) < period_s / 4 else 0.2)
    if pattern == "diurnal":
        return lambda t: rate * (1.0 - 0.9 * math.cos(2 * math.pi * t / period_s))
    raise ValueError(f"unknown arrival pattern {pattern!r} (steady, bursty, diurnal)")


def sessions(
    seed: int,
    pattern: str,
    rate: float,
    duration_s: float,
    make: Callable[[random.Random, int], Program],
    peak_factor: float = 3.4,
    prefix: str = "s",
    callers: int = 8,
) -> Program:
    """Spawn sessions as a non-homogeneous Poisson process (thinning). Session ``i`` belongs
    to caller ``i mod callers``: a fixed population of agents and trainers, each starting a
    session now and then (owner holds partition idle pods by caller, App. D)."""
    rng = stream(seed, "arrivals", pattern)
    lam = rate_fn(pattern, rate)
    top = rate * max(peak_factor, 1.9)
    t = 0.0
    i = 0
    while True:
        gap = rng.expovariate(top)
        if t + gap > duration_s:
            return
        t += gap
        yield gap
        if rng.random() * top <= lam(t):
            yield Spawn(f"{prefix}{i % callers}", make(stream(seed, prefix, i), i))
            i += 1


def zipf_env(rng: random.Random, envs: int, s: float = 1.0) -> int:
    """An environment index in ``[0, envs)`` with Zipf(s) popularity."""
    weights = [1.0 / (k + 1) ** s for k in range(envs)]
    return rng.choices(range(envs), weights)[0]
