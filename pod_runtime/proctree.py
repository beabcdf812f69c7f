"""Finding, killing and verifying the death of a job's whole process tree via /proc.

Which processes are the job's: every descendant of the agent except the agent and its zygote
(the agent and the zygote are child subreapers, so double-forked and ``setsid`` daemons
reparent to them instead of escaping to init), every process in a session the job started,
and every member of the job's cgroup when there is one. A zombie (``Z``) or dead (``X``) task
counts as gone; a task in uninterruptible sleep (``D``) gets a bounded wait.

``terminate`` is a coroutine so the agent's SIGCHLD reaper runs between polls (reaping the
zombies that reparented to the agent). The ``kill`` function is injectable: tests use it to
simulate a process that survives SIGKILL (see tests/pod_runtime/test_escape.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

GONE_STATES = frozenset({"Z", "X", "x"})
KillFn = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Proc:
    """One line of /proc/PID/stat, the fields we need."""

    pid: int
    ppid: int
    state: str
    pgid: int
    sid: int


def read_proc(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return Proc(pid, int(fields[1]), fields[0].decode(), int(fields[2]), int(fields[3]))


def scan() -> dict[int, Proc]:
    """Every task visible in /proc (tasks that vanish mid-scan are skipped)."""
    procs: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = read_proc(int(name))
            if proc is not None:
                procs[proc.pid] = proc
    return procs


def descendants(procs: dict[int, Proc], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


@dataclass(slots=True)
class JobScope:
    """What identifies one pod's job processes; ``exclude`` is the agent's own helpers."""

    agent_pid: int
    exclude: set[int]
    sessions: set[int]
    cgroup_pids: Callable[[], set[int]] | None = None

    def find(self) -> dict[int, Proc]:
        """The job's tasks that are still alive (not zombies), by pid."""
        procs = scan()
        pids = descendants(procs, self.agent_pid)
        pids.update(p.pid for p in procs.values() if p.sid in self.sessions)
        if self.cgroup_pids is not None:
            pids.update(self.cgroup_pids())
        pids -= self.exclude
        pids.discard(self.agent_pid)
        return {
            pid: procs[pid] for pid in pids if pid in procs and procs[pid].state not in GONE_STATES
        }


def kill_all(pids: Iterable[int], kill: KillFn = os.kill) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


async def terminate(
    scope: JobScope,
    *,
    kill: KillFn = os.kill,
    extra_kill: Callable[[], None] | None = None,
    deadline_s: float = 2.0,
) -> tuple[int, dict[int, Proc]]:
    """SIGKILL the job's tree until /proc shows none alive; return (killed, survivors).

    Repeats find+kill (a fork bomb adds tasks between passes) until nothing is alive or the
    deadline passes; survivors are what is left then (typically ``D`` state or unkillable).
    """
    start = time.monotonic()
    killed: set[int] = set()
    pause = 0.0005
    while True:
        alive = scope.find()
        if not alive:
            return len(killed), {}
        if time.monotonic() - start > deadline_s:
            return len(killed), alive
        if extra_kill is not None:
            extra_kill()
        kill_all(alive, kill)
        killed.update(alive)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.02)


def describe(survivors: dict[int, Proc]) -> str:
    shown = ", ".join(
        f"{p.pid} ({p.state}{', uninterruptible' if p.state == 'D' else ''})"
        for p in list(survivors.values())[:5]
    )
    more = f" and {len(survivors) - 5} more" if len(survivors) > 5 else ""
    return f"{len(survivors)} job process(es) survived SIGKILL: {shown}{more}"
