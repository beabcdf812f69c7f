"""Incremental dependencies keyed by the requirements digest (paper A.2) and the job
environment: user env filtered, system env not overridable, GPU env per job (A.4)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pod_runtime.cgroups import JobCgroups, JobLimits
from pod_runtime.gpu import Nvml
from pod_runtime.jobenv import GpuEnv, build_job_env, filter_user_env
from tests.conftest import require_sandbox
from tests.helpers import make_wheel
from tests.pod_runtime.conftest import AgentProcess, make_zip

PROBE = """
import os
def version(x):
    import demo_pkg
    return demo_pkg.VALUE
def env(x):
    return dict(os.environ)
def plant(x):
    import demo_pkg
    try:
        with open(os.path.join(os.path.dirname(demo_pkg.__file__), "evil.py"), "w"):
            return "planted"
    except OSError as exc:
        return type(exc).__name__
"""


def blob(path: Path, text: str) -> dict[str, str]:
    path.write_text(text)
    return {"url": path.as_uri(), "digest": hashlib.sha256(path.read_bytes()).hexdigest()}


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    url, digest = make_zip(tmp_path_factory.mktemp("probe") / "probe.zip", {"probe.py": PROBE})
    return {"url": url, "digest": digest}


def job(attempt_id: str, package: dict[str, str], fn: str, **extra: Any) -> dict[str, Any]:
    return {"attempt_id": attempt_id, "package": package, "entrypoint": f"probe:{fn}", **extra}


def log_of(agent: AgentProcess, attempt_id: str) -> str:
    return str(agent.call("GET", f"/attempts/{attempt_id}/logs?offset=0")[1]["data"])


def test_requirements_install_once_per_digest_and_reinstall_after_a_change(
    agent_factory: Callable[..., AgentProcess], probe: dict[str, str], tmp_path: Path
) -> None:
    agent = agent_factory(name="deps")
    v1 = make_wheel(tmp_path / "v1", "v1")
    v2 = make_wheel(tmp_path / "v2", "v2")
    req1 = blob(tmp_path / "req1.txt", f"{v1}\n")
    req2 = blob(tmp_path / "req2.txt", f"{v2}\n")
    site = agent.pod_dir / "cache" / "site"

    first = agent.run(job("deps-1:1", probe, "version", requirements=req1))
    assert first["output"] == "v1", first
    assert "installing requirements" in log_of(agent, "deps-1:1")
    assert [p.name for p in site.glob(".firepool-requirements-*")] == [
        f".firepool-requirements-{req1['digest']}"
    ]
    again = agent.run(job("deps-2:1", probe, "version", requirements=req1))
    assert again["output"] == "v1"
    assert "installing requirements" not in log_of(agent, "deps-2:1")

    assert agent.run(job("deps-3:1", probe, "version", requirements=req2))["output"] == "v2"
    assert len(list(site.glob(".firepool-requirements-*"))) == 1
    back = agent.run(job("deps-4:1", probe, "version", requirements=req1))
    assert back["output"] == "v1"
    assert "installing requirements" in log_of(agent, "deps-4:1")

    broken = blob(tmp_path / "broken.txt", f"{tmp_path / 'missing-1.0-py3-none-any.whl'}\n")
    failed = agent.run(job("deps-5:1", probe, "version", requirements=broken))
    assert failed["error"]["class"] == "DependencyInstallFailed"
    assert "missing-1.0" in failed["error"]["message"]
    assert failed["exit_code"] is None
    assert list(site.glob(".firepool-requirements-*")) == []


def test_a_marker_an_install_planted_skips_no_later_install(
    agent_factory: Callable[..., AgentProcess], probe: dict[str, str], tmp_path: Path
) -> None:
    """A package's files land in the install target, markers included: one that ships the
    marker of another pin set made the pod skip that set's install later, and the next
    caller's job ran on the planting package instead (adversarial run, 3 of 3)."""
    agent = agent_factory(name="deps-plant")
    honest = blob(tmp_path / "honest.txt", f"{make_wheel(tmp_path / 'v2', 'v2')}\n")
    marker = f".firepool-requirements-{honest['digest']}"
    planting = make_wheel(tmp_path / "v1", "planted", extra={marker: b""})
    req = blob(tmp_path / "planting.txt", f"{planting}\n")
    site = agent.pod_dir / "cache" / "site"

    assert agent.run(job("plant-1:1", probe, "version", requirements=req))["output"] == "planted"
    assert [p.name for p in site.glob(".firepool-requirements-*")] == [
        f".firepool-requirements-{req['digest']}"
    ], "only the install's own marker"
    later = agent.run(job("plant-2:1", probe, "version", requirements=honest))
    assert later["output"] == "v2", later
    assert "installing requirements" in log_of(agent, "plant-2:1")


