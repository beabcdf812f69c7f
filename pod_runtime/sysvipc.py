"""System V IPC objects a job leaves behind (shared memory, message queues, semaphores).

They outlive the processes that made them and live in the IPC namespace, not in /dev/shm, so
wiping /dev/shm does not remove them. A sandboxed pod has its own IPC namespace: every object
listed in /proc/sysvipc there is the pod's, and reset removes them all with ``IPC_RMID``.
Unsandboxed, the namespace is the host's and nothing is touched. Blocking, tiny; called from
the reset's wipe thread.

Objects a job made as its own uid (``pod_runtime.jobuser``) only that uid may remove (or
``CAP_SYS_ADMIN``, which the agent does not keep): the reset first runs
``python -m pod_runtime.sysvipc --as-uid N``, which drops to that uid and removes them.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

IPC_RMID = 0
KINDS = ("shm", "msg", "sem")


def _ids(kind: str, root: Path) -> list[int]:
    """Object ids from /proc/sysvipc/<kind> (the second column of each row)."""
    try:
        rows = (root / kind).read_text().splitlines()[1:]
    except OSError:
        return []
    ids = []
    for row in rows:
        fields = row.split()
        if len(fields) > 1 and fields[1].isdigit():
            ids.append(int(fields[1]))
    return ids


def listing(root: Path = Path("/proc/sysvipc")) -> dict[str, list[int]]:
    return {kind: _ids(kind, root) for kind in KINDS}


def remove_all(root: Path = Path("/proc/sysvipc")) -> list[str]:
    """Remove every System V IPC object visible here; return those that would not go."""
    found = listing(root)
    if not any(found.values()):
        return []
    libc = ctypes.CDLL(None, use_errno=True)  # the libc already loaded (no ldconfig lookup)
    removers = {
        "shm": lambda i: libc.shmctl(i, IPC_RMID, None),
        "msg": lambda i: libc.msgctl(i, IPC_RMID, None),
        "sem": lambda i: libc.semctl(i, 0, IPC_RMID),
    }
    problems = []
    for kind, ids in found.items():
        for ident in ids:
            if removers[kind](ident) != 0:
                problems.append(f"sysv {kind} {ident}: errno {ctypes.get_errno()}")
    return problems


def main() -> None:
    """``python -m pod_runtime.sysvipc [--as-uid N]``: remove every object (as uid N); print
    what would not go, one per line, and exit 1 if anything would not."""
    parser = argparse.ArgumentParser(prog="pod_runtime.sysvipc")
    parser.add_argument("--as-uid", type=int, default=None)
    args = parser.parse_args()
    if args.as_uid is not None:
        from pod_runtime.job_main import drop_to

        drop_to(args.as_uid)
    problems = remove_all()
    for problem in problems:
        print(problem, file=sys.stderr)
    raise SystemExit(1 if problems else 0)


if __name__ == "__main__":
    main()
