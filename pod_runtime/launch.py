"""The argv a local backend spawns for one pod: the agent, inside bubblewrap where it works.

The local backend spawns the returned argv with ``start_new_session=True`` and never waits on
the pod (pods outlive the broker, like Kubernetes pods, so ``--die-with-parent`` is not set).

The sandbox (``bwrap``, run as root here): new PID, mount, IPC and UTS namespaces and session;
kernel settings under ``/proc`` read-only (``PROC_READ_ONLY``, ``PROC_HIDDEN``);
``/`` read-only (the venv included); a minimal ``/dev`` plus the NVIDIA device nodes; private
tmpfs ``/tmp``, ``/dev/shm`` and package directory (``workspace/pkg``, unpacked on every job,
so kept in memory); the broker's state directory and its user's home replaced by empty
ones (``hidden``: the signing key, job store, packages, logs, the other pods, every pod's
metadata and the operator's credentials are out of sight; the interpreter and code are bound
back read-only, parent before child, ``_layered_mounts``); the host's root-only files and its
unix sockets masked (``host_secrets``); the pod directory is the only writable tree; all
capabilities dropped but, in a sandbox started as root, the few the agent needs to run its
jobs as an unprivileged uid (``jobuser``); the network of ``network`` (``pod_runtime.network``:
``none`` = ``--unshare-net``, ``outbound`` = a namespace pasta configures, the launcher step
``python -m pod_runtime.network`` before bwrap; the broker's fetch socket bound back read-only
so packages still arrive). When
cgroup v2 is writable here the argv is prefixed with a ``sh`` step that moves the pod into
``<v2>/firepool/<pod>/agent`` before exec, and that pod cgroup is bound writable (the other
pods' hidden under an empty ``firepool``): the agent then makes one child cgroup per job, and
deleting the pod can ``cgroup.kill`` the whole pod at once.

Without a working ``bwrap`` (missing, or the probe fails) the plain agent runs, as a process of
the launcher's user, with one warning; ``sandbox=True`` makes that an error instead.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from pod_runtime import cgroups, jobuser
from pod_runtime import network as netmode

log = logging.getLogger(__name__)
PROBE_ARGS = (
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
    "--unshare-pid",
    "--unshare-ipc",
    "--new-session",
    "--cap-drop",
    "ALL",
)
FETCH_DIR = ".fetch"
"""Where, inside the pod directory, the sandbox binds the directory of the broker's package
fetch socket (read-only; the socket itself is what the agent is told)."""
PKG_TMPFS_BYTES = 2_000_000_000 + 64 * 1024 * 1024
PRIVATE_TMPFS_BYTES = 4096 * 1024 * 1024
"""Default size cap of the private ``/tmp`` and ``/dev/shm`` (each; a pool's ``tmpfs_mb``)."""
_warned = False


@functools.cache
def sandbox_status() -> tuple[bool, str]:
    """Whether pods can be sandboxed here, and why (or why not). Probed once per process."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False, "bubblewrap (bwrap) is not installed"
    try:
        probe = subprocess.run(
            [bwrap, *PROBE_ARGS, "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"the bwrap probe failed: {exc!r}"
    if probe.returncode != 0:
        err = probe.stderr.decode(errors="replace").strip()
        return False, f"the bwrap probe failed: {err}"
    return True, f"{bwrap}: pid, mount and ipc namespaces, read-only root, private /tmp+/dev/shm"


PRIVATE_MOUNTS = ("/tmp", "/dev/shm")
"""Replaced by empty tmpfs mounts inside the sandbox."""


def _runtime_paths(python: str, hidden: Sequence[str] = ()) -> list[str]:
    """Where the pod's interpreter and code live, when a private mount would hide them (a
    checkout or virtual environment under /tmp, as CI makes, or under a ``hidden`` path):
    bound read-only again."""
    covered = (*PRIVATE_MOUNTS, *hidden)
    inside = sorted(
        p
        for p in _runtime_candidates(python)
        if os.path.isdir(p) and any(p == m or p.startswith(m + "/") for m in covered)
    )
    kept: list[str] = []
    for path in inside:  # shortest first: skip paths already inside a kept one
        if not any(path == k or path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


def _runtime_candidates(python: str) -> set[str]:
    """The directories the pod's interpreter and code live in (absolute)."""
    here = Path(__file__).resolve().parent.parent  # the tree that holds pod_runtime
    candidates = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        str(here),
        str(Path(python).resolve().parent),
        str(Path(python).parent),
    }
    candidates.update(p for p in sys.path if p)
    return {os.path.abspath(c) for c in candidates}


