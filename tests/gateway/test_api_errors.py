"""Bad input gets a 4xx with a typed error, and nothing half-written (issue 2, paper A.6)."""

from __future__ import annotations

import hashlib
import io
import stat
import zipfile

import httpx
import jwt
import pytest

from functions.errors import InvalidRequest
from functions.sdk import ApiError, Client
from gateway.auth import Role
from tests.conftest import EXAMPLES
from tests.helpers import ThreadedBroker


def _zip(entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for info, data in entries:
            zf.writestr(info, data)
    return buf.getvalue()


def _symlink_zip() -> bytes:
    link = zipfile.ZipInfo("evil")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    return _zip([("ok.py", b"x = 1\n"), (link, b"/etc/passwd")])


def _non_utf8_name_zip(code: bytes = b"x = 1\n") -> bytes:
    """An entry flagged as UTF-8 whose name is not (zipfile raises UnicodeDecodeError)."""
    raw = _zip([(zipfile.ZipInfo("\u00e9\u00e9.py"), code)])  # non-ASCII: flagged
    return raw.replace("\u00e9\u00e9".encode(), b"\xff\xfe\xff\xfe")  # same length


def _http(
    server: ThreadedBroker, caller: str = "err-user", role: Role = Role.INVOKE
) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {server.token(caller, role)}"}
    )


def test_an_unknown_field_is_rejected_with_its_name(fake_pod_broker: ThreadedBroker) -> None:
    with _http(fake_pod_broker) as http:
        resp = http.post("/v1/functions/noop:invoke", json={"input": 1, "lease_tga": "x"})
    assert resp.status_code == 400
    assert resp.json()["error"] == {
        "class": "UnknownField",
        "message": "unknown field 'lease_tga'",
        "field": "lease_tga",
    }


def test_a_wrongly_typed_field_is_rejected_with_its_name(fake_pod_broker: ThreadedBroker) -> None:
    with _http(fake_pod_broker) as http:
        resp = http.post("/v1/functions/noop:invoke", json={"input": 1, "priority": "high"})
    assert resp.status_code == 400
    assert resp.json()["error"]["field"] == "priority"


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer not-a-jwt", "Basic abc"])
def test_a_missing_or_malformed_token_is_Unauthorized(
    fake_pod_broker: ThreadedBroker, header: str | None
) -> None:
    headers = {"Authorization": header} if header else {}
    resp = httpx.post(
        f"{fake_pod_broker.url}/v1/functions/noop:invoke", json={"input": 1}, headers=headers
    )
    assert resp.status_code == 401
    assert resp.json()["error"]["class"] == "Unauthorized"


