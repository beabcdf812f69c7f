"""Per-job cgroups where cgroup v2 is writable: tracking, limits, ``cgroup.kill``, OOM.

Detection never assumes a layout: the v2 mount comes from /proc/self/mountinfo (here it is
``/sys/fs/cgroup/unified`` beside v1 controllers; on a pure v2 host ``/sys/fs/cgroup``), the
process's own v2 path from /proc/self/cgroup, and the controllers from ``cgroup.controllers``.

Layout: ``<v2>/<launcher's cgroup>/firepool/<pod>-<dir hash>/agent`` holds the agent and
zygote (the launcher moves the pod there before exec, see ``launch``); each job gets a sibling
``job-<n>``, so the common ancestor of every move is the pod's cgroup, the one tree the
sandbox may write. With the ``memory`` / ``pids`` controllers available (not on this host),
jobs get ``memory.max`` / ``pids.max`` and ``memory.oom.group``, and an ``oom_kill`` event
is reported as OOM. The pod's cgroup is named by its name and a hash of its directory
(``pod_cgroup_name``): two brokers, or two test clusters, started from one shell share the
launcher's cgroup and may each have a pod ``cpu-1``; deleting one must not kill the other.
Without a writable v2 hierarchy ``JobCgroups.open`` returns None and the agent tracks jobs
through /proc alone (subreaper + sessions).

Blocking file writes of a few bytes; called on the event loop. One ``JobCgroups`` per agent.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path


def v2_mount() -> Path | None:
    """Mount point of the cgroup v2 hierarchy, if mounted."""
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"]:
                    return Path(left.split()[4])
    except OSError:
        pass
    return None


def v1_controllers() -> list[str]:
    """Controllers mounted as cgroup v1 hierarchies (reported only; jobs use v2)."""
    found: set[str] = set()
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                _, _, right = line.partition(" - ")
                fields = right.split()
                if fields[:1] == ["cgroup"] and len(fields) >= 3:
                    found.update(o for o in fields[2].split(",") if o not in ("rw", "ro"))
    except OSError:
        pass
    return sorted(found)


def own_v2_path() -> str | None:
    """This process's path in the v2 hierarchy (the ``0::`` line of /proc/self/cgroup)."""
    try:
        with open("/proc/self/cgroup") as own:
            for line in own:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def pod_cgroup_name(pod_dir: Path) -> str:
    """The name of the cgroup of the pod living in ``pod_dir``: its directory's name and a
    hash of its absolute path, unique per pod on this host (pod names are unique per broker
    only). The sandbox binds ``pod_dir`` at the same path, so the agent inside computes the
    same name."""
    where = os.fsencode(Path(pod_dir).resolve())
    return f"{Path(pod_dir).name}-{hashlib.blake2b(where, digest_size=5).hexdigest()}"


def pod_cgroup_dir(pod_dir: Path) -> Path | None:
    """Where the cgroup of the pod in ``pod_dir`` goes (``None`` unless v2 is writable and
    has cgroup.kill)."""
    mount, own = v2_mount(), own_v2_path()
    if mount is None or own is None:
        return None
    base = mount / own.lstrip("/")
    if not os.access(base, os.W_OK) or not (base / "cgroup.procs").exists():
        return None
    return base / "firepool" / pod_cgroup_name(pod_dir)


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class JobLimits:
    memory_max: int | None = None
    """Bytes; needs the memory controller."""
    pids_max: int | None = None
    """Tasks; needs the pids controller."""