def closed_above_runtime(python: str) -> list[str]:
    """For each runtime directory, the highest directory above it that others may not
    traverse (a 0700 ``/root`` holding pyenv, a private checkout): a job run as another
    uid could not reach the interpreter. The sandbox hides each (an empty tmpfs; what the
    job could not enter anyway) and binds the runtime back inside, reachable."""
    closed: set[str] = set()
    for path in _runtime_candidates(python):
        parts = Path(path).parts
        for depth in range(2, len(parts) + 1):
            ancestor = str(Path(*parts[:depth]))
            try:
                if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                    closed.add(ancestor)
                    break
            except OSError:
                break
    return sorted(closed)


HOST_SCAN_ROOTS = ("/etc", "/var", "/srv", "/opt", "/home", "/run", "/mnt", "/media")
"""Where ``host_secrets`` looks, ``HOST_SCAN_DEPTH`` levels down."""
HOST_SCAN_DEPTH = 3


def host_secrets(
    roots: Sequence[str] = HOST_SCAN_ROOTS,
    depth: int = HOST_SCAN_DEPTH,
    skip: Sequence[str] = (),
) -> tuple[list[str], list[str]]:
    """``(directories, files)`` of the host the sandbox masks: every path owned by uid 0 that
    others may not read (the sandbox runs as uid 0 without capabilities, and would read them
    as their owner: ``/etc/shadow``, ``/etc/ssl/private``, another broker's signing key) and
    every unix socket (a host daemon's, reached as uid 0: MariaDB's lets root in by socket
    authentication, Docker's is root on the host). A masked directory is not descended, a
    symlink never followed, and nothing inside ``skip`` (paths the sandbox replaces or binds
    itself) is listed."""
    dirs: list[str] = []
    files: list[str] = []
    skipped = tuple(os.path.abspath(p) for p in skip)

    def inside_skip(path: str) -> bool:
        return any(path == s or path.startswith(s + "/") for s in skipped)

    def walk(directory: str, left: int) -> None:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for entry in entries:
            if inside_skip(entry.path):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if stat.S_ISSOCK(st.st_mode) or (st.st_uid == 0 and not st.st_mode & stat.S_IROTH):
                (dirs if is_dir else files).append(entry.path)
            elif is_dir and left > 1:
                walk(entry.path, left - 1)

    for root in roots:
        if os.path.isdir(root) and not os.path.islink(root) and not inside_skip(root):
            walk(root, depth)
    return dirs, files


HOST_SCAN_TTL_S = 10.0
"""How long one ``host_secrets`` walk serves the pods launched after it (a burst of pods
shares one, ~15 ms here); a root-only file created meanwhile is masked from the next walk."""
_scans: dict[tuple[str, ...], tuple[float, tuple[list[str], list[str]]]] = {}
_scans_lock = threading.Lock()


def _recent_host_secrets(skip: Sequence[str]) -> tuple[list[str], list[str]]:
    """``host_secrets(skip=skip)``, walked at most every ``HOST_SCAN_TTL_S`` (launches run in
    the backend's worker threads: the lock makes concurrent ones share a walk)."""
    key = tuple(skip)
    with _scans_lock:
        cached = _scans.get(key)
        if cached is not None and time.monotonic() - cached[0] < HOST_SCAN_TTL_S:
            return cached[1]
        found = host_secrets(skip=key)
        _scans[key] = (time.monotonic(), found)
        return found


PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
"""Kernel settings a pod's fresh /proc would leave writable to its uid 0 (the agent, or a job
where jobs keep the agent's uid): ``/proc/sys/kernel/core_pattern`` alone would run a job's
script as root on the host. Docker makes the same read-only."""
PROC_HIDDEN = ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug")
"""And what Docker masks: kernel memory, keys, timers, the scheduler's view of every task."""


def _kernel_settings_sealed() -> list[str]:
    """bwrap options, after ``--proc``, that make ``PROC_READ_ONLY`` read-only and mask
    ``PROC_HIDDEN`` (each where this kernel has it)."""
    argv: list[str] = []
    for path in PROC_READ_ONLY:
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    for path in PROC_HIDDEN:
        if os.path.exists(path):
            argv += ["--ro-bind", "/dev/null", path]
    return argv


