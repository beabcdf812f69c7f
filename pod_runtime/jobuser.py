"""The unprivileged user a sandboxed pod runs its jobs as.

A sandbox the broker starts as root runs its agent as uid 0 with only ``AGENT_CAPABILITIES``,
and every job process (and a requirements install, whose build code is the user's too) as
``JOB_UID`` with no capabilities at all: the job then cannot signal, trace or replace its
agent and zygote, rewrite the pod's kept caches (verified packages, installed
dependencies), read files that only root may read, nor pass a unix socket's peer-uid check
as root. bwrap sets ``no_new_privs``, so no setuid binary gives root back.

What the job may write is handed to it for each attempt (``hand_over``): its package
directory (its cwd), scratch (``TMPDIR`` and ``HOME``), the GPU accounting directory and its
attempt's ``out`` directory; the pod-private ``/tmp`` and ``/dev/shm`` are world-writable
with the sticky bit. A reset takes those back by emptying them (the agent may, with
``CAP_DAC_OVERRIDE``), and everything the agent reads from them it opens without following
a symlink (``open_job_file``).

Without root or without the sandbox nothing changes hands: jobs run as the agent's user.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, NoReturn

from pod_runtime.job_main import drop_to, refuse_syscalls

JOB_UID = 65534
"""``nobody`` (and gid ``nogroup``) on Debian and most distributions; no file is its own."""

AGENT_CAPABILITIES = (
    "CAP_SETUID",  # to start each job (and an install) as JOB_UID
    "CAP_SETGID",
    "CAP_KILL",  # to kill a job's processes, which are not its own uid's
    "CAP_CHOWN",  # to hand over a job's directories and take the installed deps back
    "CAP_DAC_OVERRIDE",  # to empty what a job made unreadable (chmod 000) at the reset
    "CAP_FOWNER",  # to chmod and unlink a job's files in sticky /tmp and /dev/shm
)
"""What the agent keeps of root, in the sandbox's bounding set; a job keeps none of it."""


def hand_over(paths: Iterable[Path], uid: int) -> None:
    """Give each directory in ``paths`` (not its contents) to ``uid``."""
    for path in paths:
        os.chown(path, uid, uid, follow_symlinks=False)


def hand_over_tree(top: Path, uid: int) -> None:
    """Give ``top`` and everything under it to ``uid``, never following a symlink. Only
    while no process of ``uid`` runs (before a requirements install), so none can swap a
    directory for a symlink to lead the walk elsewhere."""
    _chown_tree(top, uid)


def take_back(top: Path) -> None:
    """Make ``top`` and everything under it root's again and writable by root alone (group
    and other write bits cleared: an install can leave its tree 0777 and its files 0666 for
    every later job to rewrite), never following a symlink (a swap raced into the walk
    could only give root more files, nothing to ``uid``)."""
    _chown_tree(top, 0, seal=True)


def _chown_tree(top: Path, uid: int, seal: bool = False) -> None:
    for path in [str(top), *_below(top)]:
        os.chown(path, uid, uid, follow_symlinks=False)
        if seal:
            mode = os.lstat(path).st_mode
            if not stat.S_ISLNK(mode) and mode & 0o022:
                os.chmod(path, stat.S_IMODE(mode) & ~0o022)


def _below(top: Path) -> list[str]:
    return [os.path.join(here, n) for here, dirs, files in os.walk(top) for n in (*dirs, *files)]


def open_job_file(path: Path) -> BinaryIO:
    """Open a file a job wrote, for reading: never through a symlink it planted (the agent
    may read what the job may not), and never a FIFO or device that would block or lie."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(f"{path} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def usable_by(uid: int, pod_dir: Path, paths: Iterable[str]) -> str | None:
    """Whether a job run as ``uid`` can work in this sandbox: None if so, else what it could
    not reach. Gives ``pod_dir`` to others to traverse (``o+x``: a fresh state directory is
    0700), then asks, in a child dropped to ``uid``, for the pod directory and each of
    ``paths`` (the interpreter and its import path, which a checkout or virtual environment
    in a private directory keeps from it). Called once at the agent's start, before any
    thread or event loop: a fork costs about 2 ms."""
    os.chmod(pod_dir, stat.S_IMODE(os.stat(pod_dir).st_mode) | 0o011)
    wanted = [(str(pod_dir), os.X_OK)]
    wanted += [(p, os.R_OK | os.X_OK) for p in paths if p and os.path.exists(p)]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop, ask, report the first path it cannot reach, exit
        os.close(read)
        try:
            drop_to(uid)
            blocked = next((p for p, mode in wanted if not os.access(p, mode)), "")
        except BaseException as exc:
            blocked = f"cannot become uid {uid}: {exc!r}"
        os.write(write, blocked.encode()[:4096])
        os._exit(0)
    os.close(write)
    try:
        answer = os.read(read, 4096).decode(errors="replace")
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return answer or None


def as_job_user(argv: list[str], uid: int | None, python: str) -> list[str]:
    """``argv`` run as ``uid`` (through this module's ``main``); ``argv`` itself for None."""
    if uid is None:
        return argv
    return [python, "-P", "-m", "pod_runtime.jobuser", str(uid), "--", *argv]


def main() -> NoReturn:
    """``python -m pod_runtime.jobuser UID -- ARGV...``: drop to UID, then exec ARGV."""
    uid, sep, *argv = sys.argv[1:]
    if sep != "--" or not argv:
        raise SystemExit("usage: python -m pod_runtime.jobuser UID -- ARGV...")
    drop_to(int(uid))
    refuse_syscalls()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
