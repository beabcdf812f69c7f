"""Agent settings, read once from the command line, and the pod directory layout.

``python -m pod_runtime.agent --pod-name NAME --pod-dir DIR --listen unix:PATH|tcp:HOST:PORT``
``[--preload a,b] [--no-zygote] [--role active|standby] [--gpu-uuid U]... [--no-network-note]``
``[--sandboxed] [--max-package-bytes N] [--max-extract-bytes N] [--max-files N]``
``[--reset-deadline-s S] [--job-memory-max BYTES] [--job-pids-max N] [--no-cgroups]``
``[--max-log-bytes N] [--fetch-socket PATH]``.
Frozen after start; apart from the agent's secret (``agent_auth.SECRET_ENV``: never on a
command line, which every local user can read) and one test-only fault-injection variable
(``FAULT_ENV``), nothing reads the environment.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pod_runtime.agent_auth import SECRET_ENV
from pod_runtime.archive import ArchiveLimits


@dataclass(frozen=True, slots=True)
class PodLayout:
    """Where things live under the pod directory (docs/architecture.md §1)."""

    root: Path

    @property
    def pkg(self) -> Path:
        """The job's package; emptied by every reset."""
        return self.root / "workspace" / "pkg"

    @property
    def scratch(self) -> Path:
        """The job's TMPDIR and scratch space; emptied by every reset."""
        return self.root / "workspace" / "scratch"

    @property
    def gpu_accounting(self) -> Path:
        """Per-attempt HAMi shared-cache files; emptied by every reset."""
        return self.root / "workspace" / "gpu"

    @property
    def blobs(self) -> Path:
        """Verified packages and requirements files by digest; kept across jobs."""
        return self.root / "cache" / "blobs"

    @property
    def site(self) -> Path:
        """Incrementally installed dependencies (``uv pip install --target``); kept."""
        return self.root / "cache" / "site"

    @property
    def attempts(self) -> Path:
        """Per-attempt files (log, input, result) kept until the result is acknowledged."""
        return self.root / "attempts"

    def wiped(self) -> tuple[Path, ...]:
        return (self.pkg, self.scratch, self.gpu_accounting)

    def create(self) -> None:
        for path in (*self.wiped(), self.blobs, self.site, self.attempts):
            path.mkdir(parents=True, exist_ok=True)


MAX_LOG_BYTES = 64 * 1024 * 1024
"""Default cap on one attempt's log file (the job's stdout+stderr, plus what the agent and an
install wrote there): once the job has ended, a longer log keeps its first and last halves
with one line between them saying how many bytes were dropped (``pod_runtime.log_cap``); the
job is never stopped for its log. The broker copies each log into its own archive, so this
also bounds what one job costs the broker."""

FAULT_ENV = "FIREPOOL_AGENT_FAULT_UNCLEAN_RESETS"
"""A variable the agent reads: a test-only fault injection (see AgentSettings). The other is
its secret, ``agent_auth.SECRET_ENV``."""


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Everything the agent is told at start."""

    pod_name: str
    """The pod's name, reported by /healthz."""
    pod_dir: Path
    """The pod directory; the only tree the pod may write when sandboxed."""
    listen: str
    """``unix:PATH`` or ``tcp:HOST:PORT``."""
    preload: tuple[str, ...] = ()
    """Modules the zygote imports once (must not start threads or touch CUDA)."""
    zygote: bool = True
    """Fork jobs from a warm zygote; False execs a fresh interpreter per job."""
    role: str = "active"
    """``active`` or ``standby`` (a standby loads no GPU library until a job arrives)."""
    gpu_uuids: tuple[str, ...] = ()
    """GPUs this pod may use, pinned by UUID in each job's environment."""
    network: bool = True
    """False with ``--no-network-note``: the launcher gave the pod no network (noted in
    /healthz); http(s) package URLs are fetched through ``fetch_socket`` then, if given."""
    fetch_socket: Path | None = None
    """The broker's package fetch socket (``pool_manager.backends.package_proxy``), bound into
    the sandbox by the launcher: every http(s) package URL is fetched through it, so a pod
    without network (or without the host's loopback) still gets its packages."""
    sandboxed: bool = False
    """Set by ``launch.agent_command`` under bubblewrap: /tmp and /dev/shm are private."""
    job_uid: int | None = None
    """Run every job (and requirements install) as this uid, set by ``launch.agent_command``
    for a sandbox started as root (``pod_runtime.jobuser``); None: as the agent's uid."""
    limits: ArchiveLimits = field(default_factory=ArchiveLimits)
    """Package caps."""
    reset_deadline_s: float = 2.0
    """How long reset waits for the job's tasks (including D state) to die."""
    job_memory_max: int | None = None
    """Per-job ``memory.max`` in bytes, where the cgroup memory controller is available."""
    job_pids_max: int | None = None
    """Per-job ``pids.max``, where the cgroup pids controller is available."""
    cgroups: bool = True
    """Use a per-job cgroup v2 where writable (False: /proc tracking only)."""
    max_log_bytes: int = MAX_LOG_BYTES
    """Cap on each attempt's log file, enforced by the agent (see ``MAX_LOG_BYTES``)."""
    python: str = sys.executable
    """Interpreter for the zygote, exec-mode jobs and dependency installs."""
    fault_unclean_resets: int = 0
    """Fault injection for tests (FIREPOOL_AGENT_FAULT_UNCLEAN_RESETS): this pod's first N
    resets report unclean, as if a job's process had survived SIGKILL, so the broker's
    retire-and-replace path can be exercised end to end. Never set in production."""

    secret: str | None = None
    """What every call but ``GET /healthz`` must carry (``pod_runtime.agent_auth``), from
    ``SECRET_ENV``. Required to listen on TCP; None on a unix socket: no check (the socket's
    directory is the pod's own)."""

    @property
    def layout(self) -> PodLayout:
        return PodLayout(self.pod_dir)


