"""The discrete-event loop: the broker's control plane in virtual time.

The loop plays the imperative shell around the *same* pure core the broker runs: it calls
``dispatch_pass`` exactly as ``broker.dispatcher`` does (queued jobs in order, ``reconcile``
when the reconcile interval has passed), carries out the returned creates and deletes the way
``broker.pods`` does (``add_pod`` before the create, ``pod_ready`` / ``pod_gone`` when the
venue says so), and releases pods after the venue's reset time as ``broker.lifecycle`` does.
No claim, scaling, hold or standby rule lives here; only the venue's timings do.

Events are ``(time, seq, kind, obj)`` tuples in one ``heapq``; the clock is the time of the
event being handled. Single-threaded, so the tracker gets a no-op lock.
"""

from __future__ import annotations

import heapq
import itertools
from contextlib import nullcontext
from dataclasses import dataclass

from pool_manager.budgets import BudgetLedger
from pool_manager.claim_queue import ClaimQueue
from pool_manager.dispatch_pass import dispatch_pass
from pool_manager.model import ClaimRequest, CreatePod, Lease, PodInfo
from pool_manager.tracker import Tracker
from simulator.arms import Arm, build_catalog, env_sku
from simulator.venue import Venue
from simulator.workloads import Batch, Program, Spawn, stream

_DISPATCH, _READY, _GONE, _DONE, _RELEASE, _WAKE, _TICK = range(7)
_heappush = heapq.heappush
_INF = float("inf")
_DELAY = (float, int)  # what a program yields to think


class Job:
    __slots__ = ("body", "dispatched", "finished", "first", "id", "path", "pods", "proc",
                 "req", "submitted")  # fmt: skip

    def __init__(self, req: ClaimRequest, proc: Proc, body: float, now: float) -> None:
        self.id = req.job_id
        self.req = req
        self.proc = proc
        self.body = body
        self.submitted = now
        self.dispatched = self.first = self.finished = -1.0
        self.path = ""
        self.pods: tuple[str, ...] = ()


class Proc:
    __slots__ = ("caller", "gen", "pending", "seq")

    def __init__(self, caller: str, gen: Program) -> None:
        self.caller = caller
        self.gen = gen
        self.pending = 0
        self.seq = 0


@dataclass(slots=True)
class RunResult:
    """Everything one simulated run measured (raw; ``metrics`` summarises)."""

    jobs: list[Job]
    start: float
    end: float
    """First submission and last completion: the makespan window."""
    held_units_s: float
    """Pool units (GPU groups or pods) alive, integrated from create to gone."""
    peak_busy: int
    """Most pods assigned or running at once: the always-on pool sized to peak."""
    pods_created: int
    events: int


