"""Callers identified by an outside issuer: tokens signed by a key published at a JWKS URL
(RS256/ES256) are accepted beside the broker's own HS256 tokens, with the caller from the
configured claim; every other token is refused 401 with a typed error, and a JWKS that
cannot be fetched refuses the tokens that need it with 503 and ``Retry-After``, fetching it
again at most once per refresh interval.

The JWKS is served by a real HTTP server in a thread of the test process (``JwksServer``),
with keys generated here; the broker is the real one over real HTTP (``threaded_broker`` on
fake pods: no job runs here).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from broker.settings import JWT_ROLES, Settings
from functions.errors import InvalidRequest, Unauthorized, Unavailable
from gateway.auth import Role
from gateway.jwks import JwksPolicy, JwksVerifier
from tests.conftest import deploy_examples
from tests.deploy.manifests import one, render, validate
from tests.helpers import ThreadedBroker, threaded_broker

ISSUER = "https://issuer.example"
AUDIENCE = "firepool-test"
ROLE_CLAIM = "firepool/role"

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
STRANGER = rsa.generate_private_key(public_exponent=65537, key_size=2048)
"""Not in the published set."""


def jwk(private: Any, kid: str) -> dict[str, Any]:
    """The public half of ``private`` as a JWK named ``kid``."""
    public = private.public_key()
    if isinstance(private, rsa.RSAPrivateKey):
        return {**RSAAlgorithm.to_jwk(public, as_dict=True), "kid": kid, "use": "sig"}
    return {**ECAlgorithm.to_jwk(public, as_dict=True), "kid": kid, "use": "sig"}


def published() -> list[dict[str, Any]]:
    return [jwk(RSA_KEY, "rsa-1"), jwk(EC_KEY, "ec-1")]


class JwksServer:
    """A JWKS endpoint on loopback: serves ``keys`` as a JWK set, counts the requests it
    gets, answers 503 while ``down``, holds each answer ``delay_s``, and, when ``held`` is
    set, sets ``arrived`` and holds each answer until ``released`` is set."""

    def __init__(self, keys: list[dict[str, Any]]) -> None:
        self.keys = keys
        self.down = False
        self.delay_s = 0.0
        self.held = False
        self.arrived = threading.Event()
        self.released = threading.Event()
        self.requests = 0
        self.credentials: list[str | None] = []
        """Each request's ``Authorization`` header."""
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with outer._lock:
                    outer.requests += 1
                    outer.credentials.append(self.headers.get("Authorization"))
                time.sleep(outer.delay_s)
                if outer.held:
                    outer.arrived.set()
                    outer.released.wait(timeout=30)
                if outer.down:
                    self.send_error(503)
                    return
                body = json.dumps({"keys": outer.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/openid/v1/jwks"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture(scope="module")
def jwks() -> Iterator[JwksServer]:
    server = JwksServer(published())
    yield server
    server.close()


@pytest.fixture(scope="module")
def broker(jwks: JwksServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedBroker]:
    with threaded_broker(
        tmp_path_factory.mktemp("jwks"),
        backend="fake",
        jwks_url=jwks.url,
        jwt_issuer=ISSUER,
        jwt_audience=AUDIENCE,
        jwt_role_claim=ROLE_CLAIM,
        jwks_refresh_s=3600.0,  # no fetch for an unknown kid during the module's tests
    ) as server:
        yield server


def token(key: Any = RSA_KEY, kid: str | None = "rsa-1", alg: str = "RS256", **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "system:serviceaccount:ml:trainer"}
    body |= {"iat": now, "exp": now + 600} | claims
    body = {name: value for name, value in body.items() if value is not None}  # None: left out
    return jwt.encode(body, key, algorithm=alg, headers=None if kid is None else {"kid": kid})


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forged(header: dict[str, Any], claims: dict[str, Any], secret: bytes | None) -> str:
    """A token made by hand: HMAC-SHA256 with ``secret``, or no signature at all."""
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    if secret is None:
        return signing_input + "."
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(mac)}"


def good_claims() -> dict[str, Any]:
    now = int(time.time())
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "exp": now + 600, "role": "admin"}


def get(broker: ThreadedBroker, path: str, bearer: str) -> httpx.Response:
    return httpx.get(broker.url + path, headers={"Authorization": f"Bearer {bearer}"}, timeout=30)


