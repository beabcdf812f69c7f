"""End-to-end scenarios over the core alone, driven the way the broker's shell drives it."""

from __future__ import annotations

from pool_manager.catalog import Catalog
from pool_manager.model import ClaimRequest, CreatePod, Lease, PodInfo
from pool_manager.tracker import Tracker
from tests.pool_manager.builders import make_catalog, make_request, make_spec


class Shell:
    """A minimal broker shell: a queue, a backend that creates pods instantly, one GPU id
    per active create, and a dispatch pass that claims, commits and launches."""

    def __init__(self, catalog: Catalog) -> None:
        self.t = Tracker(catalog)
        self.catalog = catalog
        self.queue: list[ClaimRequest] = []
        self.made = 0

    def reconcile(self, now: float) -> None:
        for action in self.t.reconcile(self.queue, now):
            if isinstance(action, CreatePod):
                self.made += 1
                name = f"pod-{self.made}"
                gpu = action.gpu
                if gpu is None and self.catalog.pools[action.sku].accelerator != "cpu":
                    gpu = f"GPU-{self.made}"
                self.t.add_pod(PodInfo(name, action.sku, now, action.role, gpu), now)
                self.t.pod_ready(name, now + 1.0)
                if gpu is not None:
                    self.t.mark_gpu_verified(gpu, True, now + 1.0)
            else:
                self.t.pod_gone(action.name, now)

    def dispatch(self, now: float) -> list[Lease]:
        leases, self.queue = self.t.claim_all(self.queue, now)
        for got in leases:
            self.t.launched(got.job_id, now)
        return leases

    def run(self, req: ClaimRequest, now: float, clean: bool = True) -> Lease:
        """Submit one job, dispatch it (creating a pod if needed), finish it."""
        self.queue.append(req)
        leases = self.dispatch(now)
        if not leases:
            self.reconcile(now)
            leases = self.dispatch(now + 2.0)
        [got] = leases
        for rel in self.t.release(got.job_id, clean, now + 3.0):
            if rel.retire:
                self.t.pod_gone(rel.name, now + 3.0)
        return got


def test_an_agent_loop_reuses_its_warm_pod_at_every_step() -> None:
    shell = Shell(make_catalog(make_spec(caller_hold_s=60.0)))
    paths = [shell.run(make_request("agent", tag="s"), now=10.0 * i).path for i in range(5)]
    assert paths == ["new", "warm", "warm", "warm", "warm"]
    assert shell.made == 1


def test_a_new_session_runs_once_on_the_old_pod_then_gets_a_fresh_one() -> None:
    shell = Shell(make_catalog(make_spec(caller_hold_s=60.0)))
    shell.run(make_request("agent", tag="s1"), now=0.0)
    second = shell.run(make_request("agent", tag="s2"), now=10.0)
    third = shell.run(make_request("agent", tag="s2"), now=20.0)
    assert (second.path, third.path) == ("recycled", "new")


def test_another_caller_gets_a_standby_on_the_same_gpu_while_the_owner_is_held() -> None:
    spec = make_spec("gpu", max_count=1, standbys_per_active=1, caller_hold_s=60.0)
    shell = Shell(make_catalog(spec, budgets={"h200": 1}))
    first = shell.run(make_request("alice", sku="gpu"), now=0.0)
    shell.reconcile(5.0)  # stages the standby on alice's card
    second = shell.run(make_request("bob", sku="gpu"), now=10.0)
    assert (first.path, second.path) == ("new", "standby")
    assert shell.t.ledger.used("h200") == 1


def test_a_gang_waits_for_capacity_while_single_jobs_behind_it_run() -> None:
    shell = Shell(make_catalog(make_spec(min_count=1, max_count=3)))
    shell.reconcile(0.0)  # the floor: one never-used pod
    gang = make_request("trainer", pods=3)
    small = make_request("agent")
    shell.queue = [gang, small]
    placed = shell.dispatch(10.0)
    assert [got.job_id for got in placed] == [small.job_id]
    assert shell.queue == [gang]
    shell.reconcile(11.0)  # the gang's 3 pods are the demand: 2 more fit under the ceiling
    assert shell.made == 3
