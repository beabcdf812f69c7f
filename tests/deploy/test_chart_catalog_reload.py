"""How a catalog change reaches the broker the chart deploys: ``broker.catalogReload``."""

from __future__ import annotations

from typing import Any

from tests.deploy.manifests import render


def _deployment(values: dict[str, Any]) -> dict[str, Any]:
    return next(obj for obj in render(values) if obj["kind"] == "Deployment")


def test_live_reload_changes_only_the_config_map_the_broker_watches() -> None:
    deployment = _deployment({})
    pod = deployment["spec"]["template"]
    assert "checksum/catalog" not in pod["metadata"]["annotations"]  # no restart on a change
    container = pod["spec"]["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "catalog")
    # a subPath mount is never updated by the kubelet: the watch would see no change
    assert "subPath" not in mount
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FIREPOOL_CATALOG"] == mount["mountPath"] + "/catalog.yaml"


def test_restart_mode_restarts_the_broker_on_a_catalog_change() -> None:
    one = _deployment({"broker": {"catalogReload": "restart"}})
    other = _deployment(
        {"broker": {"catalogReload": "restart"}, "catalog": {"budgets": {"cpu": 33}}}
    )
    annotations = [d["spec"]["template"]["metadata"]["annotations"] for d in (one, other)]
    assert annotations[0]["checksum/catalog"] != annotations[1]["checksum/catalog"]
