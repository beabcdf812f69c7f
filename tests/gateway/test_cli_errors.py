"""The CLI's refusals that need no broker: a bad environment, a job store that cannot work or
does not answer, a token with no broker's key, ``down`` on a home that does not exist. Each is
one ``error:`` line and exit 2, run as the operator runs it (a subprocess in a scratch
directory, so whatever a command leaves in its working directory shows)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.harness import REPO, free_port, kill_pods
from tests.conftest import ALLOW_UNSANDBOXED_ENV


def _firepool(cwd: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    # The broker's settings are the test's own; the opt-in to unsandboxed pods on a machine
    # without bubblewrap (tests/conftest.py) is kept, or serve refuses before what is tested.
    full = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FIREPOOL_") or k == ALLOW_UNSANDBOXED_ENV
    }
    full.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *argv],
        env=full, cwd=cwd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("command", ["serve", "migrate"])
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("bogus", "FIREPOOL_STORE_URL is not a database URL"),
        ("postgresql://x@127.0.0.1/x", "FIREPOOL_STORE_URL: unsupported job store backend"),
        ("sqlite:///:memory:", "FIREPOOL_STORE_URL names an in-memory SQLite database"),
        ("mysql+pymysql://nobody:secret@127.0.0.1:{port}/x", "(FIREPOOL_STORE_URL): (2003, "),
    ],
    ids=["not-a-url", "postgresql", "in-memory", "unreachable-mysql"],
)
def test_a_store_url_that_cannot_work_is_one_error_line(
    command: str, url: str, says: str, tmp_path: Path
) -> None:
    """One line and exit 2, not a traceback with exit 1 (or uvicorn's 3); an unreachable
    server is exit 2 too, like an unreachable gateway. The URL is checked before the store's
    lock is taken, so nothing (no file named ``:memory:``) is left in the working directory."""
    env = {
        "FIREPOOL_HOME": str(tmp_path / "home"),
        "FIREPOOL_STORE_URL": url.format(port=free_port()),  # nothing listens there
    }
    argv = [command, "--port", str(free_port())] if command == "serve" else [command]
    try:
        err = _one_error_line(_firepool(tmp_path, env, *argv))
    finally:
        kill_pods(tmp_path / "home")
    assert says in err, err
    assert "secret" not in err  # the password is never echoed
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["home"])


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"FIREPOOL_RETENTION_SWEEP_S": "0"}, "FIREPOOL_RETENTION_SWEEP_S must be a number of "
         "seconds > 0, not '0'"),
        ({"FIREPOOL_PUBLIC_URL": "ftp://x"}, "FIREPOOL_PUBLIC_URL must be an http:// or https:// "
         "URL with a host"),
        ({"FIREPOOL_SANDBOX": "maybe"}, "FIREPOOL_SANDBOX must be 1, true, 0, false or auto"),
        ({"FIREPOOL_MAX_JSON_BYTES": "16M"}, "FIREPOOL_MAX_JSON_BYTES must be a whole number > 0"),
        ({"FIREPOOL_PORT": "0"}, "FIREPOOL_PORT must be a port (1-65535), not '0'"),
    ],
    ids=["sweep-0", "ftp-public-url", "sandbox-maybe", "json-16M", "port-0"],
)  # fmt: skip
def test_serve_refuses_a_bad_variable_before_starting(
    env: dict[str, str], says: str, tmp_path: Path
) -> None:
    """Each is refused before anything starts: a sweep of 0 would make an idle broker spin a
    core; an ftp:// public URL would fail every job ``PackageRejected``."""
    home = tmp_path / "home"
    argv = ["serve"] if "FIREPOOL_PORT" in env else ["serve", "--port", str(free_port())]
    try:
        err = _one_error_line(_firepool(tmp_path, {"FIREPOOL_HOME": str(home), **env}, *argv))
    finally:
        kill_pods(home)
    assert err.startswith(f"error: {says}"), err
    assert not home.exists()  # refused before anything was made


def test_token_never_makes_a_signing_key(tmp_path: Path) -> None:
    """Run outside the broker's home, ``firepool token`` refuses: a key of its own would sign
    tokens the broker refuses with 401."""
    proc = _firepool(tmp_path, {}, "token", "--caller", "me")
    home = (tmp_path / ".firepool").resolve()
    assert _one_error_line(proc) == (
        f"error: no signing key in {home}: no broker has been started with FIREPOOL_HOME="
        f"{home}; start it first (`firepool serve`), or point FIREPOOL_HOME at its state "
        "directory\n"
    )
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []


def test_down_on_a_home_that_does_not_exist_exits_2(tmp_path: Path) -> None:
    """A typo in FIREPOOL_HOME must not say "no running pods", exit 0, while the pods run on."""
    home = tmp_path / "no-such-home"
    err = _one_error_line(_firepool(tmp_path, {"FIREPOOL_HOME": str(home)}, "down"))
    assert err == f"error: FIREPOOL_HOME={home} does not exist: no pods to stop there\n"
    assert not home.exists()
