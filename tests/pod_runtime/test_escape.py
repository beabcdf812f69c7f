"""Verified reset (paper §5 rule 3, A.3): nothing a job starts or leaves behind reaches the next
job of the pod, and a reset that cannot confirm it says so."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from pod_runtime.launch import _runtime_paths
from pod_runtime.proctree import JobScope
from pod_runtime.reset import Resetter
from pod_runtime.settings import PodLayout
from tests.conftest import require_sandbox
from tests.pod_runtime.conftest import AgentProcess, make_zip, proc_alive

ESCAPE = r"""
import os, subprocess, sys, tempfile

def _double_fork():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "600"])
        os._exit(0)

def spawn(args):
    n, dirs = args["n"], [os.environ["TMPDIR"], *args["shared_dirs"]]
    kids = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            kids.append(subprocess.Popen(["sleep", "600"]))
        elif kind == 1:
            kids.append(subprocess.Popen(["sleep", "600"], start_new_session=True))
        elif kind == 2:
            kids.append(subprocess.Popen(["setsid", "sleep", "600"]))
        else:
            _double_fork()
    # A short fork bomb: 2^6 - 1 shells that each fork two more and then sleep.
    subprocess.Popen(["sh", "-c", 'f() { if [ "$1" -gt 0 ]; then f $(($1-1)) & '
                      'f $(($1-1)) & fi; exec sleep 600; }; f 5'], start_new_session=True)
    for d in dirs:
        with open(os.path.join(d, "residue.txt"), "w") as f:
            f.write("left behind")
        os.makedirs(os.path.join(d, "ro", "deep"), exist_ok=True)
        os.chmod(os.path.join(d, "ro"), 0o500)
    return len(kids)

def sysv(x):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    IPC_CREAT, IPC_PRIVATE = 0o1000, 0
    return [libc.shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0o600),
            libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600),
            libc.semget(IPC_PRIVATE, 1, IPC_CREAT | 0o600)]

def sysv_listing(x):
    out = {}
    for kind in ("shm", "msg", "sem"):
        out[kind] = open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]
    return out

def kernel(numbers):
    import ctypes, errno
    add_key, keyctl, mq_open, unshare = numbers
    out = {"uid": os.getuid(), "node": os.uname().nodename}
    try:
        with open("/proc/sys/kernel/domainname", "w") as f:
            f.write("escaped")
        out["sysctl"] = "allowed"
    except OSError as exc:
        out["sysctl"] = type(exc).__name__
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    key = libc.syscall(add_key, b"user", b"firepool-escape", b"secret", 6, -4)  # @u
    out["add_key"] = "allowed" if key >= 0 else errno.errorcode[ctypes.get_errno()]
    if key >= 0:
        libc.syscall(keyctl, 3, key)  # KEYCTL_REVOKE: leave the host's keyring as it was
    found = libc.syscall(keyctl, 0, -4, 0)  # KEYCTL_GET_KEYRING_ID of @u
    out["keyctl"] = "allowed" if found >= 0 else errno.errorcode[ctypes.get_errno()]
    queue = libc.syscall(mq_open, b"escape-q", os.O_CREAT | os.O_RDWR, 0o600, None)
    out["mq_open"] = "allowed" if queue >= 0 else errno.errorcode[ctypes.get_errno()]
    userns = libc.syscall(unshare, 0x10000000)  # CLONE_NEWUSER
    out["unshare"] = "allowed" if userns >= 0 else errno.errorcode[ctypes.get_errno()]
    import subprocess, threading
    out["subprocess"] = subprocess.run(["true"]).returncode  # clone still works
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    return out

def browser_uid(x):
    time_left = 50
    import time
    marker = os.path.join(os.environ["TMPDIR"], "browser-uid")
    while time_left and not os.path.exists(marker):
        time.sleep(0.02)
        time_left -= 1
    return open(marker).read().strip() if os.path.exists(marker) else None

def look(x):
    seen = {}
    for d in (os.environ["TMPDIR"], "/tmp", "/dev/shm"):
        seen[d] = sorted(os.listdir(d))
    return seen
