"""Property tests: whatever names an archive holds and whatever env a caller sends, the
rules hold (no path leaves the package dir; no loader hook or system variable is taken from
the caller)."""

from __future__ import annotations

import os.path

from hypothesis import given, settings
from hypothesis import strategies as st

from functions.errors import PackageRejected
from pod_runtime.archive import _check_name
from pod_runtime.jobenv import SYSTEM_NAMES, GpuEnv, build_job_env, user_var_allowed

ROOT = "/pod/workspace/pkg"
NAME_PARTS = st.sampled_from(["a", "b.py", ".", "..", "", "C:", "\\", "..\\x", "\0", "\n", "é"])
NAMES = st.lists(NAME_PARTS, min_size=1, max_size=6).map("/".join) | st.text(max_size=40)


@settings(max_examples=500, deadline=None)
@given(NAMES)
def test_no_accepted_entry_name_leaves_the_package_dir(raw: str) -> None:
    try:
        name, _ = _check_name(raw)
    except PackageRejected:
        return
    target = os.path.normpath(os.path.join(ROOT, name))
    assert target.startswith(ROOT + "/")
    assert not name.startswith("/") and ".." not in name.split("/")
    assert "\\" not in name and "\0" not in name


DANGEROUS = [
    "LD_PRELOAD",
    "LD_AUDIT",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "BASH_ENV",
    "NODE_OPTIONS",
    "GLIBC_TUNABLES",
    "FIREPOOL_INPUT_FILE",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_VISIBLE_DEVICES",
    *sorted(SYSTEM_NAMES),
]
PLAIN_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
ENV_NAMES = st.sampled_from(DANGEROUS) | PLAIN_NAMES


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(ENV_NAMES, st.text(max_size=20), max_size=12))
def test_the_caller_never_sets_a_denied_or_system_variable(user: dict[str, str]) -> None:
    system = {"RANK": "0", "FIREPOOL_CALLER": "alice"}
    env, dropped = build_job_env(
        pod_env={},
        user_env=user,
        system_env=system,
        agent_env={"TMPDIR": "/scratch"},
        gpu=GpuEnv(("GPU-1",)),
    )
    owned = {**system, "TMPDIR": "/scratch", "CUDA_VISIBLE_DEVICES": "GPU-1"}
    for name, value in user.items():
        if name in DANGEROUS or name.startswith(("LD_", "FIREPOOL_", "CUDA_DEVICE_MEMORY_")):
            assert name in dropped
            assert env.get(name) == owned.get(name)  # absent, or set by broker/agent
        elif name not in dropped:
            assert user_var_allowed(name, value)
            assert env[name] == owned.get(name, value)
    assert env["RANK"] == "0" and env["FIREPOOL_CALLER"] == "alice"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1" and env["TMPDIR"] == "/scratch"
