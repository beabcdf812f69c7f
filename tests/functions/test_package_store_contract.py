"""The ``PackageStore`` contract (``functions/stores/base.py``), run over every store.

``store`` is each store as ``open_package_store`` builds it; ``served`` is each store as the
broker builds it from ``Settings.package_store``, with a client that fetches its URLs where
pods would: the broker's ``/v1/blobs`` route, in process, for the local and memory stores;
the object store itself (a real SeaweedFS, ``tests/functions/s3_server.py``) for ``s3``,
whose URL tests are its own (S3 answers refusals in its XML, not the API's JSON). A store
added to ``PACKAGE_STORES`` runs here too.
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
import zipfile
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import pytest

from broker.service import Broker
from broker.settings import Settings
from functions.errors import Forbidden, InvalidRequest, NotFound, PackageRejected
from functions.stores import (
    PACKAGE_STORES,
    LocalPackageStore,
    MemoryPackageStore,
    PackageStore,
    S3PackageStore,
    UrlSigner,
    open_package_store,
)
from functions.stores.base import Check
from gateway.app import create_app
from gateway.auth import Authenticator, Role
from tests.functions.s3_server import S3Server

BASE = "http://broker.test"
TTL_S = 60
DATA = b"the bytes of a package"
DIGEST = hashlib.sha256(DATA).hexdigest()


def put(
    store: PackageStore, data: bytes, digest: str | None = None, check: Check | None = None
) -> bool:
    """Store ``data`` under ``digest`` (default: its own) in two chunks, as the upload route
    does; whether this call stored it."""
    with store.upload(digest or hashlib.sha256(data).hexdigest()) as upload:
        half = len(data) // 2
        upload.write(data[:half])
        upload.write(data[half:])
        return upload.commit(check)


def read(store: PackageStore, digest: str) -> bytes:
    with store.open(digest) as blob:
        return blob.read()


@pytest.fixture(params=PACKAGE_STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> PackageStore:
    s3 = None
    if request.param == "s3":
        server: S3Server = request.getfixturevalue("s3_env")
        s3 = server.config(url_ttl_s=TTL_S)
    return open_package_store(
        request.param, root=tmp_path / "packages", signer=UrlSigner(b"k" * 32), base_url=BASE,
        ttl_s=TTL_S, s3=s3,
    )  # fmt: skip


def test_a_stored_package_exists_and_reads_back_whole(store: PackageStore) -> None:
    assert not store.exists(DIGEST)
    assert put(store, DATA) is True
    assert store.exists(DIGEST)
    with store.open(DIGEST) as blob:
        assert blob.read() == DATA
        blob.seek(0)
        assert blob.read(4) == DATA[:4]
    path = store.local_path(DIGEST)
    assert path is None or path.read_bytes() == DATA


def test_bytes_that_hash_to_another_digest_are_refused_and_nothing_is_stored(
    store: PackageStore,
) -> None:
    with pytest.raises(PackageRejected, match="sha256"):
        put(store, DATA, digest=hashlib.sha256(b"other").hexdigest())
    assert not store.exists(hashlib.sha256(b"other").hexdigest())
    assert not store.exists(DIGEST)
    assert list(store.list()) == []


def test_a_check_sees_exactly_the_bytes_and_its_refusal_stores_nothing(
    store: PackageStore,
) -> None:
    seen: list[bytes] = []

    def refuse(path: Path) -> None:
        seen.append(path.read_bytes())
        raise PackageRejected("not a zip")

    with pytest.raises(PackageRejected, match="not a zip"):
        put(store, DATA, check=refuse)
    assert seen == [DATA]
    assert not store.exists(DIGEST)
    assert list(store.list()) == []


def test_an_upload_left_without_a_commit_stores_nothing(store: PackageStore) -> None:
    with store.upload(DIGEST) as upload:
        upload.write(DATA)
        assert upload.size == len(DATA)
    assert not store.exists(DIGEST)
    assert list(store.list()) == []


def test_a_package_over_the_cap_is_refused_while_it_is_written(
    store: PackageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("functions.stores.base.MAX_PACKAGE_BYTES", len(DATA) - 1)
    with store.upload(DIGEST) as upload, pytest.raises(PackageRejected, match="the cap"):
        upload.write(DATA)
    assert not store.exists(DIGEST)


def test_storing_the_same_bytes_again_changes_nothing(store: PackageStore) -> None:
    assert put(store, DATA) is True
    [first] = store.list()
    assert put(store, DATA) is False
    assert list(store.list()) == [first]
    assert read(store, DIGEST) == DATA


def test_of_concurrent_puts_of_one_digest_exactly_one_stored_it_and_one_copy_is_left(
    store: PackageStore,
) -> None:
    """Both writers pass the existence check before either publishes (the barrier in the
    check holds them there); only one may be told it stored the package."""
    both_written = threading.Barrier(2, timeout=10)

    def wait_for_the_other(_: Path) -> None:
        both_written.wait()

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: put(store, DATA, check=wait_for_the_other), range(2)))
    assert sorted(results) == [False, True]
    assert read(store, DIGEST) == DATA
    assert [(p.digest, p.size) for p in store.list()] == [(DIGEST, len(DATA))]


def test_a_deleted_package_is_gone(store: PackageStore) -> None:
    put(store, DATA)
    assert store.delete(DIGEST) is True
    assert not store.exists(DIGEST)
    assert store.local_path(DIGEST) is None
    assert list(store.list()) == []
    with pytest.raises(NotFound):
        store.open(DIGEST)
    assert store.delete(DIGEST) is False


def test_list_shows_each_stored_package_with_its_size_and_when_it_was_stored(
    store: PackageStore,
) -> None:
    other = b"another package, longer than the first"
    before = time.time()
    put(store, DATA)
    put(store, other)
    after = time.time()
    listed = {p.digest: p for p in store.list()}
    assert {d: p.size for d, p in listed.items()} == {
        DIGEST: len(DATA), hashlib.sha256(other).hexdigest(): len(other)
    }  # fmt: skip
    # A file's mtime comes from a coarser clock than time.time(): allow a second either side.
    assert all(before - 1 <= p.stored_at <= after + 1 for p in listed.values()), listed


def test_opening_a_package_not_stored_is_not_found(store: PackageStore) -> None:
    with pytest.raises(NotFound):
        store.open(DIGEST)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.upload("ABC"),
        lambda s: s.exists("ABC"),
        lambda s: s.open("../" + "a" * 61),
        lambda s: s.local_path("A" * 64),
        lambda s: s.url("a" * 63),
        lambda s: s.delete("a" * 65),
    ],
    ids=["upload", "exists", "open", "local_path", "url", "delete"],
)
def test_a_malformed_digest_is_refused_naming_the_field(
    store: PackageStore, call: Callable[[PackageStore], object]
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        call(store)
    assert refused.value.field == "sha256"


def test_an_unknown_store_is_refused_naming_the_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidRequest, match="local, memory") as refused:
        open_package_store(
            "s4", root=tmp_path, signer=UrlSigner(b"k" * 32), base_url=BASE, ttl_s=TTL_S
        )
    assert refused.value.field == "package_store"
    monkeypatch.setenv("FIREPOOL_PACKAGE_STORE", "s4")
    with pytest.raises(InvalidRequest, match="FIREPOOL_PACKAGE_STORE must be one of local, memory"):
        Settings.from_env()


def test_the_local_store_leaves_no_staging_file_behind(tmp_path: Path) -> None:
    store = LocalPackageStore(tmp_path / "s", UrlSigner(b"k" * 32), BASE)
    put(store, DATA)
    with pytest.raises(PackageRejected):
        put(store, DATA, digest=hashlib.sha256(b"other").hexdigest())
    with store.upload(DIGEST) as upload:
        upload.write(DATA)
    assert list(store.staging.iterdir()) == []


# -- URLs, fetched where a pod fetches them ----------------------------------------------------
@dataclass
class Served:
    """A store as the broker builds it, and a client that fetches its URLs."""

    broker: Broker
    client: httpx.AsyncClient
    """The broker's API, in process."""
    fetcher: httpx.AsyncClient
    """What a pod fetches its URLs with: the API's client, or a real one for S3's."""

    @property
    def store(self) -> PackageStore:
        return self.broker.packages