@pytest.mark.parametrize(
    ("key", "kid", "alg"), [(RSA_KEY, "rsa-1", "RS256"), (EC_KEY, "ec-1", "ES256")]
)
def test_a_token_signed_by_a_published_key_is_accepted_as_its_claimed_caller(
    broker: ThreadedBroker, key: Any, kid: str, alg: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="firepool.access")
    invoker = token(key, kid, alg, sub=f"svc-{alg}")
    assert get(broker, "/v1/jobs", invoker).status_code == 200
    assert [r.caller for r in caplog.records if r.path == "/v1/jobs"] == [f"svc-{alg}"]  # type: ignore[attr-defined]
    refused = get(broker, "/v1/pools", invoker)  # no role claim: the default role, invoke
    assert refused.status_code == 403 and refused.json()["error"]["class"] == "Forbidden"
    admin = token(key, kid, alg, **{ROLE_CLAIM: "admin"})
    assert get(broker, "/v1/pools", admin).status_code == 200


def test_a_list_of_groups_gives_its_highest_role(broker: ThreadedBroker) -> None:
    deployer = token(**{ROLE_CLAIM: ["staff", "deploy", "invoke"]})
    assert get(broker, "/v1/pools", deployer).status_code == 403  # deploy < admin
    assert get(broker, "/v1/pools", token(**{ROLE_CLAIM: ["staff", "admin"]})).status_code == 200
    assert get(broker, "/v1/pools", token(**{ROLE_CLAIM: ["staff"]})).status_code == 403
    unknown = get(broker, "/v1/jobs", token(**{ROLE_CLAIM: "root"}))
    assert (
        unknown.status_code == 401 and "unknown role 'root'" in unknown.json()["error"]["message"]
    )


def test_a_caller_prefix_keeps_outside_subjects_apart_from_minted_callers(
    jwks: JwksServer, tmp_path: Path
) -> None:
    """With ``jwt_caller_prefix``, the provider's ``alice`` is ``oidc:alice``: the jobs of a
    minted ``alice`` are not hers (a job of another caller reads as not found)."""
    with threaded_broker(
        tmp_path, backend="fake", jwks_url=jwks.url, jwt_issuer=ISSUER, jwt_audience=AUDIENCE,
        jwt_caller_prefix="oidc:",
    ) as prefixed:  # fmt: skip
        deploy_examples(prefixed, {"noop": "noop:noop"})
        with prefixed.client("alice") as minted:
            job = minted.invoke("noop", {"n": 1})
        outside = token(sub="alice")
        mine = get(prefixed, "/v1/jobs", outside)
        assert mine.status_code == 200 and mine.json()["jobs"] == []
        assert get(prefixed, f"/v1/jobs/{job['id']}", outside).status_code == 404
        answer = httpx.post(
            f"{prefixed.url}/v1/functions/noop:invoke", json={"input": {"n": 2}},
            headers={"Authorization": f"Bearer {outside}"}, timeout=30,
        )  # fmt: skip
        assert answer.status_code == 200 and answer.json()["caller"] == "oidc:alice"


def test_the_brokers_own_tokens_still_work_beside_the_jwks(broker: ThreadedBroker) -> None:
    assert get(broker, "/v1/pools", broker.token("ops", Role.ADMIN)).status_code == 200
    assert get(broker, "/v1/pools", broker.token("ops", Role.INVOKE)).status_code == 403


