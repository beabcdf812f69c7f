"""A Hypothesis state machine over the whole control-plane core (``ControlPlane``), run by
``test_tracker_stateful`` and extended by ``test_hold_expiry``.

Random submissions, claims (with failed commits), launches, releases (clean and unclean),
time passing (hold expiry), scaler passes, creates that succeed or fail, deletions, pods
vanishing, exclusivity sweeps and broker restarts, over CPU and GPU pools sharing two
accelerators. After every step: no pod leased twice; no used pod claimed by another caller;
per-caller limits, pool ceilings and accelerator budgets never exceeded; at most one running
pod per physical GPU; gangs all or nothing; no promotion on an unverified GPU; scale-down
never below the floor; and the claim buckets hold exactly the claimable pods.
"""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pool_manager.catalog import CallerLimits, Catalog, PoolSpec
from pool_manager.model import ClaimRequest, CreatePod, DeletePod, Lease, PodInfo
from pool_manager.states import PodState
from pool_manager.tracker import Tracker

CATALOG = Catalog(
    pools={
        "cpu": PoolSpec("cpu", min_count=1, max_count=4, max_idle_count=1, idle_timeout_s=50,
                        caller_hold_s=30, step=2, tag_mode="switch"),
        "cpu2": PoolSpec("cpu2", units_per_pod=2, max_count=3, max_idle_count=0,
                         idle_timeout_s=40, tag_mode="hint", step=2),
        "gpu": PoolSpec("gpu", accelerator="h200", standbys_per_active=2, max_count=3,
                        max_idle_count=1, idle_timeout_s=40, caller_hold_s=20, step=2,
                        hold_min_tenure_s=10),
        "gpu2": PoolSpec("gpu2", accelerator="h200", units_per_pod=2, min_count=1, max_count=2,
                         idle_timeout_s=30, step=1, template="v2"),
    },
    budgets={"cpu": 7, "h200": 6},
    limits=CallerLimits(max_pods=3, max_gpus=3),
)  # fmt: skip
CALLERS = ("alice", "bob", "carol")
LEASED = (PodState.ASSIGNED, PodState.RUNNING)


def session(req: ClaimRequest) -> tuple[str, str, str, str | None]:
    return (req.sku, req.caller, req.queue, req.lease_tag)


def card(pod: PodInfo) -> str:
    return pod.gpu if pod.gpu is not None else "\0" + pod.name


