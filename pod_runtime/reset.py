"""Verified reset between jobs (paper §5 rule 3, A.3).

Order: kill the job's whole tree and verify via /proc that none of it is alive (bounded wait
for ``D`` state), then empty the package directory, scratch, per-attempt GPU accounting, the
pod-private ``/tmp`` and ``/dev/shm`` (only when sandboxed: unsandboxed they are the host's),
and any extra directory the broker names (never following a symlink: each wiped directory,
and each one leading to it inside the pod, is made a real, owner-writable directory first);
then (with NVML) wait briefly for the GPUs' compute processes to go. ``clean`` is True only
if every step was confirmed; ``reason`` says what was not. An unclean pod must be deleted by
the broker, never reused.

Runs on the event loop; a wipe of more than ``INLINE_ENTRIES`` entries runs in a worker
thread. One reset at a time (the agent holds its attempt lock around it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from functions.errors import InvalidRequest
from pod_runtime import proctree, sysvipc
from pod_runtime.cgroups import JobCgroups
from pod_runtime.protocol import safe_text
from pod_runtime.settings import PodLayout

PRIVATE_TMPFS = (Path("/tmp"), Path("/dev/shm"))
WIPE_THREADS = 4
INLINE_ENTRIES = 64
"""A wipe of at most this many entries (what a small job leaves: its package, a few files)
runs on the event loop: unlinking them takes well under a millisecond, less than handing the
work to a worker thread and back, which on a busy machine costs two scheduler wake-ups. A
larger one, or one the count cannot bound, runs in a worker thread."""


@dataclass(frozen=True, slots=True)
class ResetReport:
    clean: bool
    reason: str
    duration_ms: float
    killed: int = 0

    def to_json(self) -> dict[str, object]:
        return {"clean": self.clean, "reason": self.reason, "duration_ms": self.duration_ms}


def mount_points() -> list[Path]:
    """Every mount point this process sees (from /proc/self/mountinfo)."""
    points = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                points.append(Path(fields[4].replace("\\040", " ")))
    return points


def restore_dir(path: Path, base: Path | None = None) -> list[str]:
    """Make ``path`` a real directory its owner may write, never following a symlink: each
    component below ``base`` (just ``path`` itself without one) that a job replaced by a
    symlink or a file is unlinked and made a directory again, a missing one is created, and
    one that lost its owner's ``rwx`` (a job's ``chmod 0500`` on ``workspace/scratch``)
    gets it back. Runs after the job's processes are verified dead, so nothing swaps a
    component between its ``lstat`` and its use. Returns what could not be restored."""
    parts = [path]
    if base is not None and path != base and path.is_relative_to(base):
        below = path.relative_to(base).parts
        parts = [base.joinpath(*below[: i + 1]) for i in range(len(below))]
    for part in parts:
        try:
            try:
                info = os.lstat(part)
            except FileNotFoundError:
                os.mkdir(part, 0o755)
                continue
            if not stat.S_ISDIR(info.st_mode):  # a symlink (never followed) or a file
                os.unlink(part)
                os.mkdir(part, 0o755)
            elif info.st_mode & 0o700 != 0o700:
                os.chmod(part, stat.S_IMODE(info.st_mode) | 0o700)
        except OSError as exc:
            return [f"{safe_text(str(part))}: {exc.strerror}"]
    return []


def empty_dir(path: Path, keep: Path | Collection[Path] | None = None) -> list[str]:
    """Remove everything inside ``path`` (not ``path`` itself) except what ``keep`` names and
    the directories leading to it (the pod directory, or a checkout the launcher bound back
    in, are mounts inside the private /tmp when they live under /tmp); return what could not
    be removed."""
    keeps = [keep] if isinstance(keep, Path) else list(keep or ())
    problems: list[str] = []
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        path.mkdir(parents=True, exist_ok=True)
        return problems
    except OSError as exc:
        return [f"{path}: {exc.strerror}"]
    trees: list[str] = []
    for entry in entries:
        here = Path(entry.path)
        inside = [k for k in keeps if k.is_relative_to(here)]
        if inside:
            if here not in inside:
                problems += empty_dir(here, inside)
            continue
        if entry.is_dir(follow_symlinks=False):
            trees.append(entry.path)
            continue
        try:
            os.unlink(entry.path)
        except OSError as exc:
            problems.append(f"{entry.path}: {exc.strerror}")
    if len(trees) > 1:  # unlinks in different directories overlap well on a slow disk
        with ThreadPoolExecutor(min(len(trees), WIPE_THREADS)) as pool:
            for found in pool.map(_remove_tree, trees):
                problems += found
    elif trees:
        problems += _remove_tree(trees[0])
    return problems


def entries_within(paths: Collection[Path], limit: int, keep: Collection[Path] = ()) -> bool:
    """Whether the trees below ``paths`` hold at most ``limit`` entries in all (``limit + 1``
    reads at most: a tree of any size is bounded in time). Counts as ``empty_dir`` walks:
    the directories leading to a kept path are entered, not counted; symlinks are never
    followed. A directory that cannot be read counts as over the limit (the wipe then runs
    in a thread and reports it)."""
    left = limit
    stack = list(paths)
    while stack:
        try:
            with os.scandir(stack.pop()) as listing:
                for entry in listing:
                    here = Path(entry.path)
                    if any(k.is_relative_to(here) for k in keep):
                        if here not in keep:
                            stack.append(here)
                        continue
                    left -= 1
                    if left < 0:
                        return False
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(here)
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return True


def _remove_tree(top: str) -> list[str]:
    """Delete a directory tree. Runs only after the job's processes are verified dead, so
    nothing swaps a directory for a symlink meanwhile; symlinks are unlinked, never
    followed (``d_type`` from ``scandir``, no extra stat). Falls back to ``shutil.rmtree``
    (which also makes read-only directories writable) when the fast path fails."""
    try:
        stack, dirs = [top], []
        while stack:
            current = stack.pop()
            dirs.append(current)
            with os.scandir(current) as listing:
                for entry in listing:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        os.unlink(entry.path)
        for directory in reversed(dirs):
            os.rmdir(directory)
        return []
    except OSError:
        try:
            shutil.rmtree(top, onerror=_make_writable_and_retry)
        except OSError as exc:
            return [f"{top}: {exc.strerror}"]
        return []


def _make_writable_and_retry(func: Callable[..., object], path: str, exc_info: Any) -> None:
    """A job may leave read-only directories; the agent may lack CAP_DAC_OVERRIDE."""
    if not isinstance(exc_info[1], PermissionError):
        raise exc_info[1]
    os.chmod(os.path.dirname(path), 0o700)
    if func is os.rmdir or func is os.unlink:
        func(path)
    else:  # scandir/open of an unreadable directory: make it readable and start over
        os.chmod(path, 0o700)
        shutil.rmtree(path, onerror=_make_writable_and_retry)


class Resetter:
    """Resets one pod. ``kill`` and ``gpu_check`` are injectable for tests."""

    def __init__(
        self,
        layout: PodLayout,
        *,
        sandboxed: bool,
        deadline_s: float = 2.0,
        kill: proctree.KillFn = os.kill,
        gpu_check: Callable[[], Awaitable[str | None]] | None = None,
        cgroups: JobCgroups | None = None,
        fault_unclean_resets: int = 0,
        remove_job_ipc: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.cgroups = cgroups
        self.remove_job_ipc = remove_job_ipc
        """Removes the SysV objects of jobs run as another uid (``pod_runtime.sysvipc``),
        before the wipe, which reports any left."""
        self.faults_left = fault_unclean_resets
        self.layout = layout
        self.sandboxed = sandboxed
        self.deadline_s = deadline_s
        self.kill = kill
        self.gpu_check = gpu_check
        self._keep: list[Path] | None = None

    def allowed_wipe(self, raw: str) -> Path:
        """A broker-named wipe path must be an absolute directory inside the pod's own trees."""
        path = Path(raw)
        if not path.is_absolute():
            raise InvalidRequest(f"wipe path {raw!r} is not absolute", field="wipe")
        resolved = path.resolve()
        roots = [self.layout.root.resolve()]
        if self.sandboxed:
            roots += list(PRIVATE_TMPFS)
        if not any(resolved == r or resolved.is_relative_to(r) for r in roots):
            raise InvalidRequest(f"wipe path {raw!r} is outside the pod", field="wipe")
        if resolved == self.layout.root.resolve():
            raise InvalidRequest("the pod directory itself cannot be wiped", field="wipe")
        return resolved

    def _targets(self, extra: Sequence[Path]) -> tuple[Path, list[Path], list[Path]]:
        """The pod's resolved root, what a reset empties and what it keeps (the pod
        directory, and mounts the launcher put inside the private tmpfs: static, so read
        from /proc once)."""
        root = self.layout.root.resolve()  # below it, each component is checked, not followed
        targets = [*PodLayout(root).wiped(), *extra]
        if self.sandboxed:
            targets += list(PRIVATE_TMPFS)
        if self._keep is None:
            self._keep = [root]
            if self.sandboxed:
                self._keep += [
                    m
                    for m in mount_points()
                    if m not in PRIVATE_TMPFS and any(m.is_relative_to(t) for t in PRIVATE_TMPFS)
                ]
        return root, targets, self._keep

    def _wipe(self, extra: Sequence[Path]) -> list[str]:
        root, targets, keep = self._targets(extra)
        problems: list[str] = []
        for target in targets:
            restored = restore_dir(target, root if target.is_relative_to(root) else None)
            problems += restored or empty_dir(target, keep)
        if self.sandboxed:  # the pod's own IPC namespace: its SysV objects are the jobs'
            problems += sysvipc.remove_all()
        return problems

    async def _wipe_soon(self, extra: Sequence[Path]) -> list[str]:
        """``_wipe``, on the event loop when the trees hold at most ``INLINE_ENTRIES`` in
        all (what a small job leaves: no thread hand-off), else in a worker thread. Runs
        after the job's processes are verified dead: nothing adds entries between the
        count and the wipe."""
        _, targets, keep = self._targets(extra)
        if entries_within(targets, INLINE_ENTRIES, keep):
            return self._wipe(extra)
        return await asyncio.to_thread(self._wipe, extra)

    async def reset(
        self,
        scope: proctree.JobScope,
        *,
        wipe: Sequence[str] = (),
    ) -> ResetReport:
        start = time.perf_counter()
        extra = [self.allowed_wipe(p) for p in wipe]
        reasons: list[str] = []
        extra_kill = self.cgroups.kill if self.cgroups is not None else None
        killed, survivors = await proctree.terminate(
            scope, kill=self.kill, extra_kill=extra_kill, deadline_s=self.deadline_s
        )
        if survivors:
            reasons.append(proctree.describe(survivors))
        elif self.cgroups is not None:
            stuck = self.cgroups.remove_empty()
            if stuck:
                reasons.append(f"job cgroup(s) still populated: {', '.join(stuck)}")
        if self.sandboxed and self.remove_job_ipc is not None:
            await self.remove_job_ipc()
        problems = await self._wipe_soon(extra)
        if problems:
            shown = "; ".join(safe_text(p) for p in problems[:3])
            reasons.append(f"{len(problems)} path(s) could not be removed: {shown}")
        if self.gpu_check is not None:
            gpu_problem = await self.gpu_check()
            if gpu_problem:
                reasons.append(gpu_problem)
        duration_ms = (time.perf_counter() - start) * 1000.0
        if self.faults_left > 0:
            self.faults_left -= 1
            reasons.append("fault injected: a job process survived SIGKILL (simulated)")
        return ResetReport(
            clean=not reasons,
            reason="; ".join(reasons) if reasons else "clean",
            duration_ms=round(duration_ms, 3),
            killed=killed,
        )