REFUSED = {
    "another issuer": (lambda: token(iss="https://elsewhere.example"), "another issuer"),
    "another audience": (lambda: token(aud="someone-else"), "another audience"),
    "expired": (lambda: token(exp=int(time.time()) - 60), "token expired"),
    "no caller claim": (lambda: token(sub=""), "'sub' claim must be a non-empty string"),
    "no issuer": (lambda: token(iss=None), "lacks the 'iss' claim"),
    "unknown kid": (lambda: token(kid="rsa-9"), "unknown key id 'rsa-9'"),
    "no kid": (lambda: token(kid=None), "names no key id"),
    "a key not in the set": (lambda: token(STRANGER), "bad token signature"),
    "an RSA key's kid on an ES256 token": (
        lambda: token(EC_KEY, "rsa-1", "ES256"),
        "does not match its key 'rsa-1'",
    ),
    "alg none": (
        lambda: forged({"alg": "none", "kid": "rsa-1"}, good_claims(), None),
        "algorithm not allowed (allowed: HS256, RS256, ES256)",
    ),
    "HS256 signed with the published public key": (
        lambda: forged(
            {"alg": "HS256", "kid": "rsa-1"},
            good_claims(),
            RSA_KEY.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        ),
        "bad token signature",
    ),
    "malformed": (lambda: "not.a.token", "malformed token"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_token_that_is_not_good_is_refused_401(
    broker: ThreadedBroker, jwks: JwksServer, case: str
) -> None:
    make, says = REFUSED[case]
    answer = get(broker, "/v1/pools", make())
    assert answer.status_code == 401, answer.text
    error = answer.json()["error"]
    assert error["class"] == "Unauthorized" and says in error["message"], error
    assert "retry-after" not in answer.headers


def test_forged_key_ids_make_no_fetch_of_the_jwks(broker: ThreadedBroker, jwks: JwksServer) -> None:
    assert get(broker, "/v1/jobs", token()).status_code == 200  # the set is cached
    before = jwks.requests
    for n in range(20):
        assert get(broker, "/v1/jobs", token(kid=f"forged-{n}")).status_code == 401
    assert jwks.requests == before


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def verifier(url: str, clock: Clock, **policy: Any) -> JwksVerifier:
    policy = {"timeout_s": 2.0, "cache_s": 300.0, "refresh_s": 30.0} | policy
    return JwksVerifier(JwksPolicy(url, ISSUER, AUDIENCE, **policy), clock)


def header(kid: str, alg: str = "RS256") -> dict[str, Any]:
    return {"alg": alg, "kid": kid}


def test_an_unknown_kid_refetches_the_set_at_most_once_per_interval() -> None:
    """A rotated key is found after the interval; forged ids in between fetch nothing."""
    server = JwksServer(published())
    try:
        clock = Clock()
        keys = verifier(server.url, clock)
        assert keys.verify(token(), header("rsa-1"))["sub"] == "system:serviceaccount:ml:trainer"
        assert server.requests == 1
        rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        server.keys = [*published(), jwk(rotated, "rsa-2")]
        for _ in range(50):
            with pytest.raises(Unauthorized, match="unknown key id 'rsa-2'"):
                keys.verify(token(rotated, "rsa-2"), header("rsa-2"))
        assert server.requests == 1
        clock.now += 30.0
        assert keys.verify(token(rotated, "rsa-2"), header("rsa-2"))["iss"] == ISSUER
        for n in range(50):
            with pytest.raises(Unauthorized, match="unknown key id"):
                keys.verify(token(kid=f"forged-{n}"), header(f"forged-{n}"))
        assert server.requests == 2
    finally:
        server.close()


def test_a_jwks_that_is_down_refuses_503_and_is_asked_once_per_interval() -> None:
    server = JwksServer(published())
    server.down = True
    try:
        clock = Clock()
        keys = verifier(server.url, clock, refresh_s=30.0)
        for _ in range(20):
            with pytest.raises(Unavailable) as refused:
                keys.verify(token(), header("rsa-1"))
            assert refused.value.retry_after_s is not None and 0 < refused.value.retry_after_s <= 30
        assert server.requests == 1
        server.down = False
        clock.now += 29.0
        with pytest.raises(Unavailable):
            keys.verify(token(), header("rsa-1"))
        clock.now += 1.0
        assert keys.verify(token(), header("rsa-1"))["aud"] == AUDIENCE
        assert server.requests == 2
    finally:
        server.close()


def test_a_slow_jwks_times_out_into_503() -> None:
    server = JwksServer(published())
    server.delay_s = 2.0
    try:
        keys = verifier(server.url, Clock(), timeout_s=0.2)
        with pytest.raises(Unavailable, match="could not be fetched"):
            keys.verify(token(), header("rsa-1"))
    finally:
        server.delay_s = 0.0
        server.close()


def test_an_answer_that_is_no_key_set_is_503(tmp_path: Path) -> None:
    server = JwksServer([])
    try:
        with pytest.raises(Unavailable, match="could not be fetched"):
            verifier(server.url, Clock()).verify(token(), header("rsa-1"))
    finally:
        server.close()


def test_jwks_down_answers_503_with_retry_after_over_http(tmp_path: Path) -> None:
    """Only the tokens that need the JWKS: the broker's own still work."""
    server = JwksServer(published())
    server.down = True
    try:
        with threaded_broker(
            tmp_path, backend="fake", jwks_url=server.url, jwt_issuer=ISSUER,
            jwt_audience=AUDIENCE, jwks_refresh_s=60.0,
        ) as broker:  # fmt: skip
            for _ in range(5):
                answer = get(broker, "/v1/jobs", token())
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"]["class"] == "Unavailable"
                assert 1 <= int(answer.headers["retry-after"]) <= 60
            assert server.requests == 1
            assert get(broker, "/v1/jobs", broker.token("ops")).status_code == 200
    finally:
        server.close()


def test_the_token_file_is_sent_with_each_fetch_as_it_is_then(tmp_path: Path) -> None:
    """The kubelet rotates a service account's token: each fetch reads the file again."""
    server = JwksServer(published())
    credential = tmp_path / "token"
    credential.write_text("first\n")
    try:
        clock = Clock()
        keys = verifier(server.url, clock, refresh_s=1.0, token_file=credential)
        keys.verify(token(), header("rsa-1"))
        credential.write_text("second")
        clock.now += 1.0
        with pytest.raises(Unauthorized, match="unknown key id"):
            keys.verify(token(kid="rsa-7"), header("rsa-7"))
        assert server.credentials == ["Bearer first", "Bearer second"]
        credential.unlink()
        clock.now += 1.0
        with pytest.raises(Unavailable, match="could not be fetched"):
            keys.verify(token(kid="rsa-8"), header("rsa-8"))
        assert server.requests == 2
    finally:
        server.close()


def test_a_jwks_fetch_does_not_hold_up_the_brokers_other_requests(tmp_path: Path) -> None:
    """The check that fetches runs in a worker thread: while the JWKS holds its answer, the
    event loop answers other requests (if it were blocked, they would wait with it)."""
    server = JwksServer(published())
    server.held = True
    try:
        with threaded_broker(
            tmp_path, backend="fake", jwks_url=server.url, jwt_issuer=ISSUER,
            jwt_audience=AUDIENCE, jwks_timeout_s=60.0,
        ) as broker:  # fmt: skip
            answers: list[int] = []
            waiting = threading.Thread(
                target=lambda: answers.append(get(broker, "/v1/jobs", token()).status_code)
            )
            waiting.start()
            assert server.arrived.wait(timeout=30)
            assert get(broker, "/v1/jobs", broker.token("ops")).status_code == 200
            assert httpx.get(broker.url + "/healthz", timeout=30).status_code == 200
            assert not answers  # the JWKS token's check is still waiting for its keys
            server.released.set()
            waiting.join(timeout=30)
            assert answers == [200]
    finally:
        server.released.set()
        server.close()


def test_a_jwks_url_needs_an_issuer_and_roles_match_the_gateways() -> None:
    with pytest.raises(InvalidRequest) as refused:
        Settings(jwks_url="https://kubernetes.default.svc/openid/v1/jwks")
    assert refused.value.field == "FIREPOOL_JWT_ISSUER"
    assert tuple(Role) == JWT_ROLES


CLUSTER_JWKS = {
    "url": "https://kubernetes.default.svc/openid/v1/jwks",
    "issuer": "https://kubernetes.default.svc.cluster.local",
    "audience": "firepool",
    "callerClaim": "sub",
    "callerPrefix": "k8s:",
    "roleClaim": "firepool/role",
    "defaultRole": "deploy",
    "caFile": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
    "tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
}


def test_the_chart_hands_the_broker_its_jwks_values_as_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = render({"auth": {"jwks": CLUSTER_JWKS}})
    for manifest in objects:
        validate(manifest)
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {var["name"]: var["value"] for var in container["env"] if "value" in var}
    for name, value in env.items():
        if name.startswith(("FIREPOOL_JWKS_", "FIREPOOL_JWT_")):
            monkeypatch.setenv(name, value)
    settings = Settings.from_env()
    assert settings.jwks_url == CLUSTER_JWKS["url"]
    assert settings.jwt_issuer == CLUSTER_JWKS["issuer"]
    assert settings.jwt_audience == "firepool"
    assert (settings.jwt_caller_claim, settings.jwt_caller_prefix) == ("sub", "k8s:")
    assert (settings.jwt_role_claim, settings.jwt_default_role) == ("firepool/role", "deploy")
    assert settings.jwks_token_file == Path(CLUSTER_JWKS["tokenFile"])
    assert settings.jwks_ca_file == Path(CLUSTER_JWKS["caFile"])
    plain = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert not [var for var in plain if var["name"].startswith(("FIREPOOL_JWKS", "FIREPOOL_JWT"))]


@pytest.mark.parametrize(
    "jwks",
    [
        {"url": "https://issuer.example/jwks"},  # no issuer
        {"url": "kubernetes.default.svc/openid/v1/jwks", "issuer": ISSUER},
        {"defaultRole": "root"},
        {"callerClaim": ""},
        {"urll": "https://issuer.example/jwks"},
    ],
)
def test_the_charts_schema_refuses_bad_jwks_values(jwks: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        render({"auth": {"jwks": jwks}})
