"""A function name belongs to the deployer who registered it: another deployer gets 403 on
registering a version of it or deleting it, an admin may do both (API over real HTTP)."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.sdk import ApiError
from gateway.auth import Role
from tests.conftest import EXAMPLES
from tests.helpers import ThreadedBroker


def test_only_the_owner_or_an_admin_changes_a_function(fake_pod_broker: ThreadedBroker) -> None:
    with fake_pod_broker.client("owner-alice", Role.DEPLOY) as alice:
        alice.deploy(EXAMPLES / "noop", name="owned", sku="cpu", entrypoint="noop:noop")
    with fake_pod_broker.client("owner-bob", Role.DEPLOY) as bob:
        with pytest.raises(ApiError) as replaced:
            bob.deploy(EXAMPLES / "noop", name="owned", sku="cpu", entrypoint="noop:noop")
        with pytest.raises(ApiError) as deleted:
            bob.delete_function("owned")
        assert bob.describe_function("owned")["owner"] == "owner-alice"
    for refused in (replaced.value, deleted.value):
        assert (refused.status, refused.error_class) == (403, "Forbidden"), refused
        assert "belongs to 'owner-alice'" in refused.message
    with fake_pod_broker.client("owner-ops", Role.ADMIN) as ops:
        assert ops.delete_function("owned") == {"deleted": "owned"}


def test_a_function_s_secrets_and_code_are_its_owner_s(
    fake_pod_broker: ThreadedBroker, tmp_path: Path
) -> None:
    """An invoke-only token reads no caller's function ``env`` (an API token may be in it)
    or package digest; another deployer cannot register a function on a digest he never
    uploaded (his job would print the owner's source); and ``HEAD /v1/packages/{digest}``
    tells a deployer only about packages he uploaded."""
    code = tmp_path / "secret"
    code.mkdir()
    (code / "secret_fn.py").write_text("SOURCE = 'alice-only'\ndef run(x):\n    return x\n")
    with fake_pod_broker.client("pkg-alice", Role.DEPLOY) as alice:
        mine = alice.deploy(code, name="alice-secret", sku="cpu", entrypoint="secret_fn:run",
                            env={"ALICE_API_TOKEN": "s3cret"})  # fmt: skip
        assert alice.describe_function("alice-secret")["env"] == {"ALICE_API_TOKEN": "s3cret"}
    digest = mine["package_digest"]
    with fake_pod_broker.client("pkg-carol") as carol:
        seen = [carol.describe_function("alice-secret")] + [
            f for f in carol.functions() if f["name"] == "alice-secret"
        ]
        assert carol.invoke("alice-secret", 7)["output"] == 7, "anyone may still call it"
    for view in seen:
        assert view["owner"] == "pkg-alice" and view["entrypoint"] == "secret_fn:run"
        assert not {"env", "command", "package_digest", "requirements"} & view.keys(), view
    with fake_pod_broker.client("pkg-bob", Role.DEPLOY) as bob:
        assert bob._http.head(f"/v1/packages/{digest}").status_code == 404
        with pytest.raises(ApiError) as stolen:
            bob._request("POST", "/v1/functions", json={
                "name": "bob-reads", "sku": "cpu", "package_digest": digest,
                "entrypoint": "secret_fn:run",
            })  # fmt: skip
        assert (stolen.value.status, stolen.value.field) == (404, "package_digest")
        # Whoever has the bytes may use them: uploading them makes them Bob's too.
        bob.deploy(code, name="bob-has-it", sku="cpu", entrypoint="secret_fn:run")
        assert bob._http.head(f"/v1/packages/{digest}").status_code == 200
    with fake_pod_broker.client("pkg-ops", Role.ADMIN) as ops:
        assert ops.describe_function("alice-secret")["env"] == {"ALICE_API_TOKEN": "s3cret"}
