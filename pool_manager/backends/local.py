"""Local pod backend: each pod is a ``pod_runtime`` agent process on this machine.

Every pod gets a directory ``root/<name>/`` holding its workspace, caches and the agent's unix
socket, and runs in its own session so it outlives the broker, like a Kubernetes pod outlives
its controller. Its labels and annotations (owner, tag, hold, the launcher's pid) live beside
that directory, in ``root/<name>.json`` (written atomically), where the pod's jobs cannot
reach them: a sandboxed pod sees ``root`` (and every other ``private`` path) as an empty
directory with only its own directory in it. ``list`` rebuilds the backend's view from those
files after a restart (the backend's state is ``root``: a new ``LocalBackend`` over the same
``root`` lists every pod an earlier one made), so what a job writes can never change which
caller owns its pod, nor which process a delete kills. (Without a sandbox a job runs as the
broker's user and reads what it reads, the ``private`` paths included:
``unsandboxed_reason`` says when that is so.)

A sandboxed pod's network is its pool's ``network`` (``pod_runtime.network``: ``none``, the
default, or ``outbound``); either way it fetches its package through the backend's package
fetch socket (``package_proxy``, started with the first ``create`` or ``list`` when the
backend knows its store's URLs: ``package_url``), since its namespace cannot reach the
broker's loopback URL.

A pod's environment is the broker's filtered to ``POD_ENV_NAMES`` and ``POD_ENV_PREFIXES``
(paths, locale, proxies, certificates, package-index and GPU settings), like a pod template's
environment; the broker's own configuration and credentials never reach a job.

Concurrency: methods run on the broker's event loop; the slow parts (spawning, killing,
removing trees, reading and writing the records) run in worker threads. Every change of a
record is one read-modify-write under the backend's ``_records`` lock, so concurrent
``annotate`` calls on one pod each merge (none is lost, none fails on another's temporary file).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pod_runtime.agent_auth import SECRET_ENV, pod_secret, tcp_endpoint
from pod_runtime.cgroups import kill_pod
from pod_runtime.launch import agent_command, sandbox_status
from pod_runtime.network import NetworkUnavailable, stop_pasta
from pool_manager.backends.base import BackendPod, CreateFailed
from pool_manager.backends.gpus import GpuInventory
from pool_manager.backends.package_proxy import PackageFetchProxy, package_url_prefix
from pool_manager.catalog import PoolSpec

POD_ENV_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM",
        "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy",
        "https_proxy", "no_proxy",
    }
)  # fmt: skip
"""Variables of the broker's environment a pod inherits by name."""
POD_ENV_PREFIXES = ("LC_", "PIP_", "UV_", "CUDA_", "NVIDIA_", "NCCL_", "FIREPOOL_AGENT_")
"""... and by prefix (``FIREPOOL_AGENT_*``: the agent's own options, never passed to jobs)."""


def pod_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a pod starts with: ``env`` (the broker's) kept to the names and
    prefixes above."""
    return {k: v for k, v in env.items() if k in POD_ENV_NAMES or k.startswith(POD_ENV_PREFIXES)}


def unsandboxed_reason(sandbox: bool | None) -> str | None:
    """Why pods of a ``LocalBackend(sandbox=sandbox)`` would run without the sandbox, or None
    if every one runs in it. Unsandboxed, a pod's jobs run as the broker's user (they change
    uid only inside the sandbox: ``pod_runtime.jobuser``) and read whatever it can read, its
    ``private`` paths included."""
    if sandbox is False:
        return "the sandbox is turned off"
    ok, why = sandbox_status()
    return None if ok else why


def operator_home() -> list[Path]:
    """The broker user's home directory, where credentials conventionally live (``~/.aws``,
    ``~/.ssh``, ``~/.kube``...): one more directory to hide from pods. Nothing if it is ``/``
    or missing (an interpreter or checkout inside it is bound back: ``launch._runtime_paths``)."""
    home = Path.home().resolve()
    return [home] if home != Path("/") and home.is_dir() else []


def meta_path(pod_dir: Path) -> Path:
    """Where the backend keeps the labels and annotations of the pod in ``pod_dir``."""
    return pod_dir.with_name(pod_dir.name + ".json")


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (PID 1 here reaps orphans slowly)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


MAX_SOCKET_PATH = 107
"""Bytes a unix socket's path may have (``sun_path`` is 108, with its NUL): longer, the agent
cannot listen, and the pod would die before it is ready."""
SOCKET_NAME = "agent.sock"
FETCH_SOCKET = Path(".fetch") / "s"
"""The package fetch socket, under ``root``; its directory is bound into every sandbox at
``<pod>/.fetch`` (``launch.FETCH_DIR``), so the agent's path to it is shorter than the one to
its own socket, which ``socket_path_error`` checks."""


def socket_path_error(root: Path, pod_name: str) -> str | None:
    """Why a pod named ``pod_name`` under ``root`` could not listen on its socket, or None."""
    path = root / pod_name / SOCKET_NAME
    size = len(os.fsencode(path))
    if size <= MAX_SOCKET_PATH:
        return None
    return (
        f"pod {pod_name}'s socket path {path} is {size} bytes; a unix socket's path has at most "
        f"{MAX_SOCKET_PATH}: use a shorter FIREPOOL_HOME (or shorter pool names)"
    )


def limit_args(pool: PoolSpec) -> list[str]:
    """The pool's per-job limits as agent options (enforced where cgroup v2 allows)."""
    args = []
    if pool.memory_limit_mb is not None:
        args += ["--job-memory-max", str(pool.memory_limit_mb * 1024 * 1024)]
    if pool.pids_limit is not None:
        args += ["--job-pids-max", str(pool.pids_limit)]
    return args


