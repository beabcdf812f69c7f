"""CPU seconds of processes, from /proc: one process, or a whole process tree.

A process's own CPU is ``utime + stime`` (all its threads). A tree's CPU adds, for every live
member, ``cutime + cstime``: the CPU of the children it has reaped. A pod's short-lived job
processes are reaped by its zygote, so their CPU shows in the zygote's ``cutime`` once they
exit; the difference of two readings of a tree is the CPU its processes spent in between
(a member that exits in between takes its own CPU with it unless its parent, in the tree,
reaped it). Linux's resolution is one clock tick (``SC_CLK_TCK``, usually 10 ms), so
divide a difference over many calls, never one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from pod_runtime import proctree

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _ticks(pid: int) -> tuple[int, int] | None:
    """``(own, reaped children)`` ticks of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    # fields[0] is field 3 (state): utime, stime, cutime, cstime are fields 14-17
    own = int(fields[11]) + int(fields[12])
    reaped = int(fields[13]) + int(fields[14])
    return own, reaped


def process_cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` itself has used (0.0 if it is gone)."""
    ticks = _ticks(pid)
    return ticks[0] * TICK_S if ticks is not None else 0.0


def tree_cpu_s(roots: Iterable[int]) -> float:
    """CPU seconds of every live process in the trees under ``roots`` (roots included),
    with the CPU of the children each has reaped."""
    procs = proctree.scan()
    members: set[int] = set()
    for root in roots:
        if root in procs:
            members.add(root)
            members |= proctree.descendants(procs, root)
    total = 0
    for pid in members:
        ticks = _ticks(pid)
        if ticks is not None:
            total += ticks[0] + ticks[1]
    return total * TICK_S
