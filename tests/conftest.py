"""Shared fixtures: a real broker process on loopback with its own state directory
(real HTTP, real SQLite, real pod agent processes). See ``gateway.harness``."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from functions.sdk import Client
from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker
from pod_runtime.launch import sandbox_status
from tests.functions.s3_server import s3_env, s3_server
from tests.helpers import ThreadedBroker, threaded_broker
from tests.require import missing

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "functions"
BEHAVIOURS = ROOT / "tests" / "gateway" / "behaviours"
"""Functions whose behaviour the broker tests observe (deployed as one package)."""

__all__ = [
    "BrokerServer",
    "agent_pid",
    "cancel_with_agent_stopped",
    "deploy_examples",
    "require_sandbox",
    "s3_env",
    "s3_server",
    "scratch_database",
]

# -- pytest-xdist: a worker's temporary directories go under a short directory of its own,
# /tmp/pytest-gw0-<random>, instead of <basetemp>/popen-gw0/: a broker's home is often under a
# test's tmp_path, and a local pod listens on <home>/pods/<pod>/agent.sock, a path the kernel
# limits to 108 bytes (a longer one and every pod dies before it is ready). Removed when the
# worker's tests all passed, kept for a look otherwise (as tmp_path_retention_policy keeps
# the directories of a failed run).
_SHORT_BASETEMP = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and config.option.basetemp:
        config.option.basetemp = tempfile.mkdtemp(prefix=f"pytest-{worker}-")
        config.stash[_SHORT_BASETEMP] = Path(config.option.basetemp)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    short = session.config.stash.get(_SHORT_BASETEMP, None)
    if short is not None and exitstatus == 0:
        shutil.rmtree(short, ignore_errors=True)


# -- MySQL: tests read FIREPOOL_TEST_MYSQL_URL (a server URL; its database part is ignored) and
# skip with a visible reason without it; with FIREPOOL_REQUIRE_MYSQL=1 (CI) they fail instead.
# Each run creates and drops its own databases ``firepool_t_<random>``.
MYSQL_ENV = "FIREPOOL_TEST_MYSQL_URL"
REQUIRE_ENV = "FIREPOOL_REQUIRE_MYSQL"


@pytest.fixture(scope="session")
def mysql_server_url() -> str:
    url = os.environ.get(MYSQL_ENV)
    if not url:
        missing(
            REQUIRE_ENV,
            f"MySQL contract tests need {MYSQL_ENV} (e.g. mysql+pymysql://root@host/db)",
        )
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception as exc:
        missing(REQUIRE_ENV, f"MySQL at {MYSQL_ENV} is unreachable: {exc}")
    finally:
        engine.dispose()
    return url


@contextlib.contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A new empty database ``firepool_t_<random>`` on the server, dropped afterwards."""
    name = f"firepool_t_{secrets.token_hex(6)}"
    engine = create_engine(server_url, poolclass=NullPool)
    with engine.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        engine.dispose()


@pytest.fixture
def mysql_url(mysql_server_url: str) -> Iterator[str]:
    """A fresh, empty database on the test server, dropped afterwards."""
    with scratch_database(mysql_server_url) as url:
        yield url


# -- bubblewrap: the sandbox tests skip with the reason where pods cannot be sandboxed (bwrap
# missing, or its probe fails); with FIREPOOL_REQUIRE_SANDBOX=1 (CI) they fail instead. There,
# the brokers the tests start opt in to unsandboxed pods (FIREPOOL_ALLOW_UNSANDBOXED=1: every
# caller of a test broker is the test itself), unless a test says otherwise.
REQUIRE_SANDBOX_ENV = "FIREPOOL_REQUIRE_SANDBOX"
ALLOW_UNSANDBOXED_ENV = "FIREPOOL_ALLOW_UNSANDBOXED"


