"""A steady load and an exact census of a broker's pods, for the rollout tests (local pods
and the emulated cluster): ``Load`` invokes back to back from several callers, ``Census``
replays the tracker's transitions for the most pods and retiring pods at any moment."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pool_manager.model import PodInfo
from pool_manager.tracker import Tracker
from tests.helpers import ThreadedBroker


class Census:
    """Every pod the tracker adds, and every transition it logs, in one order: replayed,
    the pods of the pool and the retiring ones at every moment (not a sample)."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        add = tracker.add_pod

        def add_pod(pod: PodInfo, now: float, *, reserved: bool = True) -> bool:
            # recorded first: a pod is counted from before it exists (never missed)
            tracker.log.record(now, pod.name, "-", "STARTING", "added")
            return add(pod, now, reserved=reserved)

        tracker.add_pod = add_pod  # type: ignore[method-assign]

    def peaks(self) -> tuple[int, dict[str, str]]:
        """``(most pods at once, the most retiring at once: pod -> why)``."""
        live: set[str] = set()
        retiring: dict[str, str] = {}
        most, most_retiring = 0, {}
        for _, name, _, new, why in list(self.tracker.log):
            if new == "STARTING" or new == "IDLE":
                live.add(name)
            if new == "RETIRING":
                retiring[name] = why
            if new == "DELETED":
                live.discard(name)
                retiring.pop(name, None)
            most = max(most, len(live))
            if len(retiring) > len(most_retiring):
                most_retiring = dict(retiring)
        return most, most_retiring


class Load:
    """``callers`` threads invoking ``noop`` back to back (no think time), each with its own
    lease tag, until ``stop``; every job's final state is kept."""

    def __init__(self, server: ThreadedBroker, callers: int) -> None:
        self.states: list[str] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(server, f"caller-{i}"), daemon=True)
            for i in range(callers)
        ]
        for thread in self._threads:
            thread.start()

    def _loop(self, server: ThreadedBroker, caller: str) -> None:
        try:
            with server.client(caller) as fp:
                step = 0
                while not self._stop.is_set():
                    job: dict[str, Any] = fp.invoke("noop", step, lease_tag=caller)
                    self.states.append(job["state"])
                    step += 1
        except BaseException as exc:  # reported by stop()
            self.errors.append(exc)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
        assert not self.errors, self.errors


def wait(what: str, done: Callable[[], Any], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
