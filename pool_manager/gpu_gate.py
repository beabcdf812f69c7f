"""Active–standby groups and the per-GPU gate (paper §6, App. A.4).

A *group* is every pod pinned to one physical GPU: one active pod and up to
``standbys_per_active`` zero-VRAM standbys (a promoted standby becomes active, so a group may
briefly hold two used pods). The group counts once in every ceiling and budget: it holds one
ledger reservation of ``units_per_pod`` from its first pod to the departure of its last.

The *gate* lets at most one pod per GPU hold a job. It closes when a pod of the group is
claimed and opens only when that pod's reset reported the job's processes verified dead (a
clean release), the claim is undone, or the pod is gone; an unclean release keeps it closed
until deletion. While it is closed the group's idle pods are parked, out of every claim
bucket, so the check costs nothing on the claim path.

*Exclusivity* is verified per GPU by a periodic sweep (every share on the card belongs to
this group). It fails closed: unknown, a non-exclusive report, any GPU after a restart, or
a card whose group emptied (someone else may be placed there) means no standby promotion
until the sweep says otherwise.

Memory: two plain dicts (``_cards``: GPU -> member names, ``_gates``: GPU -> holder, closed
gates only) instead of an object per GPU: the tracker holds 100,000 pods.

Concurrency: helpers of ``Tracker``; its lock is held (``_locked``).
"""

from __future__ import annotations

from pool_manager.model import PodInfo
from pool_manager.pod_index import PodIndex
from pool_manager.states import PodState

_IDLE = PodState.IDLE
_RETIRING = PodState.RETIRING


class GpuGates(PodIndex):
    def _reindex_card_locked(self, gpu: str) -> None:
        for name in self._cards.get(gpu, ()):
            peer = self._pods[name]
            if peer.state is _IDLE:
                self._index_locked(peer)

    def _close_gate_locked(self, pod: PodInfo, gpu: str) -> None:
        """``pod`` on ``gpu`` was claimed: park the rest of its group, one job per GPU."""
        self._gates[gpu] = pod.name
        members = self._cards[gpu]
        if len(members) > 1:
            for name in members:
                peer = self._pods[name]
                if peer.state is _IDLE and name != pod.name:
                    self._unindex_locked(peer)

    def _open_gate_locked(self, pod: PodInfo) -> None:
        """``pod``'s processes are verified dead (or it is gone): its GPU may serve again."""
        gpu = pod.gpu
        if gpu is not None and self._gates.get(gpu) == pod.name:
            del self._gates[gpu]
            self._reindex_card_locked(gpu)

    def _join_group_locked(self, pod: PodInfo, *, reserved: bool, moved: bool = False) -> None:
        """Attach ``pod`` to its GPU's group (or stand alone) and settle its budget units.

        The scaler reserves for active creates only. A reserved pod that joins an existing
        group gives its reservation back (the group counts once); an unreserved pod that
        starts a group records its units. ``moved``: the pod's own reservation moves with it.
        A leased or retiring pod holds its card's gate (after a restart: fail closed).
        """
        spec = self._specs[pod.sku]
        acc, units = spec.accelerator, spec.units_per_pod
        has_units = moved or (reserved and pod.role == "active")
        gpu = pod.gpu
        if gpu is None:
            if not has_units:
                self.ledger.force(acc, units)
            return
        members = self._cards.get(gpu)
        if members is None:
            self._cards[gpu] = (pod.name,)
            if not has_units:
                self.ledger.force(acc, units)
        else:
            if has_units:
                self.ledger.release(acc, units)
            if pod.name not in members:
                self._cards[gpu] = (*members, pod.name)
        if gpu not in self._gates and (pod.job_id is not None or pod.state is _RETIRING):
            self._gates[gpu] = pod.name

    def _leave_group_locked(self, pod: PodInfo, *, release: bool) -> None:
        """Detach ``pod``; release the budget when the last pod of its group (or the
        GPU-less pod itself) leaves and ``release`` is set; a gate it held opens."""
        spec = self._specs[pod.sku]
        gpu = pod.gpu
        if gpu is None:
            if release:
                self.ledger.release(spec.accelerator, spec.units_per_pod)
            return
        members = self._cards.get(gpu)
        if members is None:
            return
        left = tuple(name for name in members if name != pod.name)
        if left:
            self._cards[gpu] = left
            if self._gates.get(gpu) == pod.name:
                del self._gates[gpu]
                self._reindex_card_locked(gpu)
            return
        del self._cards[gpu]
        self._gates.pop(gpu, None)
        self._exclusive.pop(gpu, None)  # an empty card may be shared next: verify again
        if release:
            self.ledger.release(spec.accelerator, spec.units_per_pod)

    def _parked_locked(self) -> list[PodInfo]:
        """Idle pods behind closed gates (out of every bucket)."""
        return [
            peer
            for gpu in self._gates
            for peer in map(self._pods.__getitem__, self._cards[gpu])
            if peer.state is _IDLE
        ]

    def _set_exclusive_locked(self, gpu: str, exclusive: bool) -> None:
        self._exclusive[gpu] = exclusive
        for name in self._cards.get(gpu, ()):
            pod = self._pods[name]
            if pod.state is _IDLE and pod.role == "standby":
                if exclusive:
                    self._index_locked(pod)
                else:
                    self._unindex_locked(pod)
