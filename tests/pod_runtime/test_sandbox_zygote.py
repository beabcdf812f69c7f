"""The local sandbox (bubblewrap) and warm starts from the zygote."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pod_runtime import launch
from pod_runtime.cgroups import kill_pod, pod_cgroup_dir, v2_mount
from pod_runtime.launch import agent_command
from tests.conftest import REQUIRE_SANDBOX_ENV, require_sandbox
from tests.pod_runtime.conftest import AgentProcess, make_zip, proc_alive
from tests.require import missing

JOBS = """
import os, signal, socket

def dot(n):
    import numpy
    a = numpy.arange(n, dtype=float)
    return float(a @ a)

def kill_zygote(x):
    os.kill(os.getppid(), signal.SIGKILL)
    return "killed"

def pids(x):
    return {"pid": os.getpid(), "ppid": os.getppid()}

def connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return "connected"
    except OSError as exc:
        return type(exc).__name__

def cgroup(x):
    return open("/proc/self/cgroup").read().strip().splitlines()[-1]

def write_root(x):
    try:
        open("/usr/firepool-escape", "w").write("x")
        return "wrote"
    except OSError as exc:
        return type(exc).__name__
"""

V2_ROOT = v2_mount() or Path("/sys/fs/cgroup")


def _package(agent: AgentProcess) -> dict[str, str]:
    url, digest = make_zip(agent.pod_dir / "jobs.zip", {"sbjobs.py": JOBS})
    return {"url": url, "digest": digest}


def test_the_sandbox_argv_keeps_pods_alive_beyond_the_broker(tmp_path: Path) -> None:
    require_sandbox()
    argv = agent_command(pod_name="p", pod_dir=tmp_path, listen="unix:/x", network=False)
    assert "--die-with-parent" not in argv
    for flag in ("--unshare-pid", "--unshare-ipc", "--new-session", "--unshare-net"):
        assert flag in argv
    assert "--sandboxed" in argv
    plain = agent_command(pod_name="p", pod_dir=tmp_path, listen="unix:/x", sandbox=False)
    assert "bwrap" not in " ".join(plain) and "--sandboxed" not in plain


def test_jobs_fork_from_a_zygote_with_preloaded_numpy(
    agent_factory: Callable[..., AgentProcess],
) -> None:
    agent = agent_factory("--preload", "numpy", name="zyg")
    assert agent.call("GET", "/healthz")[1]["preloaded"] == ["numpy"]
    pkg = _package(agent)
    result = agent.run(
        {"attempt_id": "np-1:1", "package": pkg, "entrypoint": "sbjobs:dot", "input": 1000}
    )
    assert result["output"] == float(sum(i * i for i in range(1000)))
    killed = agent.run({"attempt_id": "zk-1:1", "package": pkg, "entrypoint": "sbjobs:kill_zygote"})
    assert killed["state"] == "succeeded"
    assert agent.reset()["clean"] is True
    again = agent.run(
        {"attempt_id": "np-2:1", "package": pkg, "entrypoint": "sbjobs:dot", "input": 10}
    )
    assert again["output"] == 285.0  # a new zygote was started for it


def test_a_sandboxed_pod_sees_a_read_only_root_and_no_network_when_asked(
    agent_factory: Callable[..., AgentProcess],
) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        port = listener.getsockname()[1]
        closed = agent_factory(name="nonet", sandbox=True, network=False)
        assert "--unshare-net" in closed.argv
        health = closed.call("GET", "/healthz")[1]
        assert health["sandboxed"] is True and health["network"] is False
        pkg = _package(closed)
        result = closed.run(
            {"attempt_id": "ro-1:1", "package": pkg, "entrypoint": "sbjobs:write_root"}
        )
        assert result["output"] in ("OSError", "PermissionError")
        assert not Path("/usr/firepool-escape").exists()
        cut_off = closed.run(
            {"attempt_id": "net-0:1", "package": pkg, "entrypoint": "sbjobs:connect", "input": port}
        )
        assert cut_off["output"] != "connected"
        open_pod = agent_factory(name="net", sandbox=True)
        reached = open_pod.run(
            {
                "attempt_id": "net-1:1",
                "package": _package(open_pod),
                "entrypoint": "sbjobs:connect",
                "input": port,
            }
        )
        assert reached["output"] == "connected"
    finally:
        listener.close()


def test_each_job_runs_in_its_own_cgroup_removed_by_reset(
    agent_factory: Callable[..., AgentProcess],
) -> None:
    agent = agent_factory(name="cg", sandbox=True)
    assert "cgroup v2" in agent.call("GET", "/healthz")[1]["cgroups"]
    pod_cgroup = pod_cgroup_dir(agent.pod_dir)
    assert pod_cgroup is not None
    pkg = _package(agent)
    result = agent.run({"attempt_id": "cg-1:1", "package": pkg, "entrypoint": "sbjobs:cgroup"})
    assert result["output"].startswith(f"0::/{pod_cgroup.relative_to(V2_ROOT)}/job-")
    job_cgroups = [p for p in pod_cgroup.iterdir() if p.name.startswith("job-")]
    assert len(job_cgroups) == 1
    assert agent.reset()["clean"] is True
    assert not job_cgroups[0].exists()
    # The next job's cgroup and a spare child inside it are prepared while idle; a reset
    # with no job in between leaves them alone and stays clean.
    assert agent.reset()["clean"] is True
    again = agent.run({"attempt_id": "cg-2:1", "package": pkg, "entrypoint": "sbjobs:cgroup"})
    assert again["output"].startswith(f"0::/{pod_cgroup.relative_to(V2_ROOT)}/job-")
    assert again["output"] != result["output"]
    assert agent.reset()["clean"] is True


def test_deleting_a_pod_leaves_a_pod_of_the_same_name_in_another_directory_alone(
    tmp_path: Path,
) -> None:
    """Two brokers (or two test clusters) started from one shell share its cgroup, and each
    may have a pod named ``twin``: each pod's cgroup is its own, so deleting one (the
    backends' ``kill_pod``) leaves the other running."""
    if pod_cgroup_dir(tmp_path) is None:
        missing(REQUIRE_SANDBOX_ENV, "no writable cgroup v2 here: pods get no cgroup to kill")
    first = AgentProcess(tmp_path / "a" / "twin", pod_name="twin")
    second = AgentProcess(tmp_path / "b" / "twin", pod_name="twin")
    try:
        for agent in (first, second):
            cgroups = agent.call("GET", "/healthz")[1]["cgroups"]
            assert "cgroup v2" in cgroups, f"this host has a writable cgroup v2: {cgroups}"
        one, two = pod_cgroup_dir(first.pod_dir), pod_cgroup_dir(second.pod_dir)
        assert one is not None and two is not None and one != two
        assert kill_pod(first.pod_dir) is True
        first.proc.wait(10)
        assert second.proc.poll() is None
        assert second.call("GET", "/healthz")[0] == 200
    finally:
        first.stop()
        second.stop()
        kill_pod(second.pod_dir)


