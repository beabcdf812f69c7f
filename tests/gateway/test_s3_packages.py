"""Packages and logs in S3, end to end (issue 22): a real broker in this process (uvicorn on
loopback, real local pods, SQLite) on the ``s3`` package store of a real SeaweedFS
(``tests/functions/s3_server.py``).

What holds: a deploy sends its bytes straight to the object store and a second deploy of
the same directory sends none; a pod fetches its package from the object store, so the
broker serves 0 package bytes; a tampered and an expired URL each fail the attempt
``PackageFetchFailed``; with the object store stopped an upload is refused 503 with
``Retry-After`` and a fetch fails the attempt ``PackageFetchFailed`` by its deadline; a
finished job's log is read back from the bucket at the same offsets.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest

from broker.log_objects import ObjectLogArchive
from functions.errors import StoreUnavailable
from functions.package_transfer import _put_part
from functions.packaging import package_file
from functions.sdk import ApiError
from functions.stores import S3PackageStore
from gateway.auth import Role
from gateway.harness import REPO
from pod_runtime.launch import sandbox_status
from tests.functions.s3_server import BUCKET, S3Server, start_or_skip
from tests.helpers import ThreadedBroker, threaded_broker

TIMEOUT_S = 60.0


def s3_settings(server: S3Server, **more: Any) -> dict[str, Any]:
    return {
        "package_store": "s3", "s3_bucket": BUCKET, "s3_endpoint_url": server.endpoint,
        "s3_path_style": True, "s3_region": "us-east-1", **more,
    }  # fmt: skip


def write_function(directory: Path, text: str) -> Path:
    """A function directory whose ``main.f`` prints to its log and returns ``text``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "main.py").write_text(
        f"def f(x):\n    print('line one')\n    print('line two', x)\n    return {text!r}\n"
    )
    return directory


def package_digest(directory: Path) -> tuple[str, int]:
    with package_file(directory) as package:
        return package.digest, package.size


def head(server: S3Server, key: str) -> dict[str, Any] | None:
    client: Any = server.client()
    try:
        answer: dict[str, Any] = client.head_object(Bucket=BUCKET, Key=key)
    except Exception:
        return None
    return answer


@pytest.fixture
def served(s3_env: S3Server, tmp_path: Path) -> Iterator[ThreadedBroker]:
    with threaded_broker(tmp_path / "home", **s3_settings(s3_env)) as broker:
        yield broker


def metric(served: ThreadedBroker, name: str) -> float:
    text = httpx.get(f"{served.url}/metrics").text
    [line] = [line for line in text.splitlines() if line.startswith(f"{name} ")]
    return float(line.split()[1])


def test_a_deploy_goes_to_the_bucket_once_and_pods_fetch_from_it_not_the_broker(
    served: ThreadedBroker, s3_env: S3Server, tmp_path: Path
) -> None:
    code = write_function(tmp_path / "fn", "from the bucket")
    digest, size = package_digest(code)
    with served.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(code, name="f", sku="cpu", entrypoint="main:f", max_retries=0)
        assert fp.bytes_uploaded == size
        job = fp.invoke("f", 7)
    assert job["state"] == "SUCCEEDED", job
    assert job["output"] == "from the bucket"
    stored = head(s3_env, f"packages/{digest}.zip")
    assert stored is not None and stored["ContentLength"] == size
    assert served.broker.package_bytes_served == 0
    assert metric(served, "firepool_package_bytes_served_total") == 0
    # A sandboxed local pod has no route to the bucket: its fetch socket relays the bytes.
    relayed = size if sandbox_status()[0] else 0
    assert metric(served, "firepool_package_bytes_relayed_total") == relayed
    with served.client("deployer", Role.DEPLOY) as again:  # a new client, the same caller
        again.deploy(code, name="f", sku="cpu", entrypoint="main:f")
        assert again.bytes_uploaded == 0
    with served.client("someone-else", Role.DEPLOY) as other:  # may not build on its bytes
        other.deploy(code, name="g", sku="cpu", entrypoint="main:f")
        assert other.bytes_uploaded == size