def test_a_sandboxed_install_runs_as_the_jobs_uid_and_is_roots_once_done(
    agent_factory: Callable[..., AgentProcess],
) -> None:
    """The install's build code is the user's: it ran as root beside the agent, and what it
    installed stayed writable to every later job of the pod (the caller's next session)."""
    require_sandbox()
    if os.geteuid() != 0:
        pytest.skip("jobs change uid only in a sandbox started as root")
    agent = agent_factory(name="deps-uid", sandbox=True)
    given = agent.pod_dir / "given"  # the sandbox's /tmp is its own: files in the pod dir
    given.mkdir()
    url, digest = make_zip(given / "probe.zip", {"probe.py": PROBE})
    probe = {"url": url, "digest": digest}
    req = blob(given / "req.txt", f"{make_wheel(given / 'v1', 'v1')}\n")
    assert agent.call("GET", "/healthz")[1]["job_uid"] == 65534
    first = agent.run(job("uid-1:1", probe, "version", requirements=req))
    assert first["output"] == "v1", first
    cache = agent.pod_dir / "cache"
    kept = [p for top in ("site", "pip", "uv") for p in (cache / top).rglob("*")]
    assert kept and {p.lstat().st_uid for p in kept} == {0}, "handed back to root"
    planted = agent.run(job("uid-2:1", probe, "plant", requirements=req))
    assert planted["output"] == "PermissionError", planted