def served_settings(tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> Settings:
    catalog = tmp_path / "catalog.yaml"  # no pod kept warm: none is started
    catalog.write_text("pools:\n  cpu: {min_count: 0, max_count: 1}\n")
    s3: dict[str, object] = {}
    if kind == "s3":
        config = request.getfixturevalue("s3_env").config()
        s3 = {"s3_bucket": config.bucket, "s3_endpoint_url": config.endpoint_url,
              "s3_path_style": True, "s3_url_ttl_s": TTL_S}  # fmt: skip
    return Settings(
        home=tmp_path / "home", public_url=BASE, package_store=kind,
        package_url_ttl_s=TTL_S, catalog_path=catalog, **s3,  # type: ignore[arg-type]
    )  # fmt: skip


async def _served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Served]:
    broker = Broker(served_settings(tmp_path, request.param, request))
    transport = httpx.ASGITransport(app=create_app(broker))
    async with (
        httpx.AsyncClient(transport=transport, base_url=BASE) as client,
        httpx.AsyncClient() as direct,
    ):
        yield Served(broker, client, direct if request.param == "s3" else client)


served = pytest.fixture(params=PACKAGE_STORES)(_served)
broker_served = pytest.fixture(params=[k for k in PACKAGE_STORES if k != "s3"])(_served)


