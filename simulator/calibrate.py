"""``firepool simulate calibrate``: measure the ``local`` venue on this machine.

Starts real local pods (``pool_manager.backends.local``) and times create -> agent healthy
(``GET /healthz`` over the pod's socket), one at a time and several at once (contention), and
delete -> every process gone (termination). Writes the medians and p90s into the venue YAML,
keeping every other constant of the file. The broker's own costs (dispatch, hand-off, first
instruction) are not measured here: the simulator must not import the gateway, so
``python -m benchmarks.invoke --write-venue FILE`` measures and writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pool_manager.backends.local import LocalBackend
from pool_manager.catalog import PoolSpec
from simulator.venue import VENUE_DIR, check_venue_target, save_venue


def _healthy(endpoint: str) -> bool:
    """One ``GET /healthz`` over the agent's unix socket (or tcp host:port)."""
    kind, _, where = endpoint.partition(":")
    try:
        if kind == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            host, _, port = where.rpartition(":")
            s = socket.create_connection((host, int(port)), timeout=1.0)
        with s:  # closed on every path, a refused connect included
            if kind == "unix":
                s.settimeout(1.0)
                s.connect(where)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


async def _start(backend: LocalBackend, name: str, pool: PoolSpec, timeout: float) -> float:
    t0 = time.perf_counter()
    pod = await backend.create(name, pool)
    delay = 0.002
    while time.perf_counter() - t0 < timeout:
        if await asyncio.to_thread(_healthy, pod.endpoint):
            return time.perf_counter() - t0
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    raise TimeoutError(f"pod {name} never became healthy")


async def measure(
    pods: int, burst: int, rounds: int = 1, timeout: float = 60.0
) -> dict[str, list[float]]:
    """``rounds`` rounds of ``pods`` sequential starts (each deleted before the next: the
    termination times), then ``burst`` pods started at once. Each round's own ratio of the
    two medians gives a contention (``contentions``), so a machine whose speed drifts during
    the measurement (this one does, by a third within minutes) biases neither side."""
    pool = PoolSpec(sku="cpu")
    out: dict[str, list[float]] = {"single": [], "together": [], "termination": [],
                                   "contentions": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="firepool-calibrate-") as tmp:
        backend = LocalBackend(Path(tmp))
        try:
            for round_ in range(rounds):
                single: list[float] = []
                for i in range(pods):
                    name = f"cal-{round_}-{i}"
                    single.append(await _start(backend, name, pool, timeout))
                    t0 = time.perf_counter()
                    await backend.delete(name)
                    out["termination"].append(time.perf_counter() - t0)
                names = [f"burst-{round_}-{i}" for i in range(burst)]
                together = await asyncio.gather(*(_start(backend, n, pool, timeout)
                                                  for n in names))  # fmt: skip
                for n in names:
                    await backend.delete(n)
                out["single"] += single
                out["together"] += together
                out["contentions"].append(contention_per_pod(
                    float(np.median(single)), float(np.median(together)), burst))  # fmt: skip
        finally:
            await backend.close()
    return out


def contention_per_pod(single_s: float, burst_s: float, burst: int) -> float:
    """The venue's ``start_contention`` that makes the simulator's median start of ``burst``
    pods created at once ``burst_s``, where one pod alone takes ``single_s``.

    Pods created together start together: the simulator stretches every pod of a burst
    created in one pass by ``1 + c (burst - 1)`` (``Venue.start_time``), as measured here,
    where the pods of a burst all become ready at about the same time (on this machine's
    2 cores, 8 pods at once in ``benchmarks.loops``' fresh W-RL: p50 1.65 s, p90 2.02 s)."""
    return max(0.0, (burst_s / single_s - 1.0) / (burst - 1))


def _dist(values: list[float]) -> dict[str, float]:
    return {"median": round(float(np.median(values)), 4),
            "p90": round(float(np.percentile(values, 90)), 4)}  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="firepool simulate calibrate", description=__doc__)
    p.add_argument("--pods", type=int, default=4, help="sequential starts per round")
    p.add_argument("--burst", type=int, default=4, help="pods started at once per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds (contention: their median)")
    p.add_argument(
        "--out",
        default=str(VENUE_DIR / "local.yaml"),
        help="venue YAML to update (a new file starts from the shipped local venue)",
    )
    args = p.parse_args(argv)
    if args.pods < 2 or args.burst < 2 or args.rounds < 1:  # a median and a p90, a ratio
        p.error(
            f"--pods and --burst must be at least 2 and --rounds 1, not {args.pods}, "
            f"{args.burst} and {args.rounds}"
        )
    out = Path(args.out)
    try:
        check_venue_target(out)
    except ValueError as exc:
        p.error(f"--out: {exc}")
    got = asyncio.run(measure(args.pods, args.burst, args.rounds))
    base = out if out.exists() else VENUE_DIR / "local.yaml"  # a new file: the shipped one's rest
    data: dict[str, Any] = yaml.safe_load(base.read_text())
    single = float(np.median(got["single"]))
    burst = float(np.median(got["together"]))
    contention = float(np.median(got["contentions"]))
    data["start_phases"] = {"spawn_to_healthz": _dist(got["single"])}
    data["start_contention"] = round(contention, 4)
    data["termination"] = _dist(got["termination"])
    notes = dict(data.get("notes") or {})
    notes.pop("all", None)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    n = args.rounds * args.pods
    notes["start_phases"] = f"measured {stamp}: {n} sequential local pod starts"
    notes["start_contention"] = (
        f"measured {stamp}: {args.rounds} rounds of {args.pods} pods one at a time, then "
        f"{args.burst} at once (medians {single:.3f} s and {burst:.3f} s); the median of "
        f"the rounds' own contentions"
    )
    notes["termination"] = f"measured {stamp}: delete -> processes gone"
    data["notes"] = notes
    save_venue(out, data)
    print(f"create->ready median {single:.3f} s, {args.burst} at once {burst:.3f} s "
          f"(contention {contention:.3f} per pod), "
          f"termination median {np.median(got['termination']):.3f} s -> {out}")  # fmt: skip
    return 0
