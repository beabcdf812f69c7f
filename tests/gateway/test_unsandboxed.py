"""No privilege escalation in the embedded default: a job of an invoke-only caller never reads
the broker's signing key (with which it could mint admin tokens) nor its job store.

In the sandbox the state directory is out of the job's sight. Where pods cannot be sandboxed
(no bubblewrap: these tests hide it with a ``PATH`` without ``bwrap``; or
``FIREPOOL_SANDBOX=0``) ``firepool serve`` refuses to start, saying why on the console. An
operator may opt in (``FIREPOOL_ALLOW_UNSANDBOXED=1``): the broker then says on the console
what that costs, and a job can indeed read the key, as the last test shows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.pod_isolation import check_pod_isolation
from broker.settings import Settings
from functions.errors import InvalidRequest
from functions.sdk import Client
from gateway.auth import Role
from gateway.harness import REPO, BrokerServer, free_port, kill_pods, start_broker
from pool_manager.backends import local
from tests.conftest import ALLOW_UNSANDBOXED_ENV, require_sandbox

STEAL = '''
def read(path):
    """The first bytes of the file ``path``, as hex."""
    with open(path, "rb") as f:
        return f.read(64).hex()
'''


@pytest.fixture(scope="module")
def path_without_bwrap(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ``PATH`` with every program of this one but ``bwrap``: a machine without bubblewrap."""
    bin_dir = tmp_path_factory.mktemp("nobwrap")
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = bin_dir / entry.name
            if entry.name != "bwrap" and not link.exists() and not link.is_symlink():
                link.symlink_to(entry.path)
    return str(bin_dir)


@pytest.fixture
def home() -> Iterator[Path]:
    """A state directory outside /tmp (which the sandbox replaces whole anyway)."""
    base = Path(tempfile.mkdtemp(prefix="firepool-unsandboxed-", dir="/var/tmp"))
    try:
        yield base / "home"
    finally:
        kill_pods(base / "home")
        shutil.rmtree(base, ignore_errors=True)


def steal(server: BrokerServer, tmp_path: Path) -> dict[str, dict[str, object]]:
    """What a job of an invoke-only caller gets reading the signing key and the job store."""
    package = tmp_path / "steal"
    package.mkdir()
    (package / "steal.py").write_text(STEAL)
    with server.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(package, name="steal", sku="cpu", entrypoint="steal:read", max_retries=0)
    with Client(server.url, server.token("mallory", Role.INVOKE)) as fp:
        return {
            name: fp.invoke("steal", str(server.home / name)) for name in ("signing.key", "jobs.db")
        }


def serve(home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``firepool serve`` on ``home`` with ``env``, as a new user runs it (no opt-in)."""
    base = {k: v for k, v in os.environ.items() if k != ALLOW_UNSANDBOXED_ENV}
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(free_port())],
        env={**base, "FIREPOOL_HOME": str(home), **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_sandboxed_job_of_an_invoke_only_caller_reads_neither_the_signing_key_nor_the_job_store(
    home: Path, tmp_path: Path
) -> None:
    require_sandbox()
    server = start_broker(home, "pools:\n  cpu: {max_count: 2}\n")
    try:
        seen = steal(server, tmp_path)
    finally:
        server.stop()
    key = (home / "signing.key").read_bytes()[:64].hex()
    for name, job in seen.items():
        assert job["state"] == "FAILED", (name, job)
        assert "No such file" in str(job["error"]), (name, job)
        assert key not in str(job), name


def test_without_a_sandbox_serve_refuses_to_start_saying_why_on_the_console(
    home: Path, path_without_bwrap: str
) -> None:
    refused = serve(home, PATH=path_without_bwrap)
    assert refused.returncode == 2, refused
    assert refused.stderr.startswith(
        "error: pods are not sandboxed here (bubblewrap (bwrap) is not installed): every job "
        "would run as this broker's user"
    ), refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "signing key" in refused.stderr and "job store" in refused.stderr
    assert "FIREPOOL_ALLOW_UNSANDBOXED=1" in refused.stderr
    assert not home.exists(), "refused before the state directory was made"
    off = serve(home, FIREPOOL_SANDBOX="0")
    assert off.returncode == 2 and "(the sandbox is turned off)" in off.stderr, off


def test_opted_in_without_a_sandbox_serve_warns_on_the_console_and_a_job_can_read_the_key(
    home: Path, tmp_path: Path, path_without_bwrap: str
) -> None:
    """What ``FIREPOOL_ALLOW_UNSANDBOXED=1`` means, stated by the warning and shown here: a
    job of any caller reads the broker's signing key and job store."""
    server = start_broker(
        home,
        "pools:\n  cpu: {max_count: 2}\n",
        extra_env={"PATH": path_without_bwrap, ALLOW_UNSANDBOXED_ENV: "1"},
    )
    try:
        seen = steal(server, tmp_path)
        console = server.log()  # the broker's stderr: ``start_broker`` sends it there
    finally:
        server.stop()
    assert "WARNING: pods are not sandboxed here (bubblewrap (bwrap) is not installed)" in console
    assert "FIREPOOL_ALLOW_UNSANDBOXED=1" in console
    assert seen["signing.key"]["output"] == (home / "signing.key").read_bytes()[:64].hex()
    assert bytes.fromhex(str(seen["jobs.db"]["output"])).startswith(b"SQLite format 3\0")


def test_with_json_logs_the_warning_is_a_json_line_too(home: Path, path_without_bwrap: str) -> None:
    """``--log-format json`` promises one JSON object per line: the console warning of an
    unsandboxed broker is one of them (a wrapped text paragraph broke every log reader)."""
    server = start_broker(
        home,
        "pools:\n  cpu: {max_count: 2}\n",
        extra_env={"PATH": path_without_bwrap, ALLOW_UNSANDBOXED_ENV: "1",
                   "FIREPOOL_LOG_FORMAT": "json"},
    )  # fmt: skip
    try:
        lines = [json.loads(line) for line in server.log().splitlines() if line.strip()]
    finally:
        server.stop()
    [warning] = [line for line in lines if "not sandboxed" in line["message"]]
    assert warning["level"] == "WARNING"
    assert warning["message"].startswith("pods are not sandboxed here (bubblewrap (bwrap) is not")
    assert "FIREPOOL_ALLOW_UNSANDBOXED=1" in warning["message"]


def test_the_isolation_check_names_what_it_found_and_how_to_opt_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local, "sandbox_status", lambda: (False, "bubblewrap is missing"))
    with pytest.raises(InvalidRequest) as refused:
        check_pod_isolation(Settings())
    assert refused.value.field == "FIREPOOL_ALLOW_UNSANDBOXED"
    assert "(bubblewrap is missing)" in refused.value.message
    warning = check_pod_isolation(Settings(allow_unsandboxed=True))
    assert warning is not None and warning.startswith("WARNING: pods are not sandboxed here")
    with pytest.raises(InvalidRequest) as required:
        check_pod_isolation(Settings(sandbox=True, allow_unsandboxed=True))
    assert required.value.field == "FIREPOOL_SANDBOX"
    monkeypatch.setattr(local, "sandbox_status", lambda: (True, "bwrap works"))
    assert check_pod_isolation(Settings()) is None
    with pytest.raises(InvalidRequest) as fake:  # its jobs run in the broker's own process
        check_pod_isolation(Settings(backend="fake"))
    assert "(FIREPOOL_BACKEND=fake runs every job inside the broker's own process)" in str(
        fake.value
    )