def test_user_env_is_filtered_and_system_env_wins(
    agent: AgentProcess, probe: dict[str, str]
) -> None:
    user = {
        "GOOD": "1",
        "PYTHONUNBUFFERED": "1",
        "LD_PRELOAD": "/evil.so",
        "LD_AUDIT": "x",
        "LD_LIBRARY_PATH": "/evil",
        "PYTHONPATH": "/evil",
        "PYTHONSTARTUP": "/evil.py",
        "BASH_ENV": "/evil.sh",
        "NODE_OPTIONS": "--require /evil",
        "GLIBC_TUNABLES": "x",
        "FIREPOOL_INPUT_FILE": "/etc/passwd",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "99g",
        "MASTER_ADDR": "evil",
        "RANK": "7",
        "bad name": "x",
    }
    system = {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "FIREPOOL_CALLER": "alice",
    }
    result = agent.run(job("env-1:1", probe, "env", env=user, system_env=system))
    env = result["output"]
    assert env["GOOD"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    for denied in (
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "BASH_ENV",
        "NODE_OPTIONS",
        "GLIBC_TUNABLES",
        "CUDA_DEVICE_MEMORY_LIMIT_0",
        "bad name",
    ):
        assert env.get(denied) != user[denied], denied  # the pod's own value may exist
    assert env["FIREPOOL_INPUT_FILE"].startswith(str(agent.pod_dir))
    assert {k: env[k] for k in system} == system
    assert "dropped environment variables: " in log_of(agent, "env-1:1")


def test_filtering_is_by_name_not_by_value() -> None:
    kept, dropped = filter_user_env({"OK_1": "$(rm -rf /)", "LD_BIND_NOW": "1", "X": "a\0b"})
    assert kept == {"OK_1": "$(rm -rf /)"}
    assert dropped == ["LD_BIND_NOW", "X"]


def test_an_active_job_gets_its_gpus_by_uuid_and_the_full_card() -> None:
    pod_env = {
        "PATH": "/usr/bin",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/admission.cache",
        "CUDA_VISIBLE_DEVICES": "0",
        "FIREPOOL_AGENT_SECRET": "s",
    }
    gpu = GpuEnv(("GPU-aaa", "GPU-bbb"), (143771, None), "/pod/workspace/gpu/j:1.cache")
    env, dropped = build_job_env(
        pod_env=pod_env,
        user_env={"CUDA_VISIBLE_DEVICES": "1"},
        system_env={},
        agent_env={},
        gpu=gpu,
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaa,GPU-bbb"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "143771m"
    assert "CUDA_DEVICE_MEMORY_LIMIT_1" not in env  # unknown size: no stale admission value
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/pod/workspace/gpu/j:1.cache"
    assert "FIREPOOL_AGENT_SECRET" not in env and env["PATH"] == "/usr/bin"
    assert dropped == ["CUDA_VISIBLE_DEVICES"]


def test_a_cpu_job_keeps_the_pods_device_environment() -> None:
    env, _ = build_job_env(
        pod_env={"CUDA_VISIBLE_DEVICES": "0"},
        user_env={},
        system_env={},
        agent_env={},
        gpu=GpuEnv(),
    )
    assert env == {"CUDA_VISIBLE_DEVICES": "0"}


def test_gpu_pods_degrade_without_nvml_and_standbys_load_no_gpu_library(
    agent_factory: Callable[..., AgentProcess], probe: dict[str, str]
) -> None:
    standby = agent_factory("--role", "standby", "--gpu-uuid", "GPU-fake-0", name="standby")
    assert standby.call("GET", "/healthz")[1]["role"] == "standby"
    for pid in [standby.proc.pid, *children(standby.proc.pid)]:
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libcuda" not in maps and "libnvidia-ml" not in maps
    result = standby.run(job("gpu-1:1", probe, "env"))
    env = result["output"]
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-fake-0"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].endswith("workspace/gpu/gpu-1:1.cache")
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in env  # NVML is missing here: size unknown
    assert standby.reset()["clean"] is True


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


async def test_nvml_degrades_to_unknown_without_a_driver() -> None:
    nvml = Nvml()
    if nvml.available:  # a GPU host: the degraded path is not reachable here
        pytest.skip("NVML is available on this host")
    assert "NVML unavailable" in nvml.error
    assert nvml.memory_mib(["GPU-x", "GPU-y"]) == (None, None)
    assert nvml.compute_pids(["GPU-x"]) is None
    assert await nvml.check_after_reset(["GPU-x"]) is None


def test_job_cgroups_get_limits_and_report_oom_where_controllers_exist(tmp_path: Path) -> None:
    """Simulation: this host delegates no memory/pids controller, so a plain directory stands
    in for the pod's cgroup (the kernel would create the interface files itself). It checks
    what the agent writes and how it reads ``memory.events``, not the kernel's enforcement."""
    pod = tmp_path / "pod"
    pod.mkdir()
    (pod / "cgroup.controllers").write_text("cpu memory pids\n")
    (pod / "cgroup.subtree_control").write_text("")
    cgroups = JobCgroups(pod, JobLimits(memory_max=256 << 20, pids_max=64))
    assert (pod / "cgroup.subtree_control").read_text() == "+memory +pids"
    procs = cgroups.new_job("j:1")
    assert procs is not None and procs.endswith("cgroup.procs")
    job = Path(procs).parent
    assert (job / "memory.max").read_text() == str(256 << 20)
    assert (job / "pids.max").read_text() == "64"
    assert (job / "memory.oom.group").read_text() == "1"
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    assert cgroups.oom_killed() is False
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")
    assert cgroups.oom_killed() is True