def parse_args(argv: Sequence[str] | None = None) -> AgentSettings:
    parser = argparse.ArgumentParser(prog="pod_runtime.agent")
    parser.add_argument("--pod-name", required=True)
    parser.add_argument("--pod-dir", required=True, type=Path)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--preload", default="")
    parser.add_argument("--no-zygote", action="store_true")
    parser.add_argument("--role", choices=("active", "standby"), default="active")
    parser.add_argument("--gpu-uuid", action="append", default=[])
    parser.add_argument("--no-network-note", action="store_true")
    parser.add_argument("--sandboxed", action="store_true")
    parser.add_argument("--fetch-socket", type=Path, default=None)
    parser.add_argument("--job-uid", type=int, default=None)
    defaults = ArchiveLimits()
    parser.add_argument("--max-package-bytes", type=int, default=defaults.max_compressed)
    parser.add_argument("--max-extract-bytes", type=int, default=defaults.max_written)
    parser.add_argument("--max-files", type=int, default=defaults.max_files)
    parser.add_argument("--reset-deadline-s", type=float, default=2.0)
    parser.add_argument("--job-memory-max", type=int, default=None)
    parser.add_argument("--job-pids-max", type=int, default=None)
    parser.add_argument("--no-cgroups", action="store_true")
    parser.add_argument("--max-log-bytes", type=int, default=MAX_LOG_BYTES)
    args = parser.parse_args(argv)
    if not (args.listen.startswith("unix:") or args.listen.startswith("tcp:")):
        parser.error("--listen must be unix:PATH or tcp:HOST:PORT")
    if args.max_log_bytes < 1:
        parser.error("--max-log-bytes must be positive")
    secret = os.environ.get(SECRET_ENV) or None
    if secret is None and args.listen.startswith("tcp:"):
        parser.error(f"an agent on TCP needs its secret in {SECRET_ENV}")
    return AgentSettings(
        pod_name=args.pod_name,
        pod_dir=args.pod_dir.resolve(),
        listen=args.listen,
        preload=tuple(m.strip() for m in args.preload.split(",") if m.strip()),
        zygote=not args.no_zygote,
        role=args.role,
        gpu_uuids=tuple(u for u in args.gpu_uuid if u),
        network=not args.no_network_note,
        sandboxed=args.sandboxed,
        fetch_socket=args.fetch_socket,
        job_uid=args.job_uid,
        limits=ArchiveLimits(
            max_compressed=args.max_package_bytes,
            max_written=args.max_extract_bytes,
            max_files=args.max_files,
        ),
        reset_deadline_s=args.reset_deadline_s,
        job_memory_max=args.job_memory_max,
        job_pids_max=args.job_pids_max,
        cgroups=not args.no_cgroups,
        max_log_bytes=args.max_log_bytes,
        fault_unclean_resets=int(os.environ.get(FAULT_ENV, "0") or 0),
        secret=secret,
    )