def require_sandbox() -> None:
    """Skip the calling test, with the reason, where pods cannot be sandboxed; fail it
    instead under ``FIREPOOL_REQUIRE_SANDBOX=1``."""
    ok, why = sandbox_status()
    if ok:
        return
    missing(REQUIRE_SANDBOX_ENV, f"pods cannot be sandboxed here: {why}")


@pytest.fixture(scope="session", autouse=True)
def unsandboxed_test_brokers() -> Iterator[None]:
    """Where pods cannot be sandboxed (and CI does not require it), the test brokers opt in
    to unsandboxed pods, as ``make run``'s single-user demo does."""
    with pytest.MonkeyPatch.context() as patch:
        if not sandbox_status()[0] and os.environ.get(REQUIRE_SANDBOX_ENV) != "1":
            patch.setenv(ALLOW_UNSANDBOXED_ENV, os.environ.get(ALLOW_UNSANDBOXED_ENV, "1"))
        yield


def agent_pid(pod: str) -> int:
    """The pid of ``pod``'s agent process (in the sandbox's own session, so not in the
    launcher's process group): what a test stops to make an agent fall silent."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv[1:4] == [b"-P", b"-m", b"pod_runtime.agent"] and pod.encode() in argv:
                return int(entry.name)
    raise AssertionError(f"no agent process for pod {pod}")


def cancel_with_agent_stopped(fp: Client, job_id: str, pod: str) -> tuple[dict[str, Any], float]:
    """Stop ``pod``'s agent (SIGSTOP: it falls silent), cancel ``job_id`` and wait for it to
    end (at most 30 s); return the job and the seconds that took. The agent is resumed after,
    whatever happened, so the pod can be deleted."""
    agent = agent_pid(pod)
    os.kill(agent, signal.SIGSTOP)
    try:
        start = time.monotonic()
        fp.cancel(job_id)  # answers once the agent's silence is established (~10 s)
        job = fp.wait(job_id, timeout_s=30)
        return job, time.monotonic() - start
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signal.SIGCONT)


def wait_running(fp: Client, job_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """The job's record once it is RUNNING; fails the test if it is not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (job := fp.job(job_id))["state"] != "RUNNING":
        assert time.monotonic() < deadline, job
        time.sleep(0.02)
    return job


def deploy_examples(server: BrokerServer | ThreadedBroker, names: dict[str, str]) -> None:
    with server.client("deployer", Role.DEPLOY) as fp:
        for name, entrypoint in names.items():
            fp.deploy(EXAMPLES / name, name=name, sku="cpu", entrypoint=entrypoint, timeout_s=30)


@contextlib.contextmanager
def running_broker(home: Path, catalog: str) -> Iterator[BrokerServer]:
    """A broker with the example ``noop`` deployed; stopped, its pods killed, afterwards."""
    server = start_broker(home, catalog)
    try:
        deploy_examples(server, {"noop": "noop:noop"})
        yield server
    finally:
        server.stop()
        kill_pods(home)


SHARED_CATALOG = (
    "budgets: {cpu: 16}\n"
    "pools:\n"
    "  cpu: {min_count: 1, max_idle_count: 2, max_count: 8, idle_timeout_s: 120}\n"
)
"""The pools of the brokers a test module shares (``broker_server``, ``fake_pod_broker``)."""


@pytest.fixture(scope="module")
def broker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerServer]:
    """A broker process on real pods, ``noop`` deployed, shared by the module's tests."""
    with running_broker(tmp_path_factory.mktemp("firepool"), SHARED_CATALOG) as server:
        yield server


@pytest.fixture(scope="module")
def fake_pod_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedBroker]:
    """The same broker in this process on fake pods, ``noop`` deployed, shared by the
    module's tests: for tests of the HTTP edge (requests, auth, errors, registration, job
    records) that need no pod process (``pool_manager/backends/fake.py`` lists what fake pods
    do not emulate)."""
    home = tmp_path_factory.mktemp("fake")
    with threaded_broker(home, SHARED_CATALOG, backend="fake") as server:
        deploy_examples(server, {"noop": "noop:noop"})
        yield server
