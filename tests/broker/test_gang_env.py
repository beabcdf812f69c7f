"""A gang's rendezvous: ``MASTER_ADDR`` is rank 0's pod address, read from its agent endpoint,
and ``MASTER_PORT`` the backend's declared port or a port free at that address."""

from __future__ import annotations

import socket

from hypothesis import given
from hypothesis import strategies as st

from broker.executor import Executor, Rendezvous, rank_env
from pod_runtime.agent_auth import tcp_endpoint
from pool_manager.backends.base import BackendPod, endpoint_host

POD_NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,40}", fullmatch=True)


@given(st.ip_addresses(), st.integers(1, 65535), POD_NAMES)
def test_a_tcp_endpoints_host_is_the_address_it_was_made_with(
    address: object, port: int, name: str
) -> None:
    assert endpoint_host(tcp_endpoint(str(address), port, name)) == str(address)


def test_a_unix_endpoint_is_a_local_pod_on_the_brokers_host() -> None:
    assert endpoint_host("unix:/srv/pods/p1/agent.sock") == "127.0.0.1"
    pod = BackendPod("p", "cpu", "active", 0.0, tcp_endpoint("10.4.0.7", 8090, "p"))
    assert pod.host == "10.4.0.7"


def _executor(endpoints: dict[str, str], port: int | None) -> Executor:
    return Executor(None, endpoints, lambda digest: digest, rendezvous_port=port)  # type: ignore[arg-type]


def test_a_cluster_gang_meets_at_rank_zeros_pod_ip_on_the_declared_port() -> None:
    endpoints = {"r0": tcp_endpoint("10.4.0.7", 8090, "r0"), "r1": "tcp:10.9.0.2:8090#r1"}
    assert _executor(endpoints, 29500).rendezvous("r0") == Rendezvous("10.4.0.7", 29500)


def test_a_local_gang_gets_a_port_free_on_the_brokers_host() -> None:
    meet = _executor({"r0": "unix:/srv/pods/r0/agent.sock"}, None).rendezvous("r0")
    assert meet.host == "127.0.0.1"
    with socket.socket() as s:
        s.bind((meet.host, meet.port))  # free: rank 0's job can listen there


@given(st.integers(2, 64).flatmap(lambda w: st.tuples(st.integers(0, w - 1), st.just(w))))
def test_every_rank_gets_one_rank_per_pod_and_the_same_rendezvous(
    rank_world: tuple[int, int],
) -> None:
    rank, world = rank_world
    env = rank_env(rank, world, Rendezvous("10.4.0.7", 29500))
    assert env == {
        "MASTER_ADDR": "10.4.0.7",
        "MASTER_PORT": "29500",
        "RANK": str(rank),
        "NODE_RANK": str(rank),
        "GROUP_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }
