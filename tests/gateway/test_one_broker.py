"""One broker per state directory and per job store (``gateway.exclusive``).

Before, a second broker on the same ``FIREPOOL_HOME`` started, rebuilt the pool from the same
pod records and handed pods one caller had used to another (adversarial run: 2 of 2, on the
``idle`` path), and two brokers with their own homes on one MySQL store re-queued each other's
running jobs and ran them twice. Now the second is refused before it touches a pod or a job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from functions.errors import Conflict
from gateway.exclusive import BrokerLocks
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
