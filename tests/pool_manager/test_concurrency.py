"""One lock, many threads: claimers and scaler passes racing never break an invariant."""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter

from pool_manager.catalog import CallerLimits
from pool_manager.model import ClaimRequest, CreatePod, Lease, PodInfo
from pool_manager.states import PodState
from tests.pool_manager.builders import make_request, make_spec, make_tracker

LEASED = (PodState.ASSIGNED, PodState.RUNNING)
# Claimers stop once this many leases were granted in all: a fixed iteration count made the
# number of leases depend on how soon the scaler threads were scheduled (CI once saw 98 < 100).
TARGET_LEASES = 400
MAX_TRIES = 50_000


def test_racing_claimers_and_scaler_passes_keep_every_invariant() -> None:
    t = make_tracker(
        make_spec("cpu", max_count=12, caller_hold_s=0.05, idle_timeout_s=0.05),
        make_spec("gpu", max_count=6, standbys_per_active=1, caller_hold_s=0.05),
        budgets={"cpu": 10, "h200": 5},
        limits=CallerLimits(max_pods=4),
    )
    names = itertools.count()
    stop = threading.Event()
    errors: list[BaseException] = []
    queued: list[ClaimRequest] = []
    held: Counter[str] = Counter()
    held_lock = threading.Lock()

    def claimer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for i in range(MAX_TRIES):
                with held_lock:
                    if held["leases"] >= TARGET_LEASES:
                        return
                caller = rng.choice(("a", "b", "c", "d"))
                sku, pods = rng.choice(("cpu", "gpu")), rng.choice((1, 1, 2))
                req = make_request(caller, sku=sku, pods=pods, job_id=f"j{seed}-{i}")
                got = t.claim(req, float(i))
                if not isinstance(got, Lease):
                    queued.append(req)
                    continue
                with held_lock:
                    held["leases"] += 1
                    held[caller] += len(got.pods)
                    assert held[caller] <= 4, "a caller's limit was overrun"
                unclaim = rng.random() < 0.2
                if not unclaim:
                    t.launched(req.job_id, float(i))
                # Counted after the claim, uncounted before the release: held[caller] never
                # exceeds what the tracker really holds, so the check above cannot misfire.
                with held_lock:
                    held[caller] -= len(got.pods)
                if unclaim:
                    t.unclaim(req.job_id, float(i))
                else:
                    for rel in t.release(req.job_id, rng.random() < 0.9, float(i)):
                        if rel.retire:
                            t.pod_gone(rel.name, float(i))
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    def scaler() -> None:
        try:
            while not stop.is_set():
                demand = list(queued[-20:])
                for action in t.reconcile(demand, 1e9):
                    if isinstance(action, CreatePod):
                        name = f"pod-{next(names)}"
                        gpu = action.gpu or (f"G-{name}" if action.sku == "gpu" else None)
                        if not t.add_pod(PodInfo(name, action.sku, 0.0, action.role, gpu), 0.0):
                            continue  # a standby whose card emptied since the plan
                        t.pod_ready(name, 0.0)
                        if gpu is not None:
                            t.mark_gpu_verified(gpu, True, 0.0)
                    else:
                        t.pod_gone(action.name, 0.0)
        except BaseException as exc:
            errors.append(exc)

    scalers = [threading.Thread(target=scaler) for _ in range(2)]
    claimers = [threading.Thread(target=claimer, args=(k,)) for k in range(4)]
    for th in scalers + claimers:
        th.start()
    for th in claimers:
        th.join()
    stop.set()
    for th in scalers:
        th.join()
    assert errors == []
    assert held["leases"] >= TARGET_LEASES  # the race really ran
    pods = t.pods()
    assert not [p for p in pods if p.state in LEASED]
    cards = {p.gpu or p.name for p in pods if p.sku == "gpu"}
    cpu = [p for p in pods if p.sku == "cpu"]
    assert t.ledger.used("h200") == len(cards) <= 5
    assert t.ledger.used("cpu") == len(cpu) <= 10