def _with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query)) | changes
    return parts._replace(query=urlencode(query)).geturl()


def test_the_broker_builds_the_store_its_settings_name(tmp_path: Path) -> None:
    kinds = {"local": LocalPackageStore, "memory": MemoryPackageStore, "s3": S3PackageStore}
    assert set(kinds) == set(PACKAGE_STORES)
    for name, kind in kinds.items():
        bucket = "b" if name == "s3" else None
        broker = Broker(Settings(home=tmp_path / name, package_store=name, s3_bucket=bucket))
        assert isinstance(broker.packages, kind)
    assert Settings().package_store == "local"


def test_the_s3_store_without_a_bucket_is_refused_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="FIREPOOL_S3_BUCKET") as refused:
        Broker(Settings(home=tmp_path, package_store="s3"))
    assert refused.value.field == "FIREPOOL_S3_BUCKET"


async def test_a_url_serves_the_package_until_it_expires(broker_served: Served) -> None:
    served = broker_served
    put(served.store, DATA)
    fresh = await served.client.get(served.store.url(DIGEST))
    assert fresh.status_code == 200, fresh.text
    assert fresh.content == DATA
    assert fresh.headers["content-length"] == str(len(DATA))
    stale = await served.client.get(served.store.url(DIGEST, now=time.time() - TTL_S - 5))
    assert stale.json()["error"]["class"] == "Expired", stale.text


async def test_a_tampered_url_is_refused(broker_served: Served) -> None:
    served = broker_served
    put(served.store, DATA)
    other = hashlib.sha256(b"other").hexdigest()
    put(served.store, b"other")
    url = served.store.url(DIGEST)
    sig = dict(parse_qsl(urlsplit(url).query))["sig"]
    tampered = [
        _with_query(url, sig=sig[:-1] + ("0" if sig[-1] != "0" else "1")),
        _with_query(url, exp=str(int(time.time()) + 10 * TTL_S)),
        url.replace(DIGEST, other),
    ]
    for bad in tampered:
        refused = await served.client.get(bad)
        assert refused.status_code == 403, (bad, refused.text)
        assert refused.json()["error"]["class"] == "Forbidden"


