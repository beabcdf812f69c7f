"""Function versions and packages."""

from __future__ import annotations

import pytest

from broker.store import JobStore
from functions.errors import Forbidden
from tests.store.builders import make_spec


async def test_each_registration_is_the_next_version(store: JobStore) -> None:
    v1 = await store.put_function(make_spec(timeout_s=10.0))
    v2 = await store.put_function(make_spec(timeout_s=20.0, command=None))
    assert (v1.version, v2.version) == (1, 2)
    assert v1.created > 0
    assert await store.get_function("echo") == v2
    assert await store.get_function("echo", 1) == v1
    assert await store.get_function("echo", 3) is None


async def test_every_spec_field_round_trips(store: JobStore) -> None:
    spec = make_spec(
        name="train",
        entrypoint=None,
        command=("torchrun", "--nproc", "2", "train.py"),
        requirements_digest="b" * 64,
        env={"A": "1", "UNICODE": "✓"},
        timeout_s=3600.0,
        max_retries=4,
        pods=2,
        single_use=True,
        owner="bob",
    )
    stored = await store.put_function(spec)
    assert await store.get_function("train") == stored
    assert stored.command == spec.command and stored.env == spec.env


async def test_list_functions_gives_the_latest_live_version_of_each(store: JobStore) -> None:
    await store.put_function(make_spec(name="a"))
    a2 = await store.put_function(make_spec(name="a"))
    b1 = await store.put_function(make_spec(name="b"))
    await store.put_function(make_spec(name="c"))
    assert await store.delete_function("c")
    assert await store.list_functions() == [a2, b1]


async def test_a_deleted_function_is_gone_and_its_versions_are_never_reused(
    store: JobStore,
) -> None:
    await store.put_function(make_spec())
    assert await store.delete_function("echo")
    assert not await store.delete_function("echo")
    assert await store.get_function("echo") is None
    assert await store.get_function("echo", 1) is None
    again = await store.put_function(make_spec())
    assert again.version == 2
    assert await store.get_function("echo") == again


async def test_a_name_belongs_to_its_owner_until_it_is_deleted(store: JobStore) -> None:
    """Another deployer could replace anyone's function with their own code (the callers of
    the name then ran it with their inputs), or delete it."""
    a1 = await store.put_function(make_spec(owner="alice"))
    with pytest.raises(Forbidden, match="belongs to 'alice'"):
        await store.put_function(make_spec(owner="bob"))
    with pytest.raises(Forbidden):
        await store.delete_function("echo", "bob")
    assert await store.get_function("echo") == a1  # nothing written, no version taken
    assert (await store.put_function(make_spec(owner="alice"))).version == 2
    admin = await store.put_function(make_spec(owner="ops"), as_admin=True)
    assert admin.version == 3  # an admin may, and owns the name now
    with pytest.raises(Forbidden):
        await store.delete_function("echo", "alice")
    assert await store.delete_function("echo", "ops")
    bob = await store.put_function(make_spec(owner="bob"))  # a deleted name is free
    assert (bob.version, bob.owner) == (4, "bob")


async def test_deleting_an_unknown_function_returns_false(store: JobStore) -> None:
    assert not await store.delete_function("nope")


async def test_packages_are_recorded_once(store: JobStore) -> None:
    digest = "c" * 64
    assert not await store.has_package(digest)
    await store.put_package(digest, 3 * 2**30, "alice")
    await store.put_package(digest, 3 * 2**30, "alice")
    assert await store.has_package(digest)


async def test_registration_times_come_from_the_injected_clock(store_url: str) -> None:
    from broker.store import open_store

    store = await open_store(store_url, clock=lambda: 1234.5)
    try:
        assert (await store.put_function(make_spec())).created == 1234.5
    finally:
        await store.close()
