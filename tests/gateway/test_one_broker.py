"""One broker per state directory and per job store (``broker.exclusive``).

A second broker on the same ``FIREPOOL_HOME`` would rebuild the pool from the same pod records
and hand one caller's used pods to another, and two brokers with their own homes on one
MySQL store would re-queue each other's running jobs and run them twice: the second is refused
before it touches a pod or a job.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from broker.exclusive import BrokerLocks
from functions.errors import Conflict
from functions.sdk import ApiError
from gateway.harness import REPO, kill_pods, start_broker


def _serve(
    home: Path, port: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``firepool serve`` on ``home`` and the first broker's ``port`` (so that, refused or
    not, it cannot go on serving), expected to exit at once."""
    env = dict(os.environ, FIREPOOL_HOME=str(home), **(extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", port],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_second_broker_on_the_same_home_or_store_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_broker(home, "pools:\n  cpu: {min_count: 1, max_count: 2}\n")
    try:
        port = server.url.rsplit(":", 1)[1]
        again = _serve(home, port)
        store = f"sqlite:///{home / 'jobs.db'}"
        beside = _serve(tmp_path / "other", port, {"FIREPOOL_STORE_URL": store})
        assert server.proc.poll() is None, "the first broker runs on"
    finally:
        server.stop()
        kill_pods(home)
    assert again.returncode == 2, again
    assert again.stderr.startswith("error: ") and again.stderr.count("\n") == 1, again.stderr
    assert f"in use by another broker (pid {server.proc.pid})" in again.stderr
    assert beside.returncode == 2 and "the job store" in beside.stderr, beside.stderr
    # Freed with the broker: a new one takes both.
    locks = BrokerLocks(home, store)
    locks.acquire()
    locks.release()


def test_a_killed_brokers_locks_go_with_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_broker(home, "pools:\n  cpu: {max_count: 1}\n")
    server.kill()
    try:
        locks = BrokerLocks(home, f"sqlite:///{home / 'jobs.db'}")
        locks.acquire()
        locks.release()
    finally:
        kill_pods(home)


@pytest.mark.mysql
def test_two_brokers_on_one_mysql_store_are_refused(tmp_path: Path, mysql_url: str) -> None:
    url = mysql_url
    first = BrokerLocks(tmp_path / "a", url)
    first.acquire()
    try:
        second = BrokerLocks(tmp_path / "b", url)
        with pytest.raises(Conflict, match="is in use by another broker"):
            second.acquire()
        assert not second.held
    finally:
        first.release()
    again = BrokerLocks(tmp_path / "b", url)
    again.acquire()  # the server dropped the lock with the first connection
    again.release()


@pytest.mark.mysql
def test_a_mysql_lock_is_one_per_schema_and_kept_through_a_lost_connection(
    tmp_path: Path, mysql_url: str
) -> None:
    """``/?database=x`` and ``/x`` are one lock (named by the schema, not the URL's text),
    and a lock lost with its connection (``wait_timeout``, a server restart) is taken again,
    so no second broker starts beside the first."""
    first = BrokerLocks(tmp_path / "a", mysql_url)
    first.acquire()
    try:
        parsed = make_url(mysql_url)
        spelled = parsed.set(database=None).update_query_dict({"database": parsed.database})
        other = BrokerLocks(tmp_path / "b", spelled.render_as_string(hide_password=False))
        with pytest.raises(Conflict):
            other.acquire()
        engine = create_engine(mysql_url, poolclass=NullPool)
        with engine.connect() as conn:  # end the lock's connection, as the server would
            holder = conn.execute(text(f"SELECT IS_USED_LOCK('{first._lock_name}')")).scalar()
            conn.execute(text(f"KILL {int(holder)}"))
        engine.dispose()
        assert first.check() is None, "taken again on a new connection"
        with pytest.raises(Conflict):
            BrokerLocks(tmp_path / "c", mysql_url).acquire()
    finally:
        first.release()


def test_every_spelling_of_one_sqlite_store_is_one_lock(tmp_path: Path) -> None:
    """A ``file:...?uri=true`` URL, a relative path and a hard link to the store all take
    the one lock of the store's file."""
    db = tmp_path / "a" / "jobs.db"
    first = BrokerLocks(tmp_path / "a", f"sqlite:///{db}")
    first.acquire()
    (tmp_path / "c").mkdir()
    os.link(db, tmp_path / "c" / "jobs.db")
    try:
        for n, url in enumerate(
            [f"sqlite:///file:{db}?uri=true", f"sqlite:///{tmp_path}/c/jobs.db"]
        ):
            other = BrokerLocks(tmp_path / f"home{n}", url)
            with pytest.raises(Conflict, match="the job store"):
                other.acquire()
    finally:
        first.release()


def test_a_lock_file_removed_under_a_running_broker_is_taken_again(tmp_path: Path) -> None:
    """The lock is on the path, not only the file: with ``broker.lock`` removed, the running
    broker takes it again, so no second broker starts on the same home beside it."""
    home = tmp_path / "home"
    first = BrokerLocks(home, f"sqlite:///{home / 'jobs.db'}")
    first.acquire()
    try:
        (home / "broker.lock").unlink()
        assert first.check() is None  # taken again at its path
        assert (home / "broker.lock").read_text() == f"{os.getpid()}\n"
        second = BrokerLocks(home, f"sqlite:///{tmp_path / 'other.db'}")
        with pytest.raises(Conflict):
            second.acquire()
        (home / "broker.lock").unlink()
        second.acquire()  # another broker got in while the path was gone
        try:
            assert "in use by another broker" in (first.check() or "")
        finally:
            second.release()
    finally:
        first.release()


def test_a_running_broker_that_lost_its_home_lock_to_another_stops_dispatching(
    tmp_path: Path,
) -> None:
    """The broker's own loop around ``check`` (``Broker._lock_checks``): a lock taken by
    another process while the path was gone stops this broker (fail closed), ``/readyz``
    says 503, and an invoke is refused rather than queued; one whose lock is only removed
    takes it again and serves on."""
    home = tmp_path / "home"
    catalog = "pools:\n  cpu: {min_count: 0, max_count: 1}\n"
    server = start_broker(home, catalog, extra_env={"FIREPOOL_LOCK_CHECK_S": "0.2"})
    lock = home / "broker.lock"
    try:
        lock.unlink()
        deadline = time.monotonic() + 10
        while not lock.exists() or lock.read_text() != f"{server.proc.pid}\n":
            assert time.monotonic() < deadline, "not taken again at its path"
            time.sleep(0.02)  # the next check (every 0.2 s) takes it again
        assert httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200
        lock.unlink()
        with lock.open("w") as other:  # another broker gets in while the path is gone
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            other.write("1\n")
            other.flush()
            deadline = time.monotonic() + 10
            while httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200:
                assert time.monotonic() < deadline, "the broker never noticed"
                time.sleep(0.05)
            with server.client("alice") as client, pytest.raises(ApiError) as refused:
                client.invoke("noop", {})
            assert refused.value.status == 503, refused.value
            assert "stopped taking jobs: the state directory" in str(refused.value)
            assert server.proc.poll() is None, "it stops dispatching, and waits for its operator"
    finally:
        server.stop()
        kill_pods(home)
    assert "stopping: the state directory" in server.log()