"""


def token_processes(token: str) -> list[int]:
    """Host pids whose environment carries ``ESCAPE_TOKEN=<token>`` (alive, not zombies)."""
    needle = f"ESCAPE_TOKEN={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as env:
                if needle in env.read() and proc_alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("sandbox", [True, False], ids=["bwrap", "plain"])
def test_reset_leaves_none_of_the_jobs_processes_or_files(
    agent_factory: Callable[..., AgentProcess], sandbox: bool
) -> None:
    agent = agent_factory(name="escape", sandbox=sandbox)
    url, digest = make_zip(agent.pod_dir / "escape.zip", {"escape.py": ESCAPE})
    pkg = {"url": url, "digest": digest}
    token = uuid.uuid4().hex
    # Unsandboxed, /tmp and /dev/shm are the host's: the agent does not wipe them (the job's
    # TMPDIR is the pod's scratch instead), so the plain run leaves them alone.
    shared = ["/tmp", "/dev/shm"] if sandbox else []
    result = agent.run(
        {
            "attempt_id": "esc-1:1",
            "package": pkg,
            "entrypoint": "escape:spawn",
            "input": {"n": 100, "shared_dirs": shared},
            "env": {"ESCAPE_TOKEN": token},
        }
    )
    assert result["state"] == "succeeded", result
    deadline = time.monotonic() + 10
    while len(token_processes(token)) < 150 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(token_processes(token)) >= 150  # 100 children + the bomb's shells
    report = agent.reset()
    assert report["clean"] is True, report
    assert token_processes(token) == []
    seen = agent.run({"attempt_id": "esc-2:1", "package": pkg, "entrypoint": "escape:look"})
    scratch = str(agent.pod_dir / "workspace" / "scratch")
    assert seen["output"][scratch] == []
    if sandbox:
        # Only the directories leading to read-only mounts remain in /tmp: the pod dir and,
        # when the checkout or venv lives under /tmp (as in CI), the launcher's binds of them.
        mounts = [agent.pod_dir, *map(Path, _runtime_paths(sys.executable))]
        chain = sorted({m.relative_to("/tmp").parts[0] for m in mounts if m.is_relative_to("/tmp")})
        assert seen["output"]["/tmp"] == chain
        assert seen["output"]["/dev/shm"] == []
    assert agent.reset()["clean"] is True


async def test_a_process_that_survives_sigkill_makes_the_reset_unclean(tmp_path: Path) -> None:
    """Simulation: the injected ``kill`` skips one real process, as if SIGKILL had no effect
    on it (a task stuck in the kernel). Limits: the kernel never really refused the signal,
    so this proves the verification and the report, not the kernel's behaviour."""
    layout = PodLayout(tmp_path)
    layout.create()
    for run in range(5):
        stubborn = subprocess.Popen(["sleep", "600"], start_new_session=True)
        try:

            def kill(pid: int, sig: int, spared: int = stubborn.pid) -> None:
                if pid != spared:
                    os.kill(pid, sig)

            resetter = Resetter(layout, sandboxed=False, deadline_s=0.1, kill=kill)
            scope = JobScope(agent_pid=-1, exclude=set(), sessions={stubborn.pid})
            report = await resetter.reset(scope)
            assert report.clean is False, run
            assert "survived SIGKILL" in report.reason and str(stubborn.pid) in report.reason
        finally:
            stubborn.kill()
            stubborn.wait()


async def test_residue_that_cannot_be_removed_makes_the_reset_unclean(tmp_path: Path) -> None:
    layout = PodLayout(tmp_path / "pod")
    layout.create()
    extra = tmp_path / "pod" / "volume"
    extra.mkdir()
    (extra / "data").write_text("x")
    resetter = Resetter(layout, sandboxed=False)
    original = os.unlink

    def refuse(path: str | bytes | os.PathLike[str], *args: object, **kw: object) -> None:
        if str(path).endswith("data"):
            raise PermissionError(1, "Operation not permitted")
        original(path)

    scope = JobScope(agent_pid=-1, exclude=set(), sessions=set())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "unlink", refuse)
        report = await resetter.reset(scope, wipe=[str(extra)])
    assert report.clean is False
    assert "could not be removed" in report.reason and "data" in report.reason


def test_wipe_paths_outside_the_pod_are_refused(agent: AgentProcess) -> None:
    status, body = agent.call("POST", "/reset", {"wipe": ["/etc"]})
    assert status == 400 and body["error"]["field"] == "wipe"


