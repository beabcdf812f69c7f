"""The environment a job process starts with (paper §4 item 4, A.2, A.4).

Layers, later wins: the pod's own environment (the base image's PATH, CUDA paths...) minus the
agent's private variables; the caller's ``env`` after filtering; the broker's ``system_env``
(caller identity, rank and rendezvous) which the user cannot override; the agent's own
variables (``FIREPOOL_*`` files, GPU pinning) which nobody can override.

User variables are dropped, never rewritten, when their name is malformed or denied: loader
and interpreter hooks (``LD_*``, ``PYTHONPATH``...), anything of the agent (``FIREPOOL_*``)
and the GPU memory controls (``CUDA_DEVICE_MEMORY_*``, ``CUDA_VISIBLE_DEVICES``). Pure
functions, no I/O: unit-tested without a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_VALUE = 32 * 1024
MAX_USER_VARS = 256

DENY_NAMES = frozenset(
    {
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYTHONUSERBASE",
        "PYTHONINSPECT",
        "PYTHONEXECUTABLE",
        "PYTHONSAFEPATH",
        "PYTHONPLATLIBDIR",
        "BASH_ENV",
        "ENV",
        "NODE_OPTIONS",
        "NODE_PATH",
        "GLIBC_TUNABLES",
        "PERL5OPT",
        "PERL5LIB",
        "RUBYOPT",
        "RUBYLIB",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "RES_OPTIONS",
        "TMPDIR",
        "IFS",
        "PS4",
        "SHELLOPTS",
        "BASHOPTS",
    }
)
DENY_PREFIXES = ("LD_", "DYLD_", "FIREPOOL_", "CUDA_DEVICE_MEMORY_", "BASH_FUNC_")

#: Names the broker injects for gangs and identity; never settable from ``env``.
SYSTEM_NAMES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "FIREPOOL_CALLER",
        "FIREPOOL_JOB_ID",
        "FIREPOOL_ATTEMPT_ID",
    }
)
#: Agent variables in the pod's own environment that a job must not inherit.
AGENT_PRIVATE_PREFIXES = ("FIREPOOL_AGENT_",)


@dataclass(frozen=True, slots=True)
class GpuEnv:
    """The GPU view of an active job: cards by UUID and each card's framebuffer in MiB."""

    uuids: tuple[str, ...] = ()
    memory_mib: tuple[int | None, ...] = ()
    shared_cache: str | None = None
    """Path of a fresh per-attempt HAMi accounting file (CUDA_DEVICE_MEMORY_SHARED_CACHE)."""


def user_var_allowed(name: str, value: str) -> bool:
    """Whether a caller-supplied variable may reach the job."""
    if not NAME_RE.fullmatch(name) or "\0" in value or len(value) > MAX_VALUE:
        return False
    if name in DENY_NAMES or name in SYSTEM_NAMES or name.startswith(DENY_PREFIXES):
        return False
    return not (name.startswith("PYTHON") and name not in PYTHON_ALLOWED)


PYTHON_ALLOWED = frozenset(
    {
        "PYTHONUNBUFFERED",
        "PYTHONHASHSEED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONWARNINGS",
        "PYTHONFAULTHANDLER",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
    }
)


def filter_user_env(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Return (kept, dropped names). At most ``MAX_USER_VARS`` variables are kept."""
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in env.items():
        if len(kept) < MAX_USER_VARS and user_var_allowed(name, value):
            kept[name] = value
        else:
            dropped.append(name)
    return kept, sorted(dropped)


def gpu_variables(gpu: GpuEnv) -> dict[str, str]:
    """CUDA pinning by UUID and the full-card HAMi limit, for the job's environment only."""
    if not gpu.uuids:
        return {}
    env = {"CUDA_VISIBLE_DEVICES": ",".join(gpu.uuids)}
    for index, mib in enumerate(gpu.memory_mib):
        if mib is not None:
            env[f"CUDA_DEVICE_MEMORY_LIMIT_{index}"] = f"{mib}m"
    if gpu.shared_cache is not None:
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = gpu.shared_cache
    return env


def build_job_env(
    *,
    pod_env: Mapping[str, str],
    user_env: Mapping[str, str],
    system_env: Mapping[str, str],
    agent_env: Mapping[str, str],
    gpu: GpuEnv,
) -> tuple[dict[str, str], list[str]]:
    """Compose the job environment; return it and the user names that were dropped."""
    env = {k: v for k, v in pod_env.items() if not k.startswith(AGENT_PRIVATE_PREFIXES)}
    if gpu.uuids:
        # The pod's own HAMi/CUDA settings describe the admission-time share, not the job's.
        for name in list(env):
            if name.startswith("CUDA_DEVICE_MEMORY_") or name == "CUDA_VISIBLE_DEVICES":
                del env[name]
    kept, dropped = filter_user_env(user_env)
    env.update(kept)
    env.update({k: v for k, v in system_env.items() if NAME_RE.fullmatch(k) and "\0" not in v})
    env.update(agent_env)
    env.update(gpu_variables(gpu))
    return env, dropped


def preload_list(raw: str | Sequence[str]) -> tuple[str, ...]:
    """Parse ``--preload a,b`` into module names (empty entries ignored)."""
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    return tuple(m.strip() for m in items if m.strip())
