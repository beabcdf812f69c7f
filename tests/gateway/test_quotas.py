"""Storage quotas at the HTTP edge: an upload that would take a caller past its quota is
refused 413 ``QuotaExceeded`` and stores nothing; a package counts in full against each
caller who uploaded it; sending bytes one already uploaded adds nothing; deleting a function
frees its package's bytes once it is collected.

The refusals run over real HTTP against a broker served by uvicorn (fake pods, the local
package store); the freeing runs the broker's collection directly, at a time past the
grace period, on an in-process broker."""

from __future__ import annotations

import hashlib
import io
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.auth import Role
from tests.helpers import ThreadedBroker, threaded_broker
from tests.inprocess import inprocess_broker

QUOTA = 3000
"""Bytes each caller may store (``FIREPOOL_STORAGE_QUOTA_BYTES``) here."""


def zipped(size: int, seed: str) -> tuple[str, bytes]:
    """A package zip of about ``size`` bytes (stored, not compressed) and its digest."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        body = (seed * size)[: max(0, size - 200)]
        archive.writestr("main.py", f"# {body}\ndef handler(x):\n    return x\n")
    data = buffer.getvalue()
    return hashlib.sha256(data).hexdigest(), data


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedBroker]:
    home = tmp_path_factory.mktemp("quotas") / "firepool"
    with threaded_broker(
        home,
        backend="fake",
        storage_quota_bytes=QUOTA,
        storage_quotas=(("roomy", 10 * QUOTA), ("none", 0)),
        package_grace_s=float("inf"),
    ) as broker:
        yield broker


def put(served: ThreadedBroker, caller: str, digest: str, data: bytes) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {served.token(caller, Role.DEPLOY)}",
        "Content-Type": "application/zip",
    }
    return httpx.put(f"{served.url}/v1/packages/{digest}", content=data, headers=headers)


def refused(answer: httpx.Response) -> bool:
    return answer.status_code == 413 and answer.json()["error"]["class"] == "QuotaExceeded"


def test_an_upload_past_the_quota_is_refused_413_and_stores_nothing(
    served: ThreadedBroker,
) -> None:
    first, first_data = zipped(2000, "a")
    second, second_data = zipped(2000, "b")
    assert put(served, "alice", first, first_data).status_code == 201
    answer = put(served, "alice", second, second_data)
    assert refused(answer), answer.text
    assert "3000" in answer.json()["error"]["message"]
    assert not served.broker.packages.exists(second)
    assert put(served, "alice", first, first_data).status_code == 200  # adds nothing
    assert put(served, "bob", second, second_data).status_code == 201  # bob's own quota


def test_a_shared_package_counts_against_each_uploader(served: ThreadedBroker) -> None:
    shared, shared_data = zipped(2000, "s")
    other, other_data = zipped(1500, "o")
    assert put(served, "carol", shared, shared_data).status_code == 201
    assert put(served, "dave", shared, shared_data).status_code == 200  # stored already
    assert refused(put(served, "dave", other, other_data))
    assert refused(put(served, "carol", other, other_data))


def test_a_per_caller_quota_replaces_the_default(served: ThreadedBroker) -> None:
    big, big_data = zipped(2 * QUOTA, "r")
    assert put(served, "roomy", big, big_data).status_code == 201
    tiny, tiny_data = zipped(10, "t")
    assert refused(put(served, "none", tiny, tiny_data))


def test_a_chunked_upload_without_a_length_is_checked_on_its_size(
    served: ThreadedBroker,
) -> None:
    big, big_data = zipped(QUOTA + 100, "c")

    def body() -> Iterator[bytes]:
        yield big_data[:1000]
        yield big_data[1000:]

    headers = {"Authorization": f"Bearer {served.token('erin', Role.DEPLOY)}"}
    answer = httpx.put(f"{served.url}/v1/packages/{big}", content=body(), headers=headers)
    assert refused(answer), answer.text
    assert not served.broker.packages.exists(big)


async def test_a_deleted_function_s_package_stops_counting_once_collected(
    tmp_path: Path,
) -> None:
    grace = 3600.0
    async with inprocess_broker(tmp_path, storage_quota_bytes=QUOTA, package_grace_s=grace) as fp:
        headers = fp.headers("frank", Role.DEPLOY)
        first, first_data = zipped(2000, "f")
        second, second_data = zipped(2000, "g")
        assert (
            await fp.client.put(f"/v1/packages/{first}", content=first_data, headers=headers)
        ).status_code == 201
        body = {"name": "fn", "sku": "cpu", "package_digest": first, "entrypoint": "main:handler"}
        assert (
            await fp.client.post("/v1/functions", json=body, headers=headers)
        ).status_code == 201
        answer = await fp.client.put(f"/v1/packages/{second}", content=second_data, headers=headers)
        assert answer.status_code == 413
        collected = await fp.broker.collect_storage(time.time() + 2 * grace)
        assert collected.packages == 0  # referenced: kept, and still counted
        assert (await fp.client.delete("/v1/functions/fn", headers=headers)).status_code == 200
        assert (await fp.broker.collect_storage(time.time() + grace / 2)).packages == 0
        collected = await fp.broker.collect_storage(time.time() + 2 * grace)
        assert (collected.packages, collected.bytes) == (1, len(first_data))
        answer = await fp.client.put(f"/v1/packages/{second}", content=second_data, headers=headers)
        assert answer.status_code == 201