def test_a_requirements_file_travels_the_same_way(served: ThreadedBroker, s3_env: S3Server) -> None:
    text = f"# {os.urandom(8).hex()}\n".encode()
    digest = hashlib.sha256(text).hexdigest()
    with served.client("deployer", Role.DEPLOY) as fp:
        assert fp.upload(text, "text/plain") == digest
        assert fp.bytes_uploaded == len(text)
        fp.upload(text, "text/plain")
        assert fp.bytes_uploaded == len(text)  # the second sent nothing
    assert head(s3_env, f"packages/{digest}.zip") is not None


def test_a_large_package_goes_in_parts_and_is_verified_before_it_counts(
    s3_env: S3Server, tmp_path: Path
) -> None:
    data = os.urandom(11 * 1024 * 1024)  # three parts of 5 MiB at most
    digest = hashlib.sha256(data).hexdigest()
    settings = s3_settings(s3_env, s3_part_bytes=5 * 1024 * 1024)
    with (
        threaded_broker(tmp_path / "home", **settings) as served,
        served.client("deployer", Role.DEPLOY) as fp,
    ):
        token = served.token("deployer", Role.DEPLOY)
        asked = httpx.post(
            f"{served.url}/v1/packages/{digest}/uploads", json={"size": len(data)},
            headers={"Authorization": f"Bearer {token}"},
        ).json()  # fmt: skip
        assert asked["transfer"] == "s3" and len(asked["parts"]) == 3, asked
        assert fp.upload(data, "text/plain") == digest
        assert fp.bytes_uploaded == len(data)
    stored = head(s3_env, f"packages/{digest}.zip")
    assert stored is not None and stored["ContentLength"] == len(data)
    staged: Any = s3_env.client()
    left = staged.list_objects_v2(Bucket=BUCKET, Prefix=f"uploads/{digest}/")
    assert left.get("KeyCount", 0) == 0, left


def test_an_upload_whose_bytes_do_not_match_is_refused_and_nothing_is_recorded(
    served: ThreadedBroker,
) -> None:
    data = b"the real bytes " + os.urandom(8)
    digest = hashlib.sha256(data).hexdigest()
    auth = {"Authorization": f"Bearer {served.token('deployer', Role.DEPLOY)}"}
    asked = httpx.post(
        f"{served.url}/v1/packages/{digest}/uploads", json={"size": len(data)}, headers=auth
    ).json()
    [part] = asked["parts"]
    forged = b"other bytes, same size"[: len(data)].ljust(len(data), b"!")
    put = httpx.put(part["url"], content=forged, headers=part["headers"])
    assert put.status_code == 400, put.text  # the server checks x-amz-checksum-sha256
    done = httpx.post(
        f"{served.url}/v1/packages/{digest}/uploads:complete", json={"ticket": asked["ticket"]},
        headers=auth,
    )  # fmt: skip
    assert done.status_code == 422 and done.json()["error"]["class"] == "PackageRejected"
    bent = httpx.post(
        f"{served.url}/v1/packages/{'0' * 64}/uploads:complete", json={"ticket": asked["ticket"]},
        headers=auth,
    )  # fmt: skip
    assert bent.status_code == 403, bent.text