KEYRING_NUMBERS = {"x86_64": (248, 250, 240, 272), "aarch64": (217, 219, 180, 97)}
"""add_key, keyctl, mq_open and unshare, by machine."""


@pytest.mark.parametrize("drop_jobs", [True, False], ids=["job-uid", "agent-uid"])
def test_a_sandboxed_job_changes_no_kernel_setting_and_reaches_no_keyring_queue_or_userns(
    agent_factory: Callable[..., AgentProcess], drop_jobs: bool
) -> None:
    """Unsealed, a job (even one kept at the agent's uid 0) could write host-wide sysctls
    through its fresh /proc (``kernel/core_pattern`` runs a script as root on the host), and
    store and read keys in a keyring every pod of its uid shares, for good."""
    require_sandbox()
    numbers = KEYRING_NUMBERS.get(platform.machine())
    if numbers is None:
        pytest.skip(f"the system call numbers are known for x86_64 and aarch64, not here: "
                    f"{platform.machine()}")  # fmt: skip
    agent = agent_factory(name="kernel", sandbox=True, drop_jobs=drop_jobs)
    url, digest = make_zip(agent.pod_dir / "escape.zip", {"escape.py": ESCAPE})
    pkg = {"url": url, "digest": digest}
    domain = Path("/proc/sys/kernel/domainname").read_text()
    spec = {"attempt_id": "kernel-1:1", "package": pkg, "entrypoint": "escape:kernel"}
    seen = agent.run({**spec, "input": list(numbers)})["output"]
    assert Path("/proc/sys/kernel/domainname").read_text() == domain
    assert seen["sysctl"] != "allowed" and seen["add_key"] == seen["keyctl"] == "EPERM", seen
    # A queue outlived the reset (it cannot list them); a user namespace mounted past the cap.
    assert seen["mq_open"] == seen["unshare"] == "EPERM" and seen["subprocess"] == 0, seen
    assert (seen["uid"] == 65534) == (drop_jobs and os.geteuid() == 0), seen


@pytest.mark.parametrize("drop_jobs", [True, False], ids=["job-uid", "agent-uid"])
def test_system_v_ipc_objects_do_not_survive_a_sandboxed_reset(
    agent_factory: Callable[..., AgentProcess], drop_jobs: bool
) -> None:
    agent = agent_factory(name="sysv", sandbox=True, drop_jobs=drop_jobs)
    url, digest = make_zip(agent.pod_dir / "escape.zip", {"escape.py": ESCAPE})
    pkg = {"url": url, "digest": digest}
    made = agent.run({"attempt_id": "ipc-1:1", "package": pkg, "entrypoint": "escape:sysv"})
    assert all(ident >= 0 for ident in made["output"]), made
    left = agent.run(
        {"attempt_id": "ipc-2:1", "package": pkg, "entrypoint": "escape:sysv_listing"}
    )["output"]
    assert all(left[kind] for kind in ("shm", "msg", "sem"))  # they outlive their process
    assert agent.reset()["clean"] is True
    after = agent.run(
        {"attempt_id": "ipc-3:1", "package": pkg, "entrypoint": "escape:sysv_listing"}
    )["output"]
    assert after == {"shm": [], "msg": [], "sem": []}


def test_a_fresh_interpreter_job_gets_its_environment_only_once_it_dropped_its_uid(
    agent_factory: Callable[..., AgentProcess],
) -> None:
    """With the zygote off, an interpreter started as root with the job's environment would
    let ``PYTHONWARNINGS`` import ``antigravity``, which runs ``$BROWSER`` as root with the
    agent's capabilities."""
    require_sandbox()
    if os.geteuid() != 0:
        pytest.skip("jobs change uid only in a sandbox started as root")
    agent = agent_factory("--no-zygote", name="execroot", sandbox=True)
    url, digest = make_zip(agent.pod_dir / "escape.zip", {"escape.py": ESCAPE})
    env = {
        "PYTHONWARNINGS": "ignore::antigravity.Warning",
        "BROWSER": "/bin/sh -c 'id -u > $TMPDIR/browser-uid' %s",
    }
    spec = {"attempt_id": "exec-1:1", "package": {"url": url, "digest": digest},
            "entrypoint": "escape:browser_uid", "env": env}  # fmt: skip
    result = agent.run(spec)
    assert result["state"] == "succeeded", result
    assert result["output"] in (None, "65534"), "the job's environment ran as root"