class Simulation:
    """One run: one venue, one arm, one seed, some caller programs."""

    def __init__(
        self, venue: Venue, arm: Arm, seed: int, envs: int = 1, scale: float = 1.0
    ) -> None:
        self.venue = venue
        self.scale = scale
        self.arm = arm
        self.catalog = build_catalog(venue, arm, envs)
        self.now = 0.0
        self.ledger = BudgetLedger(self.catalog.budgets, clock=self._clock)
        self.tracker = Tracker(self.catalog, self.ledger, lock=nullcontext())
        self.rng = stream(seed, "venue")
        self.skus = [env_sku(venue, arm, e) for e in range(envs)]
        self.acc = venue.pool.accelerator
        self.per_unit = max(1, venue.pool.units_per_pod)
        self.heap: list[tuple[float, int, int, object]] = []
        self.next_seq = itertools.count().__next__
        self.queue = ClaimQueue()
        """The queued jobs' requests, in dispatch order (what ``dispatch_pass`` takes)."""
        self.queued: dict[str, Job] = {}
        """The queued jobs by id."""
        self.jobs: list[Job] = []
        self.live_procs = 0
        self.live_jobs = 0
        # The broker's reconcile loop runs on its own clock, not the benchmark's: its phase
        # against the first submission is uniform over one interval (own stream, so the
        # venue's draws do not move).
        self.next_reconcile = stream(seed, "reconcile").uniform(0.0, venue.reconcile_s)
        self.replan = True
        self.new_demand = False
        self.dispatch_at = _INF
        self.quiet_since = -1.0
        """When the last pass with nothing queued planned nothing, if nothing changed in the
        tracker since (every change resets it to -1); later such passes are skipped until
        ``quiet_until``, asked of the tracker once the first of them comes."""
        self.quiet_until: float | None = None
        self.event_mode = venue.dispatch_mode == "event"
        self.epoch = 0
        """Runs before this one on this pool (``warm_up``); part of every fresh tag."""
        self.pod_ids = itertools.count()
        self.job_ids = itertools.count()
        self.starting = 0
        self.deleting: set[str] = set()
        self.card_pods: dict[str, int] = {f"gpu{i}": 0 for i in range(venue.gpus_per_node)}
        self.pod_card: dict[str, str] = {}
        self.units = 0
        """Budget units the venue's accelerator holds now (``ledger.used``): the drain's stop."""
        self.held_from = 0.0
        """The ledger's held unit-seconds when this run's measurement began (``warm_up``)."""
        self.busy = self.peak_busy = 0
        self.created = 0
        self.ticking = False
        self.floor_units = sum(s.min_count for s in self.catalog.pools.values())

    def _clock(self) -> float:
        """Virtual time: the ledger integrates held units on it (``held_units_s``)."""
        return self.now

    def _held(self) -> float:
        return self.ledger.held_unit_seconds().get(self.acc, 0.0)

    # -- programs ------------------------------------------------------------------------
    def add(self, caller: str, program: Program) -> None:
        self.live_procs += 1
        self._step(Proc(caller, program))

    def _push(self, t: float, kind: int, obj: object) -> None:
        _heappush(self.heap, (t, self.next_seq(), kind, obj))

    def _step(self, proc: Proc) -> None:
        gen = proc.gen
        while True:
            try:
                cmd = next(gen)
            except StopIteration:
                self.live_procs -= 1
                return
            if isinstance(cmd, _DELAY):
                self._push(self.now + cmd * self.scale, _WAKE, proc)
                return
            if isinstance(cmd, Batch):
                self._submit(proc, cmd)
                return
            if isinstance(cmd, Spawn):
                self.add(cmd.caller, cmd.program)
                continue
            raise TypeError(f"a caller program yielded {cmd!r}")

    def _submit(self, proc: Proc, batch: Batch) -> None:
        arm, now = self.arm, self.now
        sku = self.skus[batch.env]
        slots = batch.slots
        for i, body in enumerate(batch.bodies):
            proc.seq += 1
            caller = f"{proc.caller}/{slots[i]}" if slots else proc.caller
            tag = caller if arm.tag == "stable" else f"{caller}/{self.epoch}/{proc.seq}"
            req = ClaimRequest(f"j{next(self.job_ids)}", caller, sku, tag,
                               single_use=arm.single_use, queued_at=now)  # fmt: skip
            job = Job(req, proc, body * self.scale, now)
            self.queue.push(req)
            self.queued[req.job_id] = job
            self.jobs.append(job)
        proc.pending = len(batch.bodies)
        self.live_jobs += len(batch.bodies)
        self.new_demand = True
        self._wake()

    # -- the dispatcher shell ------------------------------------------------------------
    def _wake(self) -> None:
        if self.event_mode:
            at = self.now + self.venue.accept_s
            if at < self.dispatch_at:
                self.dispatch_at = at
                self._push(at, _DISPATCH, None)

    def _dispatch(self) -> None:
        """One pass, as ``broker.dispatcher`` runs it: the scaler plans only when the
        reconcile tick is due or something it must see changed since its last plan (a job
        submitted, a pod ready or gone); creates in flight already count as supply, so a
        pass that only finds a waiting job again does not re-plan, and a new job plans only
        if it is left waiting (a warm claim changes nothing the scaler must see). The earlier
        tick-driven dispatcher (``tick`` mode, Table 5's Reuse Off columns) claimed on its
        tick and scaled only on the reconcile pass (§7: "on every reconcile pass (30 s by
        default)")."""
        now = self.now
        queue = self.queue
        due = now >= self.next_reconcile
        reconcile = due or (self.replan and self.event_mode)
        new_demand = self.new_demand and self.event_mode
        self.new_demand = False
        if not queue:
            if not reconcile:
                return
            if self.quiet_since >= 0:
                if self.quiet_until is None:  # the state is still that of ``quiet_since``
                    self.quiet_until = self.tracker.quiet_until(self.quiet_since)
                if now < self.quiet_until:  # the pass would return nothing: skip it
                    self.replan = False
                    self.next_reconcile = now + self.venue.reconcile_s
                    return
        result = dispatch_pass(self.tracker, queue, now, reconcile, replan_waiting=new_demand)
        if reconcile or (new_demand and result.waiting):
            self.replan = False
            self.next_reconcile = now + self.venue.reconcile_s
        if reconcile and not queue and not result.actions:
            self.quiet_since, self.quiet_until = now, None
        else:
            self.quiet_since = -1.0
        if result.leases:  # in queue order, as claimed (the pass took them off the queue)
            queued = self.queued
            for lease in result.leases:
                self._start(queued.pop(lease.job_id), lease)
        # Pods created in one pass start together: each contends with all of them, not
        # only with those created before it (``Venue.start_time``).
        actions = result.actions
        joining = sum(isinstance(a, CreatePod) for a in actions) if actions else 0
        for action in actions:
            if isinstance(action, CreatePod):
                joining -= 1
                self._create(action, joining)
            else:
                self._delete(action.name, action.reason)

    def _start(self, job: Job, lease: Lease) -> None:
        now, v, rng = self.now, self.venue, self.rng
        self.tracker.launched(job.id, now)
        if lease.path == "standby":  # the gate's promotion is part of the queue wait
            now += v.promotion.sample(rng)
        job.dispatched = now
        job.path = lease.path
        job.pods = lease.pods
        job.first = now + v.dispatch_s + v.handoff.sample(rng) + v.first_instruction.sample(rng)
        self.busy += len(lease.pods)
        if self.busy > self.peak_busy:
            self.peak_busy = self.busy
        self._push(job.first + job.body + v.job_overhead.sample(rng), _DONE, job)

    # -- the pod shell -------------------------------------------------------------------
    def _create(self, action: CreatePod, joining: int = 0) -> None:
        """``joining``: the pods the same pass creates after this one."""
        name = f"p{next(self.pod_ids)}"
        spec = self.catalog.pools[action.sku]
        card = action.gpu
        if card is None and spec.is_gpu:
            # The GPU scheduler binds a card in the scheduling phase, before the pod is ready,
            # so standbys can be staged on it while it starts (Figure 3b).
            card = next((c for c, n in self.card_pods.items() if n == 0), None)
            if card is None:  # the budget holds one group per card: a broken invariant
                raise RuntimeError(f"t={self.now:.1f} s: no free card for {name} on the node")
        pod = PodInfo(name=name, sku=action.sku, created=self.now, role=action.role,
                      gpu=card, template=spec.template)  # fmt: skip
        if not self.tracker.add_pod(pod, self.now):
            return  # a standby whose card emptied since the plan
        if card is not None:
            self.card_pods[card] += 1
            self.pod_card[name] = card
        self.created += 1
        self.units = self.ledger.used(self.acc)
        self.starting += 1
        start = self.venue.start_time(self.rng, self.starting + joining)
        self._push(self.now + start, _READY, name)

    def _ready(self, name: str) -> None:
        self.starting -= 1
        self.quiet_since = -1.0
        if name in self.deleting:
            return
        card = self.pod_card.get(name)
        self.tracker.pod_ready(name, self.now)
        self.replan = True
        if card is not None and not self.tracker.gpu_verified(card):
            # The exclusivity sweep: a dedicated benchmark node has only our shares. (The
            # tracker forgets a card's verification when the card empties.)
            self.tracker.mark_gpu_verified(card, True, self.now)
        self._wake()

    def _delete(self, name: str, reason: str) -> None:
        """``dispatch_pass`` already marked the pod RETIRING; the backend delete takes the
        venue's termination time before the pod (and its GPU or cores) is gone."""
        if name in self.deleting:
            return
        self.deleting.add(name)
        self._push(self.now + self.venue.termination.sample(self.rng), _GONE, name)

    def _gone(self, name: str) -> None:
        self.deleting.discard(name)
        self.quiet_since = -1.0
        self.tracker.pod_gone(name, self.now)
        card = self.pod_card.pop(name, None)
        if card is not None:
            self.card_pods[card] -= 1
        self.units = self.ledger.used(self.acc)
        self.replan = True
        self._wake()

    # -- the loop ------------------------------------------------------------------------
    def warm_up(self, programs: list[tuple[str, Program]]) -> None:
        """Run ``programs`` (the previous run) until every job is done, then forget what
        they measured: the next programs start on the pool they left (warm pods, holds).
        Fresh tags never repeat across the two. ``reconfigure`` first if the next run's arm
        has other pool settings."""
        for caller, program in programs:
            self.add(caller, program)
        self.run(until_idle=True)
        self.epoch += 1
        self.jobs = []
        self.held_from = self._held()
        self.peak_busy = self.busy
        self.created = 0

    def reconfigure(self, arm: Arm) -> None:
        """Make ``arm`` the run's arm. If its pool settings differ (the paper's fresh-pod arm
        runs without standbys), the operator restarts the broker on the new catalog: the
        tracker is rebuilt from the pods that exist (``Tracker.restore``, paper A.1), so
        pods starting, held, idle or terminating carry over, and the GPU sweep re-verifies
        every card. Pods the new settings would not stage (standbys) stay until the
        scaler's own rules remove them. Raises ``ValueError`` if a pod's pool is missing
        from the new catalog (a per-environment arm after a shared one)."""
        catalog = build_catalog(self.venue, arm, len(self.skus))
        self.arm = arm
        if catalog == self.catalog:
            return
        pods = self.tracker.pods()
        missing = sorted({p.sku for p in pods} - catalog.pools.keys())
        if missing:
            raise ValueError(f"arm {arm.name!r} has no pool {', '.join(missing)} for its pods")
        # Jobs done but not yet released (their reset) still hold their pods: leases again.
        leased = {
            job.id: job.req
            for _, _, kind, job in self.heap
            if kind == _RELEASE and isinstance(job, Job)
        }
        ledger = BudgetLedger(catalog.budgets, clock=self._clock)
        tracker = Tracker(catalog, ledger, lock=nullcontext())
        tracker.restore(pods, self.now, leased)
        for card in self.pod_card.values():  # the sweep: a dedicated node has only our shares
            tracker.mark_gpu_verified(card, True, self.now)
        self.catalog, self.ledger, self.tracker = catalog, ledger, tracker
        self.units = ledger.used(self.acc)
        self.held_from = self._held()  # a new ledger: its integral starts now
        self.floor_units = sum(s.min_count for s in catalog.pools.values())
        self.quiet_since, self.replan = -1.0, True

    def run(self, horizon_s: float = 1e6, until_idle: bool = False) -> RunResult:
        """Handle events until the last job is done and the pool has drained (or its keep-
        alives have had time to expire). Raises ``RuntimeError`` if jobs are still queued at
        ``horizon_s``: a stuck simulation is a finding, never a silent number."""
        heap, pop, push, seq = self.heap, heapq.heappop, heapq.heappush, self.next_seq
        reset_s = self.venue.reset_s
        tick = self.venue.tick_s if not self.event_mode else self.venue.reconcile_s
        if not self.ticking:
            self.ticking = True
            self._push(self.now + self.rng.uniform(0.0, tick), _TICK, None)
        end = -1.0
        stop_at = horizon_s
        events = 0
        floor_units = self.floor_units * self.per_unit
        while heap:
            t, _, kind, obj = pop(heap)
            if t > stop_at:
                break
            self.now = t
            events += 1
            if kind == _DISPATCH:  # the most frequent first
                self.dispatch_at = _INF
                self._dispatch()
            elif kind == _DONE:
                job: Job = obj  # type: ignore[assignment]
                job.finished = t
                self.live_jobs -= 1
                proc = job.proc
                proc.pending -= 1
                if proc.pending == 0:
                    self._step(proc)
                push(heap, (t + reset_s, seq(), _RELEASE, job))
            elif kind == _RELEASE:
                job = obj  # type: ignore[assignment]
                self.busy -= len(job.pods)
                self.quiet_since = -1.0
                for rel in self.tracker.release(job.id, True, t):
                    if rel.retire:
                        self.deleting.add(rel.name)
                        self._push(t + self.venue.termination.sample(self.rng), _GONE, rel.name)
                self._wake()
            elif kind == _WAKE:
                self._step(obj)  # type: ignore[arg-type]
            elif kind == _READY:
                self._ready(obj)  # type: ignore[arg-type]
            elif kind == _GONE:
                self._gone(obj)  # type: ignore[arg-type]
            else:  # _TICK: the fallback tick (tick mode: the only dispatch trigger)
                self._dispatch()
                push(heap, (t + tick, seq(), _TICK, None))
            if end < 0:
                if self.live_procs or self.live_jobs:
                    continue
                end = t
                if until_idle:
                    break
                stop_at = min(stop_at, t + self._drain_s())
            if self.units <= floor_units and not self.deleting:
                break
        if end < 0 and self.live_jobs:
            raise RuntimeError(
                f"{self.live_jobs} jobs still unfinished at t={self.now:.0f} s "
                f"({len(self.queue)} queued): the simulated pool is stuck; {self._stuck()}"
            )
        start = min((j.submitted for j in self.jobs), default=0.0)
        return RunResult(
            jobs=self.jobs, start=start, end=end if end >= 0 else self.now,
            held_units_s=(self._held() - self.held_from) / self.per_unit,
            peak_busy=self.peak_busy,
            pods_created=self.created, events=events,
        )  # fmt: skip

    def _stuck(self) -> str:
        """What holds the capacity and who waits for it, for the stuck-run error."""
        held: dict[str, dict[str, int]] = {}
        for pod in self.tracker.pods():
            kind = f"{pod.state} {pod.role}"
            held.setdefault(pod.sku, {})
            held[pod.sku][kind] = held[pod.sku].get(kind, 0) + 1
        budgets = ", ".join(
            f"{acc} {used}/{cap}" for acc, (used, cap) in self.ledger.view().items()
        )
        pods = "; ".join(
            f"{sku}: " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
            for sku, kinds in sorted(held.items())
        )
        waiting = ", ".join(sorted({req.sku for req in self.queue}))
        return f"budget {budgets}; pods {pods or 'none'}; jobs wait on {waiting or 'nothing'}"

    def _drain_s(self) -> float:
        """After the last job: long enough for every keep-alive and hold to expire."""
        longest = max(max(s.idle_timeout_s, s.hold_s) for s in self.catalog.pools.values())
        return longest + 2 * self.venue.reconcile_s + self.venue.termination.p90 * 2
