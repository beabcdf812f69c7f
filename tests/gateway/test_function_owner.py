"""A function name belongs to the deployer who registered it: another deployer gets 403 on
registering a version of it or deleting it, an admin may do both (API over real HTTP)."""

from __future__ import annotations

import pytest

from functions.sdk import ApiError
from gateway.auth import Role
from gateway.harness import BrokerServer
from tests.conftest import EXAMPLES


def test_only_the_owner_or_an_admin_changes_a_function(broker_server: BrokerServer) -> None:
    with broker_server.client("owner-alice", Role.DEPLOY) as alice:
        alice.deploy(EXAMPLES / "noop", name="owned", sku="cpu", entrypoint="noop:noop")
    with broker_server.client("owner-bob", Role.DEPLOY) as bob:
        with pytest.raises(ApiError) as replaced:
            bob.deploy(EXAMPLES / "noop", name="owned", sku="cpu", entrypoint="noop:noop")
        with pytest.raises(ApiError) as deleted:
            bob.delete_function("owned")
        assert bob.function("owned")["owner"] == "owner-alice"
    for refused in (replaced.value, deleted.value):
        assert (refused.status, refused.error_class) == (403, "Forbidden"), refused
        assert "belongs to 'owner-alice'" in refused.message
    with broker_server.client("owner-ops", Role.ADMIN) as ops:
        assert ops.delete_function("owned") == {"deleted": "owned"}
