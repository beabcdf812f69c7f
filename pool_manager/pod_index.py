"""The tracker's pod state: every pod by name, the claim buckets and the GPU cards.

Claim buckets hold only pods claimable *right now*, so every lookup is O(1):

* ``_exact[(sku, owner, queue, tag)]``: used pods held for their owner (owner-only reuse);
* ``_owned[(sku, owner)]``: the ``(queue, tag)`` sessions of that owner's ``_exact`` buckets
  (per session, not per pod). A warm claim leaves an emptied bucket in place, since the
  release right after refills it; lookups skip empty buckets, ``expired_holds_locked``
  sweeps them;
* ``_fresh[sku]``: never-used idle pods; ``_standby[sku]``: promotable standbys.

Each bucket is a dict used as an insertion-ordered set; the most recently idled pod is taken
first (warmest page cache; ``popitem`` is O(1) amortised and trims deleted slots).

GPU cards (``gpu_gate`` states the rules): ``_cards`` maps a physical GPU to its group (every
tracked pod pinned to it, in joining order), ``_gates`` a GPU to the pod holding its gate
(closed gates only), ``_exclusive`` a GPU to the sweep's verdict. Plain dicts, not an object
per GPU: the tracker holds 100,000 pods.

Invariants (the property tests check them after every step):

* an ``IDLE`` pod is in exactly one bucket iff it is claimable: its card's gate is open and,
  for a standby, its card is verified exclusive; otherwise it is *parked*, in no bucket.
  Idle pods enter buckets only through ``offer_locked`` (``hold_locked`` inlines it), every
  method that moves a pod out of ``IDLE`` takes it out, and every gate or exclusivity
  change re-offers the card's idle pods. A used pod is only ever in its owner's bucket; a
  pod's bucket key (``sku``, ``owner``, ``queue``, ``tag``, ``role``) changes only while it
  is in none;
* ``_owned[(sku, owner)]`` has ``(queue, tag)`` for every non-empty ``_exact`` bucket;
* ``_next_expiry`` is at most the ``hold_until`` of every idle pod, bucketed or parked;
* a gate is held by a member of its card, and a card is in ``_cards`` exactly while it has
  a tracked pod.

Concurrency: no lock of its own; every method and view assumes the ``Tracker``'s lock is held.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Reversible
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from pool_manager.catalog import PoolSpec
from pool_manager.model import ClaimRequest, PodInfo
from pool_manager.states import (
    POD_TRANSITIONS,
    IllegalTransition,
    PodState,
    TransitionLog,
    transition,
)

Bucket = dict[str, PodInfo]
"""A claim bucket: pod name -> pod, insertion ordered (the value saves a lookup on claim)."""
Session = tuple[str | None, str | None]
"""A caller's session on a pool: ``(queue, tag)``."""
_T_co = TypeVar("_T_co", covariant=True)


class View(Collection[_T_co], Reversible[_T_co], Protocol[_T_co]):
    """A live, read-only view into the index, oldest first, valid until it next changes."""


_IDLE, _ASSIGNED, _RUNNING, _RETIRING = (
    PodState.IDLE, PodState.ASSIGNED, PodState.RUNNING, PodState.RETIRING
)  # fmt: skip
_T = POD_TRANSITIONS
_EMPTY: tuple[Any, ...] = ()


def discard(index: dict[Any, Any], key: Any, item: Any) -> None:
    bucket = index.get(key)
    if bucket is not None and item in bucket:
        del bucket[item]
        if not bucket:
            del index[key]


def add(index: dict[Any, Any], key: Any, item: Any, value: Any = None) -> None:
    bucket = index.get(key)
    if bucket is None:
        index[key] = {item: value}
    else:
        bucket[item] = value


def gpus_per_pod(spec: PoolSpec) -> int:
    """GPUs one pod of ``spec`` counts against a caller's ``max_gpus`` (0 for CPU pools)."""
    return 0 if spec.accelerator == "cpu" else spec.units_per_pod


