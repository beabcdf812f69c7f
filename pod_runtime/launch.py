"""The argv a local backend spawns for one pod (``start_new_session=True``, never waited on
by the pod: pods outlive the broker, like Kubernetes pods).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def sandbox_status() -> tuple[bool, str]:
    """Whether pods can be sandboxed here, and why (or why not)."""
    return False, "sandbox not implemented yet: pods run as plain processes"


def agent_command(
    *,
    pod_name: str,
    pod_dir: Path,
    listen: str,
    python: str = sys.executable,
    preload: Sequence[str] = (),
    zygote: bool = True,
    network: bool = True,
    role: str = "active",
    gpu_uuids: Sequence[str] = (),
    sandbox: bool | None = None,
) -> list[str]:
    """The pod agent's argv (see ``pod_runtime.settings`` for the flags)."""
    argv = [
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
        argv += ["--preload", ",".join(preload)]
    if not zygote:
        argv.append("--no-zygote")
    if not network:
        argv.append("--no-network-note")
    for uuid in gpu_uuids:
        argv += ["--gpu-uuid", uuid]
    return argv
