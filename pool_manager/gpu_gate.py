"""Active–standby groups and the per-GPU gate (paper §6, App. A.4).

A *group* is every pod pinned to one physical GPU: one active pod and up to
``standbys_per_active`` zero-VRAM standbys (a promoted standby becomes active, so a group may
briefly hold two used pods). The group counts once in every ceiling and budget: it holds one
ledger reservation of ``units_per_pod`` from its first pod to the departure of its last
(``join_group_locked``, ``leave_group_locked``); a GPU-less pod is a group of its own.

The *gate* lets at most one pod per GPU hold a job. It closes when a pod of the group is
leased and opens only when that pod's reset reported the job's processes verified dead (a
clean release), the claim is undone, or the pod is gone; an unclean release keeps it closed
until deletion. While it is closed the group's idle pods are parked, out of every claim
bucket, so the check costs nothing on the claim path.

*Exclusivity* is verified per GPU by a periodic sweep (every share on the card belongs to
this group). It fails closed: unknown, a non-exclusive report, any GPU after a restart, or
a card whose group emptied (someone else may be placed there) means no standby promotion
until the sweep says otherwise.

The gate and exclusivity decide which idle pods are claimable, so the ``PodIndex`` keeps
both with its buckets (``close_gate_locked``, ``open_gate_locked``, ``set_exclusive_locked``)
and the claim and release paths apply them in the same step; this module settles the budget
of a group as pods join and leave it.

Concurrency: every function assumes the tracker's lock is held.
"""

from __future__ import annotations

from pool_manager.budgets import BudgetLedger
from pool_manager.catalog import PoolSpec
from pool_manager.model import PodInfo
from pool_manager.pod_index import PodIndex


def join_group_locked(
    index: PodIndex,
    ledger: BudgetLedger,
    spec: PoolSpec,
    pod: PodInfo,
    *,
    reserved: bool,
    moved: bool = False,
) -> None:
    """Attach a tracked ``pod`` to its GPU's group (or let it stand alone) and settle its
    budget units.

    The scaler reserves for active creates only. A reserved pod that joins an existing group
    gives its reservation back (the group counts once); an unreserved pod that starts a
    group records its units (even past the budget: they exist). ``moved``: the pod's own
    reservation moves with it (its card became known after the create).
    """
    accelerator, units = spec.accelerator, spec.units_per_pod
    has_units = moved or (reserved and pod.role == "active")
    gpu = pod.gpu
    if gpu is None or index.join_card_locked(pod, gpu):
        if not has_units:
            ledger.force(accelerator, units)
    elif has_units:
        ledger.release(accelerator, units)


def leave_group_locked(index: PodIndex, ledger: BudgetLedger, spec: PoolSpec, pod: PodInfo) -> None:
    """Detach a departed ``pod``; the budget units go back when the last pod of its group
    (or the GPU-less pod itself) leaves. A gate it held opens."""
    gpu = pod.gpu
    if gpu is None or index.leave_card_locked(pod, gpu):
        ledger.release(spec.accelerator, spec.units_per_pod)


def may_stage_standby_locked(index: PodIndex, pod: PodInfo) -> bool:
    """Whether a planned standby still has a group to join: its card's last pod may have
    left between the plan and the create, releasing the card's units."""
    return pod.gpu is None or pod.gpu in index.cards