class PodIndex:
    """Pods, claim buckets and GPU cards; see the module docstring for the invariants."""

    __slots__ = (
        "_cards", "_exact", "_exclusive", "_fresh", "_gates", "_next_expiry", "_owned", "_pods",
        "_standby", "cards", "gates", "log", "pods",
    )  # fmt: skip

    def __init__(self, history: int) -> None:
        self._pods: dict[str, PodInfo] = {}
        self._exact: dict[tuple[str, str, str | None, str | None], Bucket] = {}
        self._owned: dict[tuple[str, str], dict[Session, None]] = {}
        self._fresh: dict[str, Bucket] = {}
        self._standby: dict[str, Bucket] = {}
        self._cards: dict[str, tuple[str, ...]] = {}
        self._gates: dict[str, str] = {}
        self._exclusive: dict[str, bool] = {}
        self._next_expiry = float("-inf")
        self.log = TransitionLog(history)
        """Recent transitions of every pod (bounded): "why is this pod here?"."""
        self.pods: Mapping[str, PodInfo] = MappingProxyType(self._pods)
        """Every tracked pod by name, in the order they were added (read-only)."""
        self.cards: Mapping[str, tuple[str, ...]] = MappingProxyType(self._cards)
        """Physical GPU -> the names of its group's pods (read-only)."""
        self.gates: Mapping[str, str] = MappingProxyType(self._gates)
        """Physical GPU -> the pod holding its gate; absent: open (read-only)."""

    def clear_locked(self) -> None:
        """Forget every pod, bucket, card and transition (a restart rebuilds them)."""
        for index in (self._pods, self._exact, self._owned, self._fresh, self._standby):
            index.clear()
        for cards in (self._cards, self._gates, self._exclusive):
            cards.clear()
        self.log.clear()
        self._next_expiry = float("-inf")

    # -- pods and their states -------------------------------------------------------------
    def add_locked(self, pod: PodInfo) -> None:
        """Track ``pod`` (an idle one is then ``offer_locked``)."""
        if pod.name in self._pods:
            raise ValueError(f"pod {pod.name!r} is already tracked")
        self._pods[pod.name] = pod

    def forget_locked(self, name: str, now: float) -> PodInfo | None:
        """Stop tracking ``name``, now ``DELETED`` (its card: ``leave_card_locked``)."""
        pod = self._pods.pop(name, None)
        if pod is not None:
            self.move_locked(pod, PodState.DELETED, "gone", now)
        return pod

    def move_locked(self, pod: PodInfo, new: PodState, reason: str, now: float) -> None:
        """Transition ``pod`` (checked against the table, logged), out of its bucket when it
        leaves ``IDLE``. It never puts one in: that is ``offer_locked``'s."""
        if pod.state is _IDLE and new is not _IDLE:
            self.unlist_locked(pod)
        transition(pod, new, reason, now, _T, self.log, pod.name)

    def retire_locked(self, pod: PodInfo, reason: str, now: float) -> bool:
        """An unleased pod (idle or starting) -> ``RETIRING``; ``False`` for any other."""
        if pod.state is not _IDLE and pod.state is not PodState.STARTING:
            return False
        self.move_locked(pod, _RETIRING, reason, now)
        return True

    # -- claim buckets ---------------------------------------------------------------------
    def offer_locked(self, pod: PodInfo) -> None:
        """``pod`` is idle: put it in its bucket if it is claimable now, else park it."""
        until = pod.hold_until
        if until is not None and until < self._next_expiry:
            self._next_expiry = until
        gpu = pod.gpu
        if gpu is not None and gpu in self._gates:
            return  # parked behind the closed gate
        if pod.role == "standby":
            if gpu is not None and self._exclusive.get(gpu, False):
                add(self._standby, pod.sku, pod.name, pod)
        elif pod.owner is None:
            add(self._fresh, pod.sku, pod.name, pod)
        else:
            key = (pod.sku, pod.owner, pod.queue, pod.tag)
            bucket = self._exact.get(key)
            if bucket is None:
                self._exact[key] = {pod.name: pod}
                add(self._owned, key[:2], key[2:])
            else:
                bucket[pod.name] = pod

    def unlist_locked(self, pod: PodInfo) -> None:
        """Take ``pod`` out of its bucket, if it is in one."""
        name = pod.name
        if pod.role == "standby":
            discard(self._standby, pod.sku, name)
        elif pod.owner is None:
            discard(self._fresh, pod.sku, name)
        else:
            key = (pod.sku, pod.owner, pod.queue, pod.tag)
            bucket = self._exact.get(key)
            if bucket is not None and name in bucket:
                del bucket[name]
                if not bucket:
                    del self._exact[key]
                    discard(self._owned, key[:2], key[2:])

    def sessions_locked(self, sku: str, caller: str) -> View[Session]:
        """``caller``'s sessions holding pods of ``sku``, oldest first (emptied ones too)."""
        return self._owned.get((sku, caller), _EMPTY)

    def held_locked(self, sku: str, caller: str, session: Session) -> View[PodInfo]:
        """The pods held for ``caller``'s ``session`` on ``sku``."""
        bucket = self._exact.get((sku, caller, *session))
        return bucket.values() if bucket else _EMPTY

    def fresh_locked(self, sku: str) -> View[PodInfo]:
        """The never-used claimable pods of ``sku``."""
        bucket = self._fresh.get(sku)
        return bucket.values() if bucket else _EMPTY

    def standbys_locked(self, sku: str) -> View[PodInfo]:
        """The promotable standbys of ``sku``."""
        bucket = self._standby.get(sku)
        return bucket.values() if bucket else _EMPTY

    def pop_locked(self, pods: View[PodInfo]) -> PodInfo:
        """Take the most recently idled pod of a non-empty bucket view out of its bucket."""
        pod = next(reversed(pods))
        self.unlist_locked(pod)
        return pod

    def drop_emptied_locked(self, sku: str, caller: str) -> None:
        """Forget ``caller``'s sessions on ``sku`` whose bucket warm claims emptied."""
        sessions = self._owned.get((sku, caller))
        if not sessions:
            return
        for session in [s for s in sessions if not self._exact[(sku, caller, *s)]]:
            del self._exact[(sku, caller, *session)]
            del sessions[session]
        if not sessions:
            del self._owned[(sku, caller)]

    def listed_locked(self) -> list[str]:
        """The names of the pods a claim can find, with repeats: the never-used and standby
        buckets, and the held buckets reached through their owner's sessions."""
        out: list[str] = []
        for index in (self._fresh, self._standby):
            for bucket in index.values():
                out.extend(bucket)
        for (sku, owner), sessions in self._owned.items():
            for session in sessions:
                out.extend(self._exact.get((sku, owner, *session), _EMPTY))
        return out

    # -- GPU cards and their gates ---------------------------------------------------------
    def join_card_locked(self, pod: PodInfo, gpu: str) -> bool:
        """Add ``pod`` to the group on ``gpu``; ``True`` if it starts the group. A leased or
        retiring pod holds the card's gate if no pod does (fail closed)."""
        members = self._cards.get(gpu)
        if members is None:
            self._cards[gpu] = (pod.name,)
        elif pod.name not in members:
            self._cards[gpu] = (*members, pod.name)
        if gpu not in self._gates and (pod.job_id is not None or pod.state is _RETIRING):
            self._gates[gpu] = pod.name
        return members is None

    def leave_card_locked(self, pod: PodInfo, gpu: str) -> bool:
        """Take a departed ``pod`` out of the group on ``gpu``; a gate it held opens. ``True``
        if the card is empty now: it forgets its exclusivity (it may be shared next)."""
        members = self._cards.get(gpu)
        if members is None:
            return False
        left = tuple(name for name in members if name != pod.name)
        if left:
            self._cards[gpu] = left
            self.open_gate_locked(pod)
            return False
        del self._cards[gpu]
        self._gates.pop(gpu, None)
        self._exclusive.pop(gpu, None)
        return True

    def close_gate_locked(self, pod: PodInfo, gpu: str) -> None:
        """``pod`` on ``gpu`` was leased: park the rest of its group, one job per GPU."""
        self._gates[gpu] = name = pod.name
        members = self._cards[gpu]
        if len(members) > 1:
            for peer_name in members:
                peer = self._pods[peer_name]
                if peer.state is _IDLE and peer_name != name:
                    self.unlist_locked(peer)

    def open_gate_locked(self, pod: PodInfo) -> None:
        """If ``pod`` holds its card's gate, open it: its processes are verified dead, or it
        is gone. The card's idle pods are offered again, in the card's order."""
        gpu = pod.gpu
        if gpu is not None and self._gates.get(gpu) == pod.name:
            del self._gates[gpu]
            for name in self._cards.get(gpu, ()):
                peer = self._pods[name]
                if peer.state is _IDLE:
                    self.offer_locked(peer)

    def parked_locked(self) -> list[PodInfo]:
        """Idle pods behind closed gates (in no bucket)."""
        pods = self._pods
        return [
            peer
            for gpu in self._gates
            for peer in map(pods.__getitem__, self._cards[gpu])
            if peer.state is _IDLE
        ]

    def verified_locked(self, gpu: str) -> bool:
        return self._exclusive.get(gpu, False)

    def set_exclusive_locked(self, gpu: str, exclusive: bool) -> None:
        """The sweep's verdict on ``gpu``: its idle standbys become claimable or not."""
        self._exclusive[gpu] = exclusive
        for name in self._cards.get(gpu, ()):
            pod = self._pods[name]
            if pod.state is _IDLE and pod.role == "standby":
                if exclusive:
                    self.offer_locked(pod)
                else:
                    self.unlist_locked(pod)

    # -- leases ----------------------------------------------------------------------------
    def lease_locked(self, pod: PodInfo, job_id: str, path: str, now: float) -> None:
        """An idle pod -> ``ASSIGNED`` to ``job_id`` by ``path``; the caller closes the gate."""
        self.move_locked(pod, _ASSIGNED, path, now)
        pod.job_id = job_id

    def lease_warm_locked(self, req: ClaimRequest, now: float) -> PodInfo | None:
        """The claim hot path: ``lease_locked`` to ``req`` (one pod) the most recent pod held
        for its session and close its card's gate; ``None`` if the session holds none."""
        bucket = self._exact.get((req.sku, req.caller, req.queue, req.lease_tag))
        if not bucket:
            return None
        # An emptied bucket stays (dropped lazily): the release right after refills it.
        name, pod = bucket.popitem()
        if pod.state is not _IDLE:  # move_locked(pod, _ASSIGNED, "warm", now), inlined
            raise IllegalTransition(f"{name}: {pod.state} -> {_ASSIGNED} (warm)")
        pod.state = _ASSIGNED
        self.log.append((now, name, _IDLE, _ASSIGNED, "warm"))
        pod.job_id = req.job_id
        gpu = pod.gpu
        if gpu is not None:
            if len(self._cards[gpu]) > 1:
                self.close_gate_locked(pod, gpu)
            else:  # a group of one: nothing to park
                self._gates[gpu] = name
        return pod

    def launch_locked(self, pod: PodInfo, req: ClaimRequest, now: float) -> None:
        """``ASSIGNED`` -> ``RUNNING``; the pod records its caller, queue and tag."""
        transition(pod, _RUNNING, "launched", now, _T, self.log, pod.name)
        pod.owner, pod.queue, pod.tag = req.caller, req.queue, req.lease_tag

    def unlease_locked(self, pod: PodInfo, role: str, now: float) -> None:
        """``ASSIGNED`` -> ``IDLE`` as before the claim (``role`` too); its gate opens."""
        transition(pod, _IDLE, "unclaimed", now, _T, self.log, pod.name)
        pod.job_id = None
        pod.retire_after = pod.single_use = False
        pod.role = role
        self.open_gate_locked(pod)
        self.offer_locked(pod)

    def hold_locked(self, pod: PodInfo, req: ClaimRequest, until: float, now: float) -> None:
        """The release hot path: ``pod``'s job ended clean. It goes ``IDLE``, held for the
        job's caller and session until ``until``; its gate opens; it is offered again."""
        pod.job_id = None
        owner = pod.owner = req.caller
        queue = pod.queue = req.queue
        tag = pod.tag = req.lease_tag
        pod.released_at = now
        pod.hold_until = until
        if until < self._next_expiry:
            self._next_expiry = until
        old = pod.state  # move_locked(pod, _IDLE, "released", now), inlined
        if _IDLE not in _T[old]:
            raise IllegalTransition(f"{pod.name}: {old} -> {_IDLE} (released)")
        pod.state = _IDLE
        name = pod.name
        self.log.append((now, name, old, _IDLE, "released"))
        gpu = pod.gpu
        if gpu is not None:  # open_gate_locked(pod), inlined for a group of one
            holder = self._gates.get(gpu)
            if holder == name:
                if len(self._cards[gpu]) > 1:
                    self.open_gate_locked(pod)  # offers this pod among the card's
                    return
                del self._gates[gpu]  # verified dead: the card may serve again
            elif holder is not None:
                return  # parked behind another pod's gate
        key = (pod.sku, owner, queue, tag)  # offer_locked(pod) for a used pod, inlined
        bucket = self._exact.get(key)
        if bucket is None:
            self._exact[key] = {name: pod}
            add(self._owned, key[:2], key[2:])
        else:
            bucket[name] = pod

    def end_job_locked(
        self, pod: PodInfo, req: ClaimRequest, why: str, clean: bool, now: float
    ) -> None:
        """``pod``'s job ended and it retires (``why``), keeping the job's owner marks. A
        ``clean`` reset opens its gate; an unclean one keeps it closed until the pod is gone."""
        pod.job_id = None
        pod.owner, pod.queue, pod.tag = req.caller, req.queue, req.lease_tag
        transition(pod, _RETIRING, why, now, _T, self.log, pod.name)
        if clean:
            self.open_gate_locked(pod)

    # -- owner holds -----------------------------------------------------------------------
    def expired_holds_locked(self, now: float) -> list[PodInfo]:
        """Idle pods whose owner hold ended by ``now``, bucketed or parked. The same walk
        sweeps the buckets warm claims emptied; before the first hold can have ended
        (``_next_expiry``) it only sweeps."""
        exact = self._exact
        expired: list[PodInfo] = []
        if now < self._next_expiry:
            emptied = [key for key, bucket in exact.items() if not bucket] if exact else []
        else:
            emptied = []
            soonest = float("inf")  # of the holds that stay
            for key, bucket in exact.items():
                if not bucket:
                    emptied.append(key)
                    continue
                for pod in bucket.values():
                    until = pod.hold_until
                    if until is not None:
                        if until <= now:
                            expired.append(pod)
                        elif until < soonest:
                            soonest = until
            for pod in self.parked_locked() if self._gates else ():
                until = pod.hold_until
                if pod.owner is not None and until is not None:
                    if until <= now:
                        expired.append(pod)
                    elif until < soonest:
                        soonest = until
            self._next_expiry = soonest
        for key in emptied:
            del exact[key]
            discard(self._owned, key[:2], key[2:])
        return expired

    def hold_ends_locked(self) -> list[float | None]:
        """When the owner hold of each idle used pod ends, bucketed or parked."""
        ends = [pod.hold_until for bucket in self._exact.values() for pod in bucket.values()]
        if self._gates:
            ends.extend(p.hold_until for p in self.parked_locked() if p.owner is not None)
        return ends