def stop_pod(pod_dir: Path, reap: Callable[[], None] = lambda: None, wait_s: float = 2.0) -> None:
    """Stop every process of the pod in ``pod_dir``: SIGTERM its launcher (which kills the
    pod's cgroup where there is one), kill the pod cgroup, then SIGKILL what is left of the
    launcher's process group. Blocking; safe on a pod that is already gone."""
    try:
        meta = json.loads(meta_path(pod_dir).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        meta = {}
    pid = meta.get("pid")
    if isinstance(pid, int) and pid_alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            reap()
            if not pid_alive(pid):
                break
            time.sleep(0.005)
    kill_pod(pod_dir)
    stop_pasta(pod_dir)  # an outbound pod's (killed with its cgroup, where there is one)
    if isinstance(pid, int):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    reap()


def spawn_agent(argv: Sequence[str], env: Mapping[str, str], log: Path) -> int:
    """Start a pod's agent (``argv``, environment ``env``, stdout and stderr appended to
    ``log``) in a session of its own; its pid. posix_spawn rather than Popen: the pod must
    outlive us, and a Popen handle never waited on would be reported as leaked (the caller
    reaps it). Raises ``OSError`` when it cannot be started."""
    return os.posix_spawnp(
        argv[0],
        list(argv),
        dict(env),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )


def free_tcp_port(host: str) -> int:
    """A port nothing listens on at ``host`` now (the kernel's pick; another process may take
    it before the agent binds it, and the pod then dies before it is ready)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class LocalBackend:
    """Pods as local agent processes under ``root``."""

    rendezvous_port: int | None = None
    """None: local pods share the broker's host: each gang gets a free port."""

    def __init__(
        self,
        root: Path,
        python: str = sys.executable,
        sandbox: bool | None = None,
        gpus: GpuInventory | None = None,
        private: Sequence[Path] = (),
        agent_key: bytes | None = None,
        tcp_host: str | None = None,
        package_url: Callable[[str], str] | None = None,
    ):
        """``private``: directories no pod may see besides ``root`` (the broker's state).
        ``agent_key`` (``pod_runtime.agent_auth.agent_key``): each pod's agent gets its secret
        derived from it in its environment, and answers only calls carrying it; None: no
        secret (unix sockets only). ``tcp_host``: pods listen on TCP at this address (a free
        port each) instead of their unix socket; needs ``agent_key`` and unsandboxed pods (a
        sandboxed one has a network namespace of its own). ``package_url``: the package
        store's URL for a digest (``PackageStore.url``); sandboxed pods fetch URLs of that
        form through the backend's fetch socket. None: no socket, and a sandboxed pod reaches
        only the package URLs its network reaches (none with ``network: none``)."""
        if tcp_host is not None and agent_key is None:
            raise ValueError("pods on TCP need an agent key: anyone could call them")
        self.root = root.resolve()  # pods run elsewhere (their own cwd): never relative
        self.root.mkdir(parents=True, exist_ok=True)
        self.python = python
        self.sandbox = sandbox
        self.private = (self.root, *(Path(p).resolve() for p in private))
        self.gpus = gpus or GpuInventory({})
        self._children: set[int] = set()
        self.agent_key = agent_key
        self.tcp_host = tcp_host
        self._records = threading.RLock()
        """Held across each read-modify-write (and write) of a pod's record."""
        self.fetch_proxy = (
            PackageFetchProxy(self.root / FETCH_SOCKET, lambda: [package_url_prefix(package_url)])
            if package_url is not None
            else None
        )

    async def _start_proxy(self) -> None:
        if self.fetch_proxy is not None and not self.fetch_proxy.started:
            await self.fetch_proxy.start()

    def _reap(self) -> None:
        """Collect exit statuses of agents we spawned that have exited (no zombies)."""
        for pid in list(self._children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._children.discard(pid)

    def _meta_path(self, name: str) -> Path:
        return meta_path(self.root / name)

    def _write_meta(self, name: str, meta: Mapping[str, object]) -> None:
        path = self._meta_path(name)
        tmp = path.with_suffix(".tmp")
        with self._records:
            tmp.write_text(json.dumps(meta, sort_keys=True))
            os.replace(tmp, path)

    def _read_meta(self, name: str) -> dict[str, object] | None:
        try:
            data = json.loads(self._meta_path(name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def _assign_gpus(self, pool: PoolSpec, role: str, gpu: str | None) -> tuple[str, ...]:
        """The cards a new pod is pinned to. A standby shares its active's card (``gpu``); an
        active takes free cards (no other active pod on them), or the create fails."""
        if not pool.is_gpu:
            return ()
        if gpu is not None:
            return (gpu,)
        if role == "standby":
            raise ValueError("a standby pod needs the card of its active pod")
        busy = {p.gpu for p in self._list() if p.alive and p.role == "active" and p.gpu}
        free = [card for card in self.gpus.cards(pool.accelerator) if card not in busy]
        if len(free) < pool.units_per_pod:
            raise CreateFailed(
                f"no free {pool.accelerator} GPU on this machine for pool {pool.sku} "
                f"(cards: {list(self.gpus.cards(pool.accelerator))}, in use: {sorted(busy)})"
            )
        return tuple(free[: pool.units_per_pod])

    def _spawn(self, name: str, pool: PoolSpec, role: str, gpu: str | None) -> BackendPod:
        pod_dir = self.root / name
        if pod_dir.exists():
            raise ValueError(f"pod {name} already exists")
        too_long = socket_path_error(self.root, name)
        if too_long is not None:
            raise CreateFailed(too_long)
        cards = self._assign_gpus(pool, role, gpu)
        gpu = cards[0] if cards else None
        pod_dir.mkdir(parents=True)
        if self.tcp_host is None:
            listen = endpoint = f"unix:{pod_dir / SOCKET_NAME}"
        elif pool.network != "host" and unsandboxed_reason(self.sandbox) is None:
            # a namespace of its own: no TCP from here
            shutil.rmtree(pod_dir, ignore_errors=True)
            raise CreateFailed(
                f"pod {name}: a sandboxed pod has a network namespace of its own, so its agent "
                f"cannot listen on TCP at {self.tcp_host} (use unix sockets: no tcp_host; or "
                "network: host)"
            )
        else:
            port = free_tcp_port(self.tcp_host)
            listen = f"tcp:{self.tcp_host}:{port}"
            endpoint = tcp_endpoint(self.tcp_host, port, name)
        fetch_socket = self.fetch_proxy.path if self.fetch_proxy is not None else None
        try:
            argv = agent_command(
                pod_name=name,
                pod_dir=pod_dir,
                listen=listen,
                python=self.python,
                preload=pool.preload,
                zygote=pool.zygote,
                network=pool.network,
                role=role,
                gpu_uuids=cards,
                sandbox=self.sandbox,
                extra_args=limit_args(pool),
                hidden=self.private,
                tmpfs_bytes=pool.tmpfs_mb * 1024 * 1024,
                fetch_socket=fetch_socket,
            )
        except NetworkUnavailable as exc:  # a failed create leaves nothing behind
            shutil.rmtree(pod_dir, ignore_errors=True)
            raise CreateFailed(f"pod {name} of pool {pool.sku}: {exc}") from exc
        created = time.time()
        meta: dict[str, object] = {
            "name": name,
            "sku": pool.sku,
            "role": role,
            "gpu": gpu,
            "created": created,
            "template": pool.template,
            "endpoint": endpoint,
            "annotations": {},
        }
        self._write_meta(name, meta)
        env = pod_environment(os.environ)
        if self.agent_key is not None:
            env[SECRET_ENV] = pod_secret(self.agent_key, name)
        try:
            pid = spawn_agent(argv, env, pod_dir / "agent.log")
        except OSError as exc:  # a failed create leaves nothing behind (base.CreateFailed)
            self._kill(name)
            raise CreateFailed(f"pod {name} could not be started: {exc}") from exc
        self._children.add(pid)
        meta["pid"] = pid
        self._write_meta(name, meta)
        return BackendPod(
            name=name,
            sku=pool.sku,
            role=role,
            created=created,
            endpoint=endpoint,
            gpu=gpu,
            template=pool.template,
        )

    async def create(
        self, name: str, pool: PoolSpec, role: str = "active", gpu: str | None = None
    ) -> BackendPod:
        await self._start_proxy()
        return await asyncio.to_thread(self._spawn, name, pool, role, gpu)

    def _kill(self, name: str) -> None:
        stop_pod(self.root / name, reap=self._reap)
        shutil.rmtree(self.root / name, ignore_errors=True)
        self._meta_path(name).unlink(missing_ok=True)  # last: ``list`` shows it until gone

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self._kill, name)

    def _list(self) -> list[BackendPod]:
        self._reap()
        pods = []
        for entry in sorted(self.root.glob("*.json")):
            meta = self._read_meta(entry.stem)
            if meta is None:
                continue
            pid = meta.get("pid")
            annotations = meta.get("annotations") or {}
            pods.append(
                BackendPod(
                    name=str(meta["name"]),
                    sku=str(meta["sku"]),
                    role=str(meta["role"]),
                    created=float(meta["created"]),  # type: ignore[arg-type]
                    endpoint=str(meta["endpoint"]),
                    alive=isinstance(pid, int) and pid_alive(pid),
                    gpu=meta.get("gpu") if isinstance(meta.get("gpu"), str) else None,  # type: ignore[arg-type]
                    template=str(meta.get("template", "v1")),
                    annotations=dict(annotations) if isinstance(annotations, dict) else {},
                )
            )
        return pods

    async def list(self) -> list[BackendPod]:
        await self._start_proxy()  # the pods an earlier broker left fetch through it too
        return await asyncio.to_thread(self._list)

    async def exited(self, name: str) -> bool:
        """The pod's launcher is gone (or a zombie), or its record is (deleted)."""
        meta = self._read_meta(name)
        pid = meta.get("pid") if meta is not None else None
        return not (isinstance(pid, int) and pid_alive(pid))

    def _annotate(self, name: str, annotations: Mapping[str, str | None]) -> None:
        with self._records:
            meta = self._read_meta(name)
            if meta is None:
                return
            current = dict(meta.get("annotations") or {})  # type: ignore[call-overload]
            for key, value in annotations.items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
            meta["annotations"] = current
            self._write_meta(name, meta)

    async def annotate(self, name: str, annotations: Mapping[str, str | None]) -> None:
        await asyncio.to_thread(self._annotate, name, annotations)

    def _sweep(self, gpus: Sequence[str]) -> dict[str, bool]:
        pids = [p for p in (self._pid(pod.name) for pod in self._list() if pod.alive) if p]
        verdicts = {}
        for gpu in gpus:
            verdict = self.gpus.exclusive(gpu, pids)
            if verdict is not None:  # a failed read changes nothing (fail closed)
                verdicts[gpu] = verdict
        return verdicts

    async def sweep(self, gpus: Sequence[str]) -> dict[str, bool]:
        """Exclusivity of each card that could be read: only our pods compute on it."""
        return await asyncio.to_thread(self._sweep, gpus)

    def _pid(self, name: str) -> int | None:
        pid = (self._read_meta(name) or {}).get("pid")
        return pid if isinstance(pid, int) else None

    async def close(self) -> None:
        # Pods outlive the broker; only reap the ones that already exited.
        self._reap()
        if self.fetch_proxy is not None:
            await self.fetch_proxy.close()