def _layered_mounts(
    emptied: Sequence[str],
    bound_back: Sequence[str],
    shared: Sequence[str] = (),
    shared_bytes: int = PRIVATE_TMPFS_BYTES,
) -> list[str]:
    """bwrap options that empty each of ``emptied`` (a tmpfs) and bind each of ``bound_back``
    read-only again, applied parent before child so that the deeper rule wins in its subtree:
    a checkout bound back inside a hidden ``$HOME`` must not bring back a state directory
    hidden inside the checkout (``./.firepool``). At the same path, emptying wins. The
    ``shared`` ones among ``emptied`` are world-writable with the sticky bit (``/tmp``, for a
    job that runs as another uid than the agent) and at most ``shared_bytes`` big; the rest
    only root may write."""
    rules = [(Path(p), 1, "--tmpfs") for p in emptied]
    rules += [(Path(p), 0, "--ro-bind") for p in bound_back]
    argv: list[str] = []
    for path, _, option in sorted(rules, key=lambda r: (len(r[0].parts), r[1], str(r[0]))):
        if option == "--tmpfs":
            if str(path) in shared:
                argv += ["--perms", "1777", "--size", str(shared_bytes)]
            argv += ["--tmpfs", str(path)]
        else:
            argv += [*_open_parents(path, emptied), option, str(path), str(path)]
    return argv


def _open_parents(path: Path, emptied: Sequence[str]) -> list[str]:
    """bwrap options that create, traversable by everyone (0755), the directories between
    the deepest of ``emptied`` above ``path`` and ``path``: bwrap would make them 0700, and
    a job run as another uid could not reach what is bound at ``path`` (its pod directory,
    the interpreter)."""
    above = [Path(e) for e in emptied if path.is_relative_to(e) and path != Path(e)]
    if not above:
        return []
    base = max(above, key=lambda e: len(e.parts))
    argv: list[str] = []
    for depth in range(len(base.parts) + 1, len(path.parts)):
        argv += ["--perms", "0755", "--dir", str(Path(*path.parts[:depth]))]
    return argv


