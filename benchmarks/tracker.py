"""Tracker claim throughput, lock hold and memory at scale (paper §3, §9.6; issue 3).

Builds a tracker of ``--pods`` ready pods over two CPU and two GPU pools (distinct names,
GPU UUIDs and times), a quarter of them held by 1,000 callers, then measures claim + release
cycles, one job at a time, cycling over 1,000 callers and the four SKUs (after a warm-up
pass each claim finds the caller's own held pod: the common, warm case):

- ``claims_per_s``: cycles per wall-clock second with one claimer, best of ``--trials``
  (the host may be shared); ``claims_per_cpu_s``: the same per CPU second of the process;
- ``claims_per_s_8_threads``: total cycles per second with 8 claimer threads;
- ``lock_hold_p50_us`` / ``lock_hold_p99_us``: time inside the tracker's lock per claim or
  release (a timing lock, ``perf_counter_ns`` at acquire and release, every call sampled in a
  separate phase so the throughput phases run with the plain lock);
- ``bytes_per_pod``: ``tracemalloc`` bytes of the whole index (pods, buckets, groups) / pods.

    python -m benchmarks.tracker --pods 100000 --json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Sequence
from types import TracebackType

from benchmarks.args import positive_int
from pool_manager.catalog import Catalog, PoolSpec
from pool_manager.model import ClaimRequest, Lease, PodInfo
from pool_manager.tracker import Tracker

SKUS = ("cpu", "cpu-large", "h200", "h200-8")
CALLERS = 1000


class TimingLock:
    """A ``threading.Lock`` that records how long each holder kept it."""

    __slots__ = ("_lock", "_t0", "holds")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t0 = 0
        self.holds: list[int] = []

    def __enter__(self) -> bool:
        self._lock.acquire()
        self._t0 = time.perf_counter_ns()
        return True

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.holds.append(time.perf_counter_ns() - self._t0)
        self._lock.release()


def catalog() -> Catalog:
    pools = {
        "cpu": PoolSpec("cpu", max_count=10**6, idle_timeout_s=1e9),
        "cpu-large": PoolSpec("cpu-large", units_per_pod=8, max_count=10**6, idle_timeout_s=1e9),
        "h200": PoolSpec("h200", accelerator="h200", max_count=10**6, idle_timeout_s=1e9),
        "h200-8": PoolSpec(
            "h200-8", accelerator="h200", units_per_pod=8, max_count=10**6, idle_timeout_s=1e9
        ),
    }
    return Catalog(pools=pools)


def build(n: int, lock: TimingLock | None = None) -> Tracker:
    """``n`` ready pods spread over the pools, some held by ``CALLERS`` callers (one session
    each, so a cycle never crosses a session boundary and retires its pod)."""
    tracker = Tracker(catalog(), lock=lock)
    for i in range(n):  # distinct names, cards and times, as a real fleet would have
        sku = SKUS[i % len(SKUS)]
        gpu = f"GPU-{i:08x}-7d2c-4b1e-9f3a-{i:012x}" if sku.startswith("h200") else None
        pod = PodInfo(name=f"{sku}-{i:07d}", sku=sku, created=i * 0.001, gpu=gpu)
        tracker.add_pod(pod, pod.created, reserved=False)
        tracker.pod_ready(pod.name, pod.created + 30.0)
    for i in range(n // 4):  # warm the index: held pods for many callers
        req = request(i, i)
        got = tracker.claim(req, 200.0 + i * 0.001)
        if isinstance(got, Lease):
            tracker.release(req.job_id, True, 201.0 + i * 0.001)
    return tracker


def request(i: int, salt: int) -> ClaimRequest:
    caller = f"caller-{i % CALLERS}"
    return ClaimRequest(
        job_id=f"job-{salt}", caller=caller, sku=SKUS[(i // CALLERS) % len(SKUS)],
        lease_tag="session", queued_at=10.0,
    )  # fmt: skip


def cycles(tracker: Tracker, reqs: Sequence[ClaimRequest], rounds: int) -> int:
    """Claim then release every request ``rounds`` times; returns the number of claims."""
    claim, release = tracker.claim, tracker.release
    now = 100.0
    done = 0
    for _ in range(rounds):
        for req in reqs:
            if claim(req, now).__class__ is Lease:
                release(req.job_id, True, now)
                done += 1
    return done


def rate(tracker: Tracker, reqs: Sequence[ClaimRequest], rounds: int) -> tuple[float, float]:
    """Cycles per wall-clock second and per CPU second of this process."""
    t0, c0 = time.perf_counter(), time.process_time()
    done = cycles(tracker, reqs, rounds)
    return done / (time.perf_counter() - t0), done / max(1e-9, time.process_time() - c0)


def measure(n: int, reqs_per_thread: int, rounds: int, trials: int) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracker = build(n)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()

    reqs = [request(i, 10**8 + i) for i in range(reqs_per_thread)]
    cycles(tracker, reqs, 1)  # warm-up: every caller's pod is now held for it
    # The host is shared: the best of a few trials is the least disturbed one.
    single, single_cpu = max(rate(tracker, reqs, rounds) for _ in range(trials))

    per_thread = [
        [request(i, 10**9 * (k + 1) + i) for i in range(k * 97, k * 97 + reqs_per_thread)]
        for k in range(8)
    ]
    counts = [0] * 8

    def worker(k: int) -> None:
        counts[k] = cycles(tracker, per_thread[k], max(1, rounds // 8))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    eight = sum(counts) / (time.perf_counter() - t0)

    threads.clear()
    lock = TimingLock()
    timed = build(n, lock)
    cycles(timed, reqs, 1)
    lock.holds.clear()
    cycles(timed, reqs, max(1, rounds // 2))
    q = statistics.quantiles(lock.holds, n=100, method="inclusive")
    return {
        "pods": n,
        "claims_per_s": round(single),
        "claims_per_cpu_s": round(single_cpu),
        "claims_per_s_8_threads": round(eight),
        "lock_hold_p50_us": round(q[49] / 1000, 3),
        "lock_hold_p99_us": round(q[98] / 1000, 3),
        "bytes_per_pod": round(used / n),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pods", type=positive_int, default=100_000)
    parser.add_argument(
        "--requests", type=positive_int, default=20_000, help="distinct jobs per claimer"
    )
    parser.add_argument("--rounds", type=positive_int, default=10)
    parser.add_argument(
        "--trials", type=positive_int, default=3, help="single-claimer trials (best)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.pods, args.requests, args.rounds, args.trials)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