def _tampered(url: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    sig = query["X-Amz-Signature"]
    query["X-Amz-Signature"] = sig[:-1] + ("0" if sig[-1] != "0" else "1")
    return parts._replace(query=urlencode(query)).geturl()


def test_a_tampered_and_an_expired_url_each_fail_the_attempt_package_fetch_failed(
    served: ThreadedBroker, tmp_path: Path
) -> None:
    executor = served.broker.dispatcher.executor
    presign = executor.package_url
    with served.client("deployer", Role.DEPLOY) as fp:
        for name in ("tampered", "expired"):
            code = write_function(tmp_path / name, name)
            fp.deploy(code, name=name, sku="cpu", entrypoint="main:f", max_retries=0)
        expired_digest, _ = package_digest(tmp_path / "expired")
        client: Any = served.broker.packages.client  # type: ignore[attr-defined]
        stale = client.generate_presigned_url(
            "get_object", ExpiresIn=1,
            Params={"Bucket": BUCKET, "Key": f"packages/{expired_digest}.zip"},
        )  # fmt: skip
        time.sleep(2.1)
        executor.package_url = lambda digest: (
            stale if digest == expired_digest else _tampered(presign(digest))
        )
        tampered = fp.invoke("tampered", 1)
        expired = fp.invoke("expired", 1)
    for job, says in ((tampered, "SignatureDoesNotMatch"), (expired, "expired")):
        assert job["state"] == "FAILED", job
        assert job["error"]["class"] == "PackageFetchFailed", job
        assert "HTTP 403" in job["error"]["message"] and says in job["error"]["message"], job
    assert served.broker.package_bytes_relayed == 0  # the store's refusals are no package bytes


def test_a_finished_jobs_log_is_read_back_from_the_bucket_at_the_same_offsets(
    served: ThreadedBroker, s3_env: S3Server, tmp_path: Path
) -> None:
    code = write_function(tmp_path / "fn", "logged")
    with served.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(code, name="f", sku="cpu", entrypoint="main:f")
        job = fp.invoke("f", 42)
        text = b"".join(fp.iter_logs(job["id"]))
    assert text == b"line one\nline two 42\n", text
    assert head(s3_env, f"logs/{job['id']}.log") is not None
    assert not (served.home / "logs" / f"{job['id']}.log").exists()
    archive = served.broker.logs
    assert archive.read(job["id"], 5) == text[5:]
    assert archive.read(job["id"], 9, 4) == text[9:13]
    assert archive.read(job["id"], len(text)) == b""
    archive.delete(job["id"])  # its result retention passed
    archive.flush()  # type: ignore[attr-defined]
    assert head(s3_env, f"logs/{job['id']}.log") is None
    assert archive.read(job["id"]) == b""


def test_the_storage_sweep_sees_logs_sealed_in_the_bucket(s3_env: S3Server, tmp_path: Path) -> None:
    """The sweep that deletes the logs of jobs past retention or unknown lists them with
    ``job_ids``: sealed logs are in the bucket, not on local disk, and are listed too (one
    page holds 1,000 keys: 1,005 take two)."""
    store = S3PackageStore(s3_env.config())
    archive = ObjectLogArchive(tmp_path / "logs", store)
    client: Any = s3_env.client()
    for n in range(1005):
        client.put_object(Bucket=BUCKET, Key=archive.key(f"job-{n:04d}"), Body=b"x\n")
    client.put_object(Bucket=BUCKET, Key=f"{archive.folder}not-a-log.txt", Body=b"")
    archive.write("sealed", b"sealed\n", 0)
    archive.seal("sealed")
    archive.write("running", b"still here\n", 0)  # an attempt being archived
    assert not (tmp_path / "logs" / "sealed.log").exists()
    listed = archive.job_ids()
    assert listed == sorted([*(f"job-{n:04d}" for n in range(1005)), "sealed", "running"])
    archive.delete("sealed")
    archive.flush()
    assert "sealed" not in archive.job_ids() and head(s3_env, archive.key("sealed")) is None


def test_with_the_object_store_stopped_uploads_are_503_and_fetches_fail_typed(
    s3_env: S3Server, tmp_path: Path
) -> None:
    """A server of its own, stopped mid-run (the shared one serves other tests)."""
    own = start_or_skip()
    try:
        with (
            threaded_broker(tmp_path / "home", **s3_settings(own)) as served,
            served.client("deployer", Role.DEPLOY) as fp,
        ):
            fp.deploy(write_function(tmp_path / "warm", "w"), name="warm", sku="cpu",
                      entrypoint="main:f")  # fmt: skip
            fp.deploy(write_function(tmp_path / "cold", "c"), name="cold", sku="cpu",
                      entrypoint="main:f", max_retries=0)  # fmt: skip
            assert fp.invoke("warm", 1)["state"] == "SUCCEEDED"
            own.stop()
            data = os.urandom(64)
            digest = hashlib.sha256(data).hexdigest()
            auth = {"Authorization": f"Bearer {served.token('deployer', Role.DEPLOY)}"}
            refused = httpx.post(
                f"{served.url}/v1/packages/{digest}/uploads", json={"size": 64}, headers=auth,
                timeout=TIMEOUT_S,
            )  # fmt: skip
            with pytest.raises(ApiError) as sdk_refused:
                fp.upload(data, "text/plain")
            failed = fp.invoke("cold", 1, timeout_s=3)  # the pod's fetch ends by its deadline
    finally:
        own.close()
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["class"] == "StoreUnavailable"
    assert int(refused.headers["retry-after"]) > 0
    assert (sdk_refused.value.status, sdk_refused.value.error_class) == (503, "StoreUnavailable")
    assert failed["state"] == "FAILED", failed
    assert failed["error"]["class"] == "PackageFetchFailed", failed
    assert "deadline" in failed["error"]["message"], failed


def test_a_put_to_a_stopped_object_store_is_store_unavailable(s3_env: S3Server) -> None:
    """The client's own leg: a presigned PUT to a store that does not answer."""
    own = start_or_skip()
    endpoint = own.endpoint
    own.close()
    part = {"number": 1, "url": f"{endpoint}/{BUCKET}/x", "offset": 0, "size": 3, "headers": {}}
    with httpx.Client(timeout=5) as direct, pytest.raises(StoreUnavailable):
        _put_part(direct, io.BytesIO(b"abc"), part)


def test_the_local_store_takes_the_same_client_flow_through_the_broker(tmp_path: Path) -> None:
    code = write_function(tmp_path / "fn", "local")
    _, size = package_digest(code)
    with (
        threaded_broker(tmp_path / "home", backend="fake", package_store="local") as served,
        served.client("deployer", Role.DEPLOY) as fp,
    ):
        fp.deploy(code, name="f", sku="cpu", entrypoint="main:f")
        assert fp.bytes_uploaded == size
        fp.deploy(code, name="f", sku="cpu", entrypoint="main:f")
        assert fp.bytes_uploaded == size  # the second sent nothing
        assert fp.invoke("f", 1)["output"] == "local"


def test_the_broker_counts_the_package_bytes_it_serves_with_its_own_store(tmp_path: Path) -> None:
    """The counter the S3 test reads as 0 counts: with the local store, real pods fetch from
    the broker's /v1/blobs."""
    code = write_function(tmp_path / "fn", "served")
    _, size = package_digest(code)
    with (
        threaded_broker(tmp_path / "home", package_store="local") as served,
        served.client("deployer", Role.DEPLOY) as fp,
    ):
        fp.deploy(code, name="f", sku="cpu", entrypoint="main:f")
        assert fp.invoke("f", 1)["output"] == "served"
        assert served.broker.package_bytes_served == size
        assert metric(served, "firepool_package_bytes_served_total") == size
        relayed = size if sandbox_status()[0] else 0  # /v1/blobs, through the fetch socket
        assert metric(served, "firepool_package_bytes_relayed_total") == relayed


def _cli(served: ThreadedBroker, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FIREPOOL_URL=served.url, FIREPOOL_TOKEN=token)
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], env=env, cwd=REPO, capture_output=True,
        text=True, timeout=60, check=True,
    )  # fmt: skip