class ControlPlane(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.t = Tracker(CATALOG)
        self.now = 0.0
        self.queue: list[ClaimRequest] = []
        self.leases: dict[str, tuple[ClaimRequest, Lease, bool]] = {}
        self.last_user: dict[str, str] = {}
        self.verified: dict[str, bool] = {}
        self.starting: set[str] = set()
        self.deleting: set[str] = set()
        self.answered: dict[str, tuple[str, str, str, str | None]] = {}
        """Jobs answered before their reset whose session waits for their pod."""
        self.ids = itertools.count()

    # -- the callers ---------------------------------------------------------------------
    @rule(
        caller=st.sampled_from(CALLERS),
        sku=st.sampled_from(("cpu", "cpu", "cpu2", "gpu", "gpu", "gpu2")),
        tag=st.sampled_from((None, None, "s1")),
        queue=st.sampled_from(("default", "default", "default", "eval")),
        pods=st.sampled_from((1, 1, 1, 1, 2, 3)),
        single_use=st.sampled_from((False,) * 7 + (True,)),
    )
    def submit(
        self, caller: str, sku: str, tag: str | None, queue: str, pods: int, single_use: bool
    ) -> None:
        job = f"job-{next(self.ids)}"
        self.queue.append(ClaimRequest(job, caller, sku, tag, queue, pods, single_use, self.now))

    @precondition(lambda self: self.queue)
    @rule(fail=st.lists(st.sampled_from((False, False, False, True)), min_size=8, max_size=8))
    def dispatch(self, fail: list[bool]) -> None:
        waiting: list[ClaimRequest] = []
        for i, req in enumerate(self.queue):
            before = {p.name: p for p in self.t.pods()}
            got = self.t.claim(req, self.now)
            own_resets = session(req) in self.answered.values()
            if not isinstance(got, Lease):
                assert (got.reason == "own_pod_resetting") == (
                    own_resets and req.pods == 1 and not req.single_use
                ) or got.reason in ("caller_pod_limit", "caller_gpu_limit"), got.reason
                missed = {p.name: (p.state, p.owner, p.role) for p in self.t.pods()}
                assert missed == {n: (p.state, p.owner, p.role) for n, p in before.items()}
                waiting.append(req)
                continue
            self.check_lease(req, got, before)
            if own_resets and req.pods == 1 and not req.single_use:
                assert got.path == "warm", "took another pod while its own was resetting"
            event(f"lease path {got.path}")
            switched = {d.name for d in self.t.take_retired()}
            for name in switched:  # a session switch ended only the caller's own other
                old = before[name]  # sessions on this queue and pool
                assert CATALOG.pools[req.sku].tag_mode == "switch"
                assert old.state is PodState.IDLE and old.owner == req.caller
                assert (old.sku, old.queue) == (req.sku, req.queue) and old.tag != req.lease_tag
                event("session switched")
            self.deleting |= switched
            if fail[i % len(fail)]:  # the durable commit failed: pods back as they were
                self.t.unclaim(req.job_id, self.now)
                # A session switch (tag_mode "switch") is not undone: those pods stay retiring.
                assert self.t.take_retired() == []
                after = {
                    p.name: (p.state, p.owner, p.tag, p.role)
                    for p in self.t.pods()
                    if p.name not in switched
                }
                assert after == {
                    n: (p.state, p.owner, p.tag, p.role)
                    for n, p in before.items()
                    if n not in switched
                }
                waiting.append(req)
            else:
                self.leases[req.job_id] = (req, got, False)
                if fail[(i + 1) % len(fail)] is False:  # usually launched at once
                    self.launch_job(req.job_id)
        self.queue = waiting

    def check_lease(self, req: ClaimRequest, got: Lease, before: dict[str, PodInfo]) -> None:
        assert len(got.pods) == req.pods, "gangs are all or nothing"
        assert len({card(before[p]) for p in got.pods}) == req.pods, "one pod per GPU"
        for name in got.pods:
            pod = before[name]
            assert pod.state is PodState.IDLE
            owner = self.last_user.get(name)
            assert owner in (None, req.caller), "a used pod went to another caller"
            if req.single_use:
                assert owner is None, "a single-use job got a used pod"
            if pod.role == "standby":
                assert pod.gpu is not None and self.verified.get(pod.gpu), "unverified promotion"

    @precondition(lambda self: any(not launched for _, _, launched in self.leases.values()))
    @rule(data=st.data())
    def launch(self, data: st.DataObject) -> None:
        jobs = sorted(j for j, (_, _, launched) in self.leases.items() if not launched)
        self.launch_job(data.draw(st.sampled_from(jobs)))

    def launch_job(self, job: str) -> None:
        req, got, _ = self.leases[job]
        self.t.launched(job, self.now)
        for name in got.pods:
            if self.t.get(name) is not None:
                self.last_user[name] = req.caller
        self.leases[job] = (req, got, True)

    @precondition(lambda self: any(launched for _, _, launched in self.leases.values()))
    @rule(data=st.data(), clean=st.sampled_from((True, True, True, False)))
    def finish(self, data: st.DataObject, clean: bool) -> None:
        jobs = sorted(j for j, (_, _, launched) in self.leases.items() if launched)
        job = data.draw(st.sampled_from(jobs))
        for rel in self.t.release(job, clean, self.now):
            event(f"release {rel.reason}")
            if rel.retire:
                self.deleting.add(rel.name)
        del self.leases[job]
        self.answered.pop(job, None)
        self.t.reset_over(job)  # after the release: changes nothing

    @precondition(
        lambda self: any(
            launched and job not in self.answered for job, (_, _, launched) in self.leases.items()
        )
    )
    @rule(data=st.data())
    def answer_before_reset(self, data: st.DataObject) -> None:
        jobs = sorted(
            j for j, (_, _, launched) in self.leases.items() if launched and j not in self.answered
        )
        job = data.draw(st.sampled_from(jobs))
        req, _, _ = self.leases[job]
        if self.t.resetting(job):
            assert req.pods == 1 and not req.single_use, "only a one-pod session waits"
            self.answered[job] = session(req)
            event("answered before reset: its session waits")
        else:
            event("answered before reset: nothing waits")

    @precondition(lambda self: self.answered)
    @rule(data=st.data())
    def a_reset_raises(self, data: st.DataObject) -> None:
        """The reset of an answered job raised before its release: its session stops
        waiting (the lease stays until ``finish`` releases it)."""
        job = data.draw(st.sampled_from(sorted(self.answered)))
        self.t.reset_over(job)
        del self.answered[job]

    @precondition(lambda self: self.answered)
    @rule(data=st.data())
    def next_step_of_an_answered_caller(self, data: st.DataObject) -> None:
        """What the caller does the moment its answer arrives: submit its next step."""
        sku, caller, queue, tag = self.answered[data.draw(st.sampled_from(sorted(self.answered)))]
        job = f"job-{next(self.ids)}"
        self.queue.append(ClaimRequest(job, caller, sku, tag, queue, 1, False, self.now))

    @rule(dt=st.floats(min_value=0.5, max_value=40.0))
    def tick(self, dt: float) -> None:
        self.now += dt

    # -- the scaler and the backend ------------------------------------------------------
    @rule()
    def reconcile(self) -> None:
        for delete in self.t.expire(self.now):  # what reconcile would do first
            self.deleting.add(delete.name)
        before = self.t.snapshot(self.now)
        cards = {p.name: (p.sku, card(p)) for p in self.t.pods()}
        actions = self.t.reconcile(list(self.queue), self.now)
        removed = {
            cards[a.name] for a in actions if isinstance(a, DeletePod) and a.reason == "scale_down"
        }
        for sku, view in before.pools.items():
            gone = sum(1 for pool, _ in removed if pool == sku)
            assert gone <= max(0, view.physical - view.spec.min_count), "below the floor"
        for action in actions:
            if isinstance(action, CreatePod):
                name = f"pod-{next(self.ids)}"
                gpu = action.gpu
                if gpu is None and CATALOG.pools[action.sku].accelerator != "cpu":
                    gpu = f"GPU-{name}"
                template = CATALOG.pools[action.sku].template
                pod = PodInfo(name, action.sku, self.now, action.role, gpu, template)
                self.t.add_pod(pod, self.now)
                self.starting.add(name)
            else:
                event(f"delete {action.reason}")
                self.deleting.add(action.name)

    @rule(dt=st.floats(min_value=0.0, max_value=25.0))
    def shell_pass(self, dt: float) -> None:
        """What the broker does when woken: time passes, a scaler pass, pods come up, claim."""
        self.now += dt
        self.reconcile()
        for name in sorted(self.starting):
            self.starting.discard(name)
            self.t.pod_ready(name, self.now)
        if self.queue:
            self.dispatch([False] * 8)

    @precondition(lambda self: self.starting)
    @rule(data=st.data(), ok=st.sampled_from((True, True, True, False)))
    def create_finishes(self, data: st.DataObject, ok: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.starting)))
        self.starting.discard(name)
        if ok:
            self.t.pod_ready(name, self.now)
        else:
            self.deleting.discard(name)
            self.t.pod_gone(name, self.now)

    @precondition(lambda self: self.deleting)
    @rule(data=st.data())
    def delete_completes(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.deleting)))
        self.deleting.discard(name)
        self.starting.discard(name)
        self.t.pod_gone(name, self.now)

    @precondition(lambda self: self.t.pods())
    @rule(data=st.data())
    def pod_vanishes(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(p.name for p in self.t.pods())))
        self.deleting.discard(name)
        self.starting.discard(name)
        self.t.pod_gone(name, self.now)

    @precondition(lambda self: any(p.gpu for p in self.t.pods()))
    @rule(data=st.data(), exclusive=st.sampled_from((True, True, False)))
    def sweep(self, data: st.DataObject, exclusive: bool) -> None:
        gpu = data.draw(st.sampled_from(sorted({p.gpu for p in self.t.pods() if p.gpu})))
        self.t.mark_gpu_verified(gpu, exclusive, self.now)
        self.verified[gpu] = exclusive

    @rule()
    def restart(self) -> None:
        pods = self.t.pods()
        fresh = Tracker(CATALOG, self.t.ledger)
        running = {job: req for job, (req, _, launched) in self.leases.items() if launched}
        assert fresh.restore(pods, self.now, running) == []  # the store's RUNNING jobs
        self.t = fresh
        self.verified = {}
        self.answered = {}  # a restarted broker answers again after recovery
        for job, (req, _, launched) in list(self.leases.items()):
            if not launched:  # never committed: recovery re-queues it
                del self.leases[job]
                self.queue.append(req)

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def no_pod_is_leased_twice(self) -> None:
        owners: dict[str, str] = {}
        for job, (_, got, _) in self.leases.items():
            for name in got.pods:
                assert name not in owners, f"{name} leased to {owners.get(name)} and {job}"
                owners[name] = job
        for pod in self.t.pods():
            if pod.state in LEASED:
                assert owners.get(pod.name) == pod.job_id

    @invariant()
    def limits_ceilings_and_budgets_hold(self) -> None:
        pods = self.t.pods()
        per_caller: Counter[str] = Counter()
        gpus: Counter[str] = Counter()
        for req, got, _ in self.leases.values():
            live = [p for p in pods if p.name in got.pods and p.state in LEASED]
            per_caller[req.caller] += len(live)
            spec = CATALOG.pools[req.sku]
            if spec.accelerator != "cpu":
                gpus[req.caller] += len(live) * spec.units_per_pod
        assert max(per_caller.values(), default=0) <= 3
        assert max(gpus.values(), default=0) <= 3
        units: Counter[str] = Counter()
        groups: dict[str, set[str]] = {sku: set() for sku in CATALOG.pools}
        seen: set[str] = set()
        for pod in pods:
            spec = CATALOG.pools[pod.sku]
            groups[pod.sku].add(card(pod))
            if card(pod) not in seen:
                seen.add(card(pod))
                units[spec.accelerator] += spec.units_per_pod
        for sku, members in groups.items():
            assert len(members) <= CATALOG.pools[sku].max_count, f"{sku} over its ceiling"
        for acc, budget in CATALOG.budgets.items():
            assert self.t.ledger.used(acc) == units[acc], "ledger out of step with the pods"
            assert units[acc] <= budget, f"{acc} over budget"

    @invariant()
    def at_most_one_running_pod_per_gpu(self) -> None:
        running = Counter(p.gpu for p in self.t.pods() if p.gpu and p.state in LEASED)
        assert max(running.values(), default=0) <= 1

    @invariant()
    def buckets_hold_exactly_the_claimable_pods(self) -> None:
        t = self.t
        listed = Counter(t.claimable())
        for pod in t.pods():
            claimable = (
                pod.state is PodState.IDLE
                and (pod.gpu is None or t.gate_holder(pod.gpu) is None)
                and (pod.role != "standby" or t.gpu_verified(pod.gpu or ""))
            )
            assert listed[pod.name] == int(claimable), (pod, listed[pod.name])