class JobCgroups:
    """The pod's cgroup and its job children (see module docstring)."""

    def __init__(self, pod: Path, limits: JobLimits) -> None:
        self.pod = pod
        self.limits = limits
        self.controllers = set((pod / "cgroup.controllers").read_text().split())
        if self.controllers & {"memory", "pids"}:
            wanted = " ".join(f"+{c}" for c in sorted(self.controllers & {"memory", "pids"}))
            _write(pod / "cgroup.subtree_control", wanted)
        self.enabled = {c.lstrip("+") for c in (pod / "cgroup.subtree_control").read_text().split()}
        self.can_kill = (pod / "cgroup.kill").exists()
        self.current: Path | None = None
        self.prepared: Path | None = None
        self._prefix = f"job-{secrets.token_hex(4)}-"
        self._seq = 0

    @classmethod
    def open(cls, pod_dir: Path, limits: JobLimits = JobLimits()) -> JobCgroups | None:
        """The pod cgroup if this agent already sits in its ``.../<pod cgroup>/agent``
        (launched by ``launch``), else try to create one and move in (works unsandboxed as
        root)."""
        mount, own = v2_mount(), own_v2_path()
        if mount is None or own is None:
            return None
        here = mount / own.lstrip("/")
        if here.name == "agent" and here.parent.name == pod_cgroup_name(pod_dir):
            pod = here.parent
        else:
            target = pod_cgroup_dir(pod_dir)
            if target is None:
                return None
            try:
                (target / "agent").mkdir(parents=True, exist_ok=True)
            except OSError:
                return None
            if not _write(target / "agent" / "cgroup.procs", str(os.getpid())):
                return None
            pod = target
        if not os.access(pod, os.W_OK):
            return None
        try:
            return cls(pod, limits)
        except OSError:
            return None

    def describe(self) -> str:
        v1 = ",".join(v1_controllers()) or "none"
        return (
            f"cgroup v2 at {self.pod} (controllers: {sorted(self.enabled) or 'none'}, "
            f"cgroup.kill: {self.can_kill}); v1 controllers (unused): {v1}"
        )

    def _create(self) -> Path | None:
        self._seq += 1
        path = self.pod / f"{self._prefix}{self._seq}"
        try:
            path.mkdir()
        except OSError:
            return None
        if "memory" in self.enabled:
            _write(path / "memory.oom.group", "1")
            if self.limits.memory_max:
                _write(path / "memory.max", str(self.limits.memory_max))
        if "pids" in self.enabled and self.limits.pids_max:
            _write(path / "pids.max", str(self.limits.pids_max))
        return path

    def prepare(self) -> str | None:
        """Create the next job's cgroup ahead of time (while idle) so the zygote's spare can
        join it early: moving a task between cgroups waits for an RCU grace period, which
        takes milliseconds on an idle machine. Reset leaves the prepared cgroup alone."""
        if self.prepared is None:
            self.prepared = self._create()
        return str(self.prepared / "cgroup.procs") if self.prepared is not None else None

    def new_job(self, attempt_id: str) -> str | None:
        """The job's cgroup (the prepared one, else a new one); return its ``cgroup.procs``."""
        path, self.prepared = self.prepared, None
        if path is None:
            path = self._create()
        self.current = path
        return str(path / "cgroup.procs") if path is not None else None

    def _jobs(self) -> list[Path]:
        """Job cgroups, except the prepared one (it holds only the zygote's spare)."""
        try:
            return [
                p
                for p in self.pod.iterdir()
                if p.name.startswith(self._prefix) and p != self.prepared
            ]
        except OSError:
            return []

    def pids(self) -> set[int]:
        found: set[int] = set()
        for job in self._jobs():
            with contextlib.suppress(OSError, ValueError):
                found.update(int(x) for x in (job / "cgroup.procs").read_text().split())
        found.discard(0)
        return found

    def kill(self) -> None:
        """``cgroup.kill`` every job cgroup (SIGKILL to all members, race-free vs fork)."""
        if self.can_kill:
            for job in self._jobs():
                _write(job / "cgroup.kill", "1")

    def oom_killed(self) -> bool:
        if self.current is None or "memory" not in self.enabled:
            return False
        with contextlib.suppress(OSError, ValueError):
            for line in (self.current / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        return False

    def remove_empty(self) -> list[str]:
        """rmdir every job cgroup; return those that are still populated."""
        stuck = []
        for job in self._jobs():
            try:
                job.rmdir()
            except OSError:
                stuck.append(job.name)
        if self.current is not None and not self.current.exists():
            self.current = None
        return stuck


def kill_pod(pod_dir: Path, wait_s: float = 2.0) -> bool:
    """For a backend deleting the pod in ``pod_dir``: ``cgroup.kill`` its whole cgroup
    (agent, zygote, jobs, whatever namespace they are in), wait until it is empty and remove
    it. True when gone."""
    pod = pod_cgroup_dir(pod_dir)
    if pod is None or not pod.exists():
        return True
    _write(pod / "cgroup.kill", "1")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            children = sorted((p for p in pod.rglob("*") if p.is_dir()), reverse=True)
        except OSError:  # a job cgroup removed (by the agent's reset) while listed
            children = []
        for child in [*children, pod]:
            with contextlib.suppress(OSError):
                child.rmdir()
        if not pod.exists():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