def test_firepool_deploy_says_what_it_uploaded_and_firepool_logs_reads_the_bucket(
    served: ThreadedBroker, tmp_path: Path
) -> None:
    code = write_function(tmp_path / "fn", "cli")
    _, size = package_digest(code)
    token = served.token("cli-dev", Role.DEPLOY)
    deploy = ("deploy", str(code), "--name", "f", "--sku", "cpu", "--entrypoint", "main:f")
    assert f"uploaded {size} bytes" in _cli(served, token, *deploy).stderr
    assert "uploaded nothing (0 bytes)" in _cli(served, token, *deploy).stderr
    with served.client("cli-dev", Role.DEPLOY) as fp:
        job = fp.invoke("f", 5)
    assert _cli(served, token, "logs", job["id"]).stdout == "line one\nline two 5\n"
    assert not list((served.home / "logs").iterdir())  # read from the bucket, not the disk


def test_an_upload_past_the_callers_quota_is_refused_before_anything_is_presigned(
    s3_env: S3Server, tmp_path: Path
) -> None:
    settings = s3_settings(s3_env, backend="fake", storage_quotas=(("small", 100),))
    data = os.urandom(101)
    digest = hashlib.sha256(data).hexdigest()
    with threaded_broker(tmp_path / "home", **settings) as served:
        auth = {"Authorization": f"Bearer {served.token('small', Role.DEPLOY)}"}
        refused = httpx.post(
            f"{served.url}/v1/packages/{digest}/uploads", json={"size": 101}, headers=auth
        )
        fits = httpx.post(
            f"{served.url}/v1/packages/{digest}/uploads", json={"size": 100}, headers=auth
        )
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"]["class"] == "QuotaExceeded"
    assert fits.status_code == 200 and fits.json()["transfer"] == "s3", fits.text
