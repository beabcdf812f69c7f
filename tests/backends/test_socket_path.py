"""A local pod listens on a unix socket in its directory, whose path the kernel caps at 107
bytes: a home too deep for it is refused at start-up, naming FIREPOOL_HOME, instead of every
pod dying before it is ready."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from broker.service import Broker
from broker.settings import Settings
from functions.errors import InvalidRequest
from gateway.harness import REPO
from pool_manager.backends.base import CreateFailed
from pool_manager.backends.local import MAX_SOCKET_PATH, LocalBackend, socket_path_error
from pool_manager.catalog import Catalog


def deep(tmp_path: Path) -> Path:
    return tmp_path / ("d" * (MAX_SOCKET_PATH - len(str(tmp_path))))


def test_a_socket_path_past_the_kernels_limit_is_named(tmp_path: Path) -> None:
    assert socket_path_error(tmp_path, "cpu-0123abcd") is None
    error = socket_path_error(deep(tmp_path), "cpu-0123abcd")
    assert error is not None and "FIREPOOL_HOME" in error and str(MAX_SOCKET_PATH) in error


def test_a_broker_whose_pods_could_not_listen_is_refused_naming_the_home(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as refused:
        Broker(Settings(home=deep(tmp_path)))
    assert refused.value.field == "FIREPOOL_HOME"


def test_the_local_backend_refuses_such_a_pod_and_leaves_nothing(tmp_path: Path) -> None:
    root = deep(tmp_path)
    backend = LocalBackend(root, sandbox=False)
    pool = Catalog.default().pool("cpu")
    with pytest.raises(CreateFailed, match="socket path"):
        asyncio.run(backend.create("cpu-0123abcd", pool))
    assert not (root / "cpu-0123abcd").exists()


def test_serve_on_a_deep_home_exits_2_with_one_error_line(tmp_path: Path) -> None:
    home = deep(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--allow-unsandboxed"],
        env={"FIREPOOL_HOME": str(home), "PATH": "/usr/bin:/bin"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    assert done.stderr.startswith("error:") and "FIREPOOL_HOME" in done.stderr, done.stderr
