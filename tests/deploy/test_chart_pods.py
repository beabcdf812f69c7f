"""The pods the broker makes from the chart's catalog are pods the API server takes, and the
chart's NetworkPolicies reach them: for each pool of each documented value set, the
kubernetes backend's pod and Secret manifests (``kubernetes_spec``) validate strictly against
the Kubernetes schemas, carry the label the policies select, and listen on the port the
policies open."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pool_manager.backends.kubernetes_spec import LABEL_POOL, pod_manifest, secret_manifest
from pool_manager.catalog import Catalog
from tests.deploy.manifests import NAMESPACE, by_kind, one, render, validate, values_file

VALUE_SETS = {"default": {}, "gpu": values_file("values-gpu.yaml")}


def chart_catalog(objects: list[dict[str, Any]]) -> Catalog:
    config = one(objects, "ConfigMap")
    return Catalog.from_mapping(yaml.safe_load(config["data"]["catalog.yaml"]))


def agent_port(objects: list[dict[str, Any]], name: str = "FIREPOOL_K8S_AGENT_PORT") -> int:
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {var["name"]: var.get("value") for var in container["env"]}
    return int(env[name])


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_pool_makes_pods_and_secrets_the_schemas_accept(values: str) -> None:
    objects = render(VALUE_SETS[values])
    port = agent_port(objects)
    rendezvous = agent_port(objects, "FIREPOOL_K8S_RENDEZVOUS_PORT")
    catalog = chart_catalog(objects)
    for sku, pool in catalog.pools.items():
        roles = ["active", "standby"] if pool.standbys_per_active else ["active"]
        gpu = "GPU-00000000-0000-0000-0000-000000000000" if pool.is_gpu else None
        for role in roles:
            pod = pod_manifest(f"fp-{sku}-{role}", pool, role, gpu, namespace=NAMESPACE,
                               port=port, created=0.0, rendezvous_port=rendezvous)  # fmt: skip
            validate(pod)
            validate(secret_manifest(f"fp-{sku}-{role}", pool, "s3cret", NAMESPACE))
            assert pod["metadata"]["labels"][LABEL_POOL] == sku


def test_the_network_policies_select_the_pods_and_open_their_agent_port() -> None:
    objects = render(VALUE_SETS["gpu"])
    catalog = chart_catalog(objects)
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(objects, "NetworkPolicy")}
    pods_policy = policies["fp-firepool-pods"]
    assert pods_policy["podSelector"]["matchExpressions"] == [
        {"key": LABEL_POOL, "operator": "Exists"}
    ]
    for sku, pool in catalog.pools.items():
        pod = pod_manifest(f"fp-{sku}", pool, "active", None, namespace=NAMESPACE,
                           port=agent_port(objects), created=0.0)  # fmt: skip
        (container,) = pod["spec"]["containers"]
        assert [p["containerPort"] for p in container["ports"]] == [
            p["port"] for p in pods_policy["ingress"][0]["ports"]
        ]
        peers = policies[f"fp-firepool-peers-{sku}"]["podSelector"]["matchLabels"]
        assert all(pod["metadata"]["labels"].get(k) == v for k, v in peers.items())