def test_an_expired_token_is_Unauthorized(fake_pod_broker: ThreadedBroker) -> None:
    token = fake_pod_broker.auth.mint("late", Role.INVOKE, ttl_s=-10)
    resp = httpx.get(f"{fake_pod_broker.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 401
    assert "expired" in resp.json()["error"]["message"]


def test_a_forged_token_is_Unauthorized(fake_pod_broker: ThreadedBroker) -> None:
    forged = jwt.encode(
        {"sub": "mallory", "aud": "firepool", "exp": 2**31, "role": "admin"},
        b"0" * 32,
        algorithm="HS256",
    )
    none_alg = jwt.encode(
        {"sub": "mallory", "aud": "firepool", "exp": 2**31}, None, algorithm="none"
    )
    for token in (forged, none_alg):
        resp = httpx.get(
            f"{fake_pod_broker.url}/v1/pools", headers={"Authorization": f"Bearer {token}"}
        )
        assert resp.status_code == 401, token


def test_an_invoke_token_cannot_deploy_or_read_pools(fake_pod_broker: ThreadedBroker) -> None:
    with _http(fake_pod_broker) as http:
        assert http.get("/v1/pools").status_code == 403
        resp = http.post(
            "/v1/functions", json={"name": "x", "sku": "cpu", "package_digest": "0" * 64}
        )
    assert resp.status_code == 403
    assert resp.json()["error"]["class"] == "Forbidden"


def test_an_unknown_function_is_NotFound(fake_pod_broker: ThreadedBroker) -> None:
    with _http(fake_pod_broker) as http:
        resp = http.post("/v1/functions/no-such-fn:invoke", json={"input": 1})
    assert resp.status_code == 404
    assert resp.json()["error"]["class"] == "NotFound"


def test_another_callers_job_is_invisible(fake_pod_broker: ThreadedBroker) -> None:
    with fake_pod_broker.client("owner-1") as fp:
        job = fp.invoke("noop", 1)
    with _http(fake_pod_broker, "snooper") as http:
        resp = http.get(f"/v1/jobs/{job['id']}")
    assert resp.status_code == 404


def test_a_package_whose_bytes_do_not_match_the_digest_is_rejected_and_not_stored(
    fake_pod_broker: ThreadedBroker,
) -> None:
    data = _zip([("a.py", b"x = 1\n")])
    wrong = hashlib.sha256(b"something else").hexdigest()
    with _http(fake_pod_broker, role=Role.DEPLOY) as http:
        resp = http.put(
            f"/v1/packages/{wrong}", content=data, headers={"Content-Type": "application/zip"}
        )
        assert resp.status_code == 422
        assert resp.json()["error"]["class"] == "PackageRejected"
        assert http.head(f"/v1/packages/{wrong}").status_code == 404


@pytest.mark.parametrize(
    "archive",
    [
        _zip([("../escape.py", b"x")]),
        _zip([("/abs.py", b"x")]),
        _zip([("a\\..\\b.py", b"x")]),
        _symlink_zip(),
        _non_utf8_name_zip(),
        b"this is not a zip",
    ],
    ids=["dotdot", "absolute", "backslash", "symlink", "non-utf8-name", "not-a-zip"],
)
def test_an_unsafe_zip_is_rejected_at_upload_and_not_stored(
    fake_pod_broker: ThreadedBroker, archive: bytes
) -> None:
    digest = hashlib.sha256(archive).hexdigest()
    with _http(fake_pod_broker, role=Role.DEPLOY) as http:
        resp = http.put(
            f"/v1/packages/{digest}", content=archive, headers={"Content-Type": "application/zip"}
        )
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"]["class"] == "PackageRejected"
        assert http.head(f"/v1/packages/{digest}").status_code == 404
        reg = http.post(
            "/v1/functions",
            json={"name": "evil", "sku": "cpu", "package_digest": digest, "entrypoint": "a:b"},
        )
        assert reg.status_code == 404  # not stored: as if never uploaded
        assert reg.json()["error"]["field"] == "package_digest"


def test_a_bad_zip_uploaded_as_plain_bytes_is_refused_when_registered(
    fake_pod_broker: ThreadedBroker,
) -> None:
    """Bytes uploaded without ``application/zip`` are stored unchecked (a requirements file);
    naming them as a function's package checks them then."""
    # Bytes of its own: an upload of a digest already stored is answered 200, unchecked.
    archive = _non_utf8_name_zip(b"x = 2\n")
    digest = hashlib.sha256(archive).hexdigest()
    with _http(fake_pod_broker, role=Role.DEPLOY) as http:
        put = http.put(f"/v1/packages/{digest}", content=archive)
        assert put.status_code == 201, put.text
        reg = http.post(
            "/v1/functions",
            json={"name": "badname", "sku": "cpu", "package_digest": digest, "entrypoint": "a:b"},
        )
    assert reg.status_code == 422 and reg.json()["error"]["class"] == "PackageRejected", reg.text


@pytest.mark.parametrize("field", ["name", "entrypoint", "package_digest"])
def test_a_trailing_newline_does_not_pass_a_pattern(
    fake_pod_broker: ThreadedBroker, field: str
) -> None:
    body = {"name": "nl", "sku": "cpu", "package_digest": "0" * 64, "entrypoint": "noop:noop"}
    body[field] += "\n"
    with _http(fake_pod_broker, role=Role.DEPLOY) as http:
        reg = http.post("/v1/functions", json=body)
    assert reg.status_code == 400 and reg.json()["error"]["field"] == field, reg.text


def test_idempotency_key_same_body_same_job_other_body_422(fake_pod_broker: ThreadedBroker) -> None:
    with _http(fake_pod_broker, "idem-caller") as http:
        headers = {"Idempotency-Key": "k-1"}
        a = http.post("/v1/functions/noop/jobs", json={"input": 1}, headers=headers)
        b = http.post("/v1/functions/noop/jobs", json={"input": 1}, headers=headers)
        c = http.post("/v1/functions/noop/jobs", json={"input": 2}, headers=headers)
    assert a.status_code == b.status_code == 202
    assert a.json()["job_id"] == b.json()["job_id"]
    assert c.status_code == 422
    assert c.json()["error"]["class"] == "IdempotencyMismatch"


def test_an_oversized_body_is_refused_with_TooLarge(fake_pod_broker: ThreadedBroker) -> None:
    with _http(fake_pod_broker, "big") as http:
        resp = http.post(
            "/v1/functions/noop:invoke", content=b'{"input": "' + b"x" * (17 * 1024 * 1024) + b'"}'
        )
    assert resp.status_code == 413
    assert resp.json()["error"]["class"] == "TooLarge"


def test_an_id_or_name_cannot_walk_the_sdk_to_another_route(
    fake_pod_broker: ThreadedBroker,
) -> None:
    """An id or a name with a ``/`` or dots is refused before any request: else
    ``Client.cancel("../functions/NAME")`` would be ``DELETE /v1/functions/NAME`` once httpx
    collapsed the dots, and ``firepool cancel`` would delete a function."""
    with fake_pod_broker.client("walker", Role.DEPLOY) as fp:
        fp.deploy(EXAMPLES / "noop", name="walked", sku="cpu", entrypoint="noop:noop")
        with pytest.raises(InvalidRequest):  # a "/" is in no id or name
            fp.cancel("../functions/walked")
        with pytest.raises(ApiError) as queried:
            fp.job("x?limit=1")
        with pytest.raises(InvalidRequest):
            fp.job("..")
        with pytest.raises(InvalidRequest):  # the server decodes %2F before it routes
            fp.job("some-id/logs")
        assert fp.describe_function("walked")["name"] == "walked", "still there"
    assert queried.value.status == 404


@pytest.mark.parametrize("value", [float("nan"), [1.0, {"x": float("inf")}], 2**70])
def test_the_sdk_refuses_what_json_cannot_carry_instead_of_changing_it(value: object) -> None:
    """orjson wrote NaN and Infinity as null (the function got ``{'x': None}``); the gateway
    refuses both, and integers past 64 bits, over HTTP. Refused before any request."""
    with Client("http://127.0.0.1:9", "t") as fp, pytest.raises(InvalidRequest):
        fp.submit("anything", {"v": value, "fine": None})