def bwrap_argv(
    pod_dir: Path,
    network: str,
    cgroup_dir: Path | None,
    python: str = sys.executable,
    hidden: Sequence[Path] = (),
    capabilities: Sequence[str] = (),
    tmpfs_bytes: int = PRIVATE_TMPFS_BYTES,
    fetch_socket: Path | None = None,
) -> list[str]:
    """bubblewrap's arguments up to ``--`` for a pod in ``pod_dir``: the host's root read-only,
    private /tmp and /dev/shm of ``tmpfs_bytes``, ``hidden`` paths and the host's root-only
    files masked, the pod's directory writable, its package on a tmpfs, new PID, IPC and UTS
    namespaces, no capabilities but ``capabilities``, ``cgroup_dir`` its one visible cgroup,
    and a network namespace of its own when ``network`` is ``none`` (``outbound`` gets its
    namespace from ``pod_runtime.network`` before bwrap; ``host`` keeps the host's)."""
    pkg = str(pod_dir / "workspace" / "pkg")
    argv = [shutil.which("bwrap") or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev"]
    for node in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*")):
        argv += ["--dev-bind", node, node]
    argv += ["--proc", "/proc", *_kernel_settings_sealed()]
    masked = [str(Path(h).resolve()) for h in hidden]
    if capabilities:  # jobs run as another uid: they must reach the interpreter
        masked += closed_above_runtime(python)
    runtime = _runtime_paths(python, masked)
    secret_dirs, secret_files = _recent_host_secrets([*PRIVATE_MOUNTS, *masked, *runtime])
    argv += _layered_mounts(
        # private tmp; the broker's state, keys, other pods; the host's root-only files
        [*PRIVATE_MOUNTS, *masked, *secret_dirs],
        runtime,
        shared=PRIVATE_MOUNTS,
        shared_bytes=tmpfs_bytes,
    )
    for path in secret_files:  # /dev/null in place of each root-only file and socket (a
        argv += ["--dev-bind", "/dev/null", path]  # plain bind would refuse the device node)
    # its own directory, inside a hidden one
    argv += _open_parents(pod_dir, [*PRIVATE_MOUNTS, *masked, *secret_dirs])
    argv += ["--bind", str(pod_dir), str(pod_dir)]
    if fetch_socket is not None:  # its directory: a socket made again later is seen too
        argv += ["--ro-bind", str(fetch_socket.parent), str(pod_dir / FETCH_DIR)]
    # The package is unpacked on every job: into memory, not onto a (possibly slow, shared)
    # disk. Sized to the extraction cap plus slack.
    argv += ["--size", str(PKG_TMPFS_BYTES), "--tmpfs", pkg]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--new-session"]
    argv += ["--cap-drop", "ALL"]
    for capability in capabilities:
        argv += ["--cap-add", capability]
    argv += ["--chdir", str(pod_dir)]
    if cgroup_dir is not None:  # its own cgroup, writable; every other pod's out of sight
        argv += ["--tmpfs", str(cgroup_dir.parent), "--bind", str(cgroup_dir), str(cgroup_dir)]
    if network == "none":
        argv.append("--unshare-net")
    return [*argv, "--"]


def agent_command(
    *,
    pod_name: str,
    pod_dir: Path,
    listen: str,
    python: str = sys.executable,
    preload: Sequence[str] = (),
    zygote: bool = True,
    network: bool | str = True,
    role: str = "active",
    gpu_uuids: Sequence[str] = (),
    sandbox: bool | None = None,
    extra_args: Sequence[str] = (),
    hidden: Sequence[Path] = (),
    drop_jobs: bool = True,
    tmpfs_bytes: int = PRIVATE_TMPFS_BYTES,
    fetch_socket: Path | None = None,
) -> list[str]:
    """The pod's argv. ``sandbox``: None = bwrap if it works, True = require it, False = never.
    ``hidden``: directories the sandbox replaces with empty ones (the pod's own directory,
    if inside one, stays visible); without a sandbox nothing is hidden. ``drop_jobs``: in a
    sandbox started as root, run jobs as ``jobuser.JOB_UID`` (the agent keeping only
    ``jobuser.AGENT_CAPABILITIES``). ``tmpfs_bytes``: the size cap of the sandbox's private
    ``/tmp`` and ``/dev/shm``, each. ``network``: ``none``, ``outbound``
    (``pod_runtime.network``; ``NetworkUnavailable`` when this host cannot make it) or
    ``host`` (True; False means ``none``); only a sandboxed pod is isolated. ``fetch_socket``:
    the broker's package fetch socket, bound into the sandbox and given to the agent."""
    global _warned
    mode = ("host" if network else "none") if isinstance(network, bool) else network
    if mode not in netmode.NETWORK_MODES:
        raise ValueError(f"network must be none, outbound or host, not {network!r}")
    pod_dir = Path(pod_dir).resolve()
    agent = [
        python,
        "-P",
        "-m",
        "pod_runtime.agent",
        "--pod-name",
        pod_name,
        "--pod-dir",
        str(pod_dir),
        "--listen",
        listen,
        "--role",
        role,
    ]
    if preload:
        agent += ["--preload", ",".join(preload)]
    if not zygote:
        agent.append("--no-zygote")
    if mode == "none":
        agent.append("--no-network-note")
    for uuid in gpu_uuids:
        agent += ["--gpu-uuid", uuid]
    agent += list(extra_args)  # further agent options (limits), see settings.parse_args
    use_sandbox = False
    if sandbox is not False:
        ok, why = sandbox_status()
        if sandbox and not ok:
            raise RuntimeError(why)
        if not ok and not _warned:
            _warned = True
            log.warning("pods are not sandboxed (%s): they run as plain processes", why)
        use_sandbox = ok
    pod_cgroup = cgroups.pod_cgroup_dir(pod_dir)
    argv = agent
    if use_sandbox:
        job_uid = jobuser.JOB_UID if drop_jobs and os.geteuid() == 0 else None
        capabilities = jobuser.AGENT_CAPABILITIES if job_uid is not None else ()
        sandbox_argv = bwrap_argv(
            pod_dir, mode, pod_cgroup, python, hidden, capabilities, tmpfs_bytes, fetch_socket
        )
        if mode == "outbound":
            sandbox_argv = [*netmode.launcher_argv(pod_dir, python), *sandbox_argv]
        argv = [*sandbox_argv, *agent, "--sandboxed"]
        if fetch_socket is not None:
            argv += ["--fetch-socket", str(pod_dir / FETCH_DIR / fetch_socket.name)]
        if job_uid is not None:
            argv += ["--job-uid", str(job_uid)]
    if pod_cgroup is None:
        return argv
    # Join the pod's cgroup before exec, from outside any namespace: everything the pod
    # starts stays below it, and the agent may move its jobs within it.
    # Join the pod's cgroup from outside any namespace, so everything the pod starts stays
    # below it (a failed move leaves the agent to track jobs by /proc alone). SIGTERM/INT/HUP
    # to this shell cgroup.kill the whole pod: signals do not cross into the sandbox's
    # session, and bwrap's namespace init ignores them.
    agent_cg = shlex.quote(str(pod_cgroup / "agent"))
    kill_file = shlex.quote(str(pod_cgroup / "cgroup.kill"))
    enter = (
        f"mkdir -p {agent_cg} && {{ echo $$ > {agent_cg}/cgroup.procs || true; }}; "
        f"trap 'echo 1 > {kill_file}; exit 143' TERM INT HUP; "
        '"$@" & wait $!'
    )
    return ["/bin/sh", "-c", enter, "firepool-pod", *argv]