def test_sigterm_to_a_sandboxed_pod_kills_all_of_it(
    agent_factory: Callable[..., AgentProcess],
) -> None:
    agent = agent_factory(name="term", sandbox=True)
    pkg = _package(agent)
    assert (
        agent.call(
            "POST",
            "/attempts",
            {"attempt_id": "t-1:1", "package": pkg, "entrypoint": "sbjobs:pids"},
        )[0]
        == 202
    )
    cgroup = pod_cgroup_dir(agent.pod_dir)
    assert cgroup is not None, "this host has a writable cgroup v2"
    members = [int(p) for p in (cgroup / "agent" / "cgroup.procs").read_text().split()]
    assert len(members) >= 3  # shell, bwrap, its init, the agent, the zygote
    os.killpg(agent.proc.pid, signal.SIGTERM)
    agent.proc.wait(10)
    deadline = time.monotonic() + 5
    while any(proc_alive(p) for p in members) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(proc_alive(p) for p in members)


def test_without_bubblewrap_pods_run_plain_after_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    real_which = launch.shutil.which
    monkeypatch.setattr(
        launch.shutil, "which", lambda name: None if name == "bwrap" else real_which(name)
    )
    monkeypatch.setattr(launch, "_warned", False)
    launch.sandbox_status.cache_clear()
    try:
        ok, why = launch.sandbox_status()
        assert not ok and "not installed" in why
        with caplog.at_level(logging.WARNING, logger="pod_runtime.launch"):
            first = launch.agent_command(pod_name="a", pod_dir=tmp_path, listen="unix:/x")
            launch.agent_command(pod_name="b", pod_dir=tmp_path, listen="unix:/x")
        assert "--sandboxed" not in first and not any("bwrap" in a for a in first)
        warning = f"pods are not sandboxed ({why}): they run as plain processes"
        assert [r.message for r in caplog.records].count(warning) == 1
        with pytest.raises(RuntimeError):
            launch.agent_command(pod_name="c", pod_dir=tmp_path, listen="unix:/x", sandbox=True)
    finally:
        launch.sandbox_status.cache_clear()