async def test_a_url_of_a_package_not_stored_is_not_found(served: Served) -> None:
    url = served.store.url(DIGEST)
    assert (await served.fetcher.get(url)).status_code == 404
    put(served.store, DATA)
    served.store.delete(DIGEST)
    assert (await served.fetcher.get(url)).status_code == 404


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("main.py", "def f(x):\n    return x\n")
    return buffer.getvalue()


async def test_a_package_uploaded_over_http_registers_and_is_served(served: Served) -> None:
    """The upload route streams into the store, registering checks the stored zip, and the
    URL a pod gets serves it: the same through every store."""
    broker = served.broker
    token = Authenticator(broker.signing_key).mint("dev", Role.DEPLOY, 3600)
    auth = {"Authorization": f"Bearer {token}"}
    data = _zip()
    digest = hashlib.sha256(data).hexdigest()
    await broker.start()
    try:
        uploaded = await served.client.put(
            f"/v1/packages/{digest}", content=data,
            headers=auth | {"Content-Type": "application/zip"},
        )  # fmt: skip
        again = await served.client.put(
            f"/v1/packages/{digest}", content=data,
            headers=auth | {"Content-Type": "application/zip"},
        )  # fmt: skip
        head = await served.client.head(f"/v1/packages/{digest}", headers=auth)
        registered = await served.client.post(
            "/v1/functions", headers=auth,
            json={"name": "f", "sku": "cpu", "package_digest": digest, "entrypoint": "main:f"},
        )  # fmt: skip
        fetched = await served.fetcher.get(broker.packages.url(digest))
    finally:
        await broker.stop()
    assert (uploaded.status_code, uploaded.json()["created"]) == (201, True), uploaded.text
    assert (again.status_code, again.json()["created"]) == (200, False), again.text
    assert head.status_code == 200
    assert registered.status_code == 201, registered.text
    assert fetched.content == data


# -- S3's presigned URLs, fetched from the object store ----------------------------------------
@pytest.fixture
def s3_store(s3_env: S3Server) -> S3PackageStore:
    return S3PackageStore(s3_env.config(url_ttl_s=2))


async def test_a_presigned_url_serves_the_package_until_it_expires(
    s3_store: S3PackageStore,
) -> None:
    put(s3_store, DATA)
    url = s3_store.url(DIGEST)
    async with httpx.AsyncClient() as client:
        fresh = await client.get(url)
        assert (fresh.status_code, fresh.content) == (200, DATA)
        time.sleep(3.1)  # past the 2 s the URL was signed for (S3 counts whole seconds)
        stale = await client.get(url)
    assert stale.status_code == 403 and b"expired" in stale.content.lower(), stale.text


async def test_a_tampered_presigned_url_is_refused_by_the_object_store(
    s3_store: S3PackageStore,
) -> None:
    put(s3_store, DATA)
    other = hashlib.sha256(b"other").hexdigest()
    put(s3_store, b"other")
    url = s3_store.url(DIGEST)
    sig = dict(parse_qsl(urlsplit(url).query))["X-Amz-Signature"]
    tampered = [
        _with_query(url, **{"X-Amz-Signature": sig[:-1] + ("0" if sig[-1] != "0" else "1")}),
        _with_query(url, **{"X-Amz-Expires": "604800"}),
        url.replace(DIGEST, other),
    ]
    async with httpx.AsyncClient() as client:
        for bad in tampered:
            refused = await client.get(bad)
            assert refused.status_code == 403, (bad, refused.text)


def test_the_broker_serves_no_url_of_the_s3_store(s3_store: S3PackageStore) -> None:
    put(s3_store, DATA)
    with pytest.raises(Forbidden):
        s3_store.check_url(DIGEST, int(time.time()) + 60, "0" * 64, time.time())