def test_host_secrets_lists_root_only_paths_and_sockets_and_a_burst_shares_one_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("root-owned files are made by root: this test runs as uid 0 only")
    root = tmp_path / "host"
    (root / "open" / "deeper").mkdir(parents=True)
    (root / "open" / "readable").write_text("x")
    (root / "open" / "secret").write_text("x")
    (root / "open" / "secret").chmod(0o600)
    (root / "locked").mkdir(mode=0o700)
    (root / "locked" / "inside").write_text("x")  # never listed: its directory is masked
    (root / "link").symlink_to(root / "open" / "secret")  # never followed
    (root / "skipped").mkdir()
    (root / "skipped" / "secret").write_text("x")
    (root / "skipped" / "secret").chmod(0o600)
    with socket.socket(socket.AF_UNIX) as daemon:
        daemon.bind(str(root / "open" / "deeper" / "daemon.sock"))
        dirs, files = launch.host_secrets(roots=[str(root)], skip=[str(root / "skipped")])
    assert dirs == [str(root / "locked")]
    assert sorted(files) == [str(root / "open" / "deeper" / "daemon.sock"),
                             str(root / "open" / "secret")]  # fmt: skip
    assert launch.host_secrets(roots=[str(root)], depth=1) == ([str(root / "locked")], [])

    walks: list[object] = []
    monkeypatch.setattr(launch, "host_secrets", lambda skip: walks.append(skip) or ([], []))
    monkeypatch.setattr(launch, "_scans", {})
    for _ in range(3):
        launch._recent_host_secrets(["/a"])
    assert len(walks) == 1, "a burst of launches shares one walk"
    monkeypatch.setattr(launch, "HOST_SCAN_TTL_S", 0.0)
    launch._recent_host_secrets(["/a"])
    assert len(walks) == 2, "an expired walk is done again"


def test_deleting_a_pod_survives_its_cgroups_vanishing_while_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job cgroup the agent's reset removes while ``kill_pod`` lists the pod's cgroups
    raises no ``FileNotFoundError`` out of the backend's delete (the pod would stay)."""
    from pod_runtime import cgroups

    pod = tmp_path / "cpu-1"
    (pod / "job-1").mkdir(parents=True)
    monkeypatch.setattr(cgroups, "pod_cgroup_dir", lambda pod_dir: pod)
    monkeypatch.setattr(cgroups, "_write", lambda path, text: None)
    listed = {"n": 0}
    real_rglob = Path.rglob

    def vanishing(self: Path, pattern: str) -> object:
        listed["n"] += 1
        if listed["n"] == 1:
            raise FileNotFoundError(2, "No such file or directory", str(pod / "job-1"))
        return real_rglob(self, pattern)

    monkeypatch.setattr(Path, "rglob", vanishing)
    assert cgroups.kill_pod(tmp_path / "pods" / "cpu-1", wait_s=1.0) is True
    assert listed["n"] >= 2 and not pod.exists()
