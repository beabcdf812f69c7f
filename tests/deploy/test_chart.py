"""The Helm chart ``helm/firepool``: it renders and lints offline with its default values and
with the GPU + standby values, every object it renders fits the Kubernetes schemas strictly,
a bad value is refused (by values.schema.json, or by the Kubernetes schemas for what only
they know), and what it renders is what the broker reads: a catalog it loads, settings it
knows, secrets only by reference, a Role no wider than pods and Secrets."""

from __future__ import annotations

import copy
import itertools
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from broker.keys import load_key
from broker.settings import Settings, env_name
from pool_manager.catalog import Catalog
from tests.deploy.manifests import CHART, by_kind, notes, one, render, validate, values_file

VALUE_SETS = {"default": {}, "gpu": values_file("values-gpu.yaml")}
"""The two installs the chart documents: defaults (one CPU pool), and a GPU cluster."""
CORE_KINDS = {"ConfigMap", "Deployment", "NetworkPolicy", "Role", "RoleBinding", "Service",
              "ServiceAccount"}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(VALUE_SETS[request.param])


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_the_chart_lints_clean_with_each_value_set(values: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[values], strict=True, kube_version="v1.33.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_every_rendered_object_fits_its_kubernetes_schema_strictly(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, objects = rendered
    kinds = {obj["kind"] for obj in objects}
    assert kinds == (CORE_KINDS | {"ServiceMonitor"} if name == "gpu" else CORE_KINDS)
    for obj in objects:
        validate(obj)
        validate(obj, "1.29.0")  # the chart's kubeVersion floor


def test_a_lint_reports_a_broken_template(tmp_path: Path) -> None:
    broken = tmp_path / "firepool"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "service.yaml").write_text("{{ .Values.service.port | nope }}\n")
    report = helm.lint(broken, strict=True, kube_version="v1.33.0")
    assert any("nope" in error for error in report["errors"])


def test_a_misspelt_field_in_a_template_fails_validation(tmp_path: Path) -> None:
    broken = tmp_path / "firepool"
    shutil.copytree(CHART, broken)
    deployment = broken / "templates" / "deployment.yaml"
    text = deployment.read_text()
    assert text.count("imagePullPolicy:") == 2
    deployment.write_text(text.replace("imagePullPolicy:", "imagePullPolisy:"))
    with pytest.raises(jsonschema.ValidationError, match="imagePullPolisy"):
        validate(one(render({}, broken), "Deployment"))


BAD_FOR_KUBERNETES = {
    "a misspelt field": ({"broker": {"affinity": {"nodeAfinity": {}}}}, "nodeAfinity"),
    "an unknown toleration field": ({"broker": {"tolerations": [{"keyy": "gpu"}]}}, "keyy"),
    "a number where a string goes": ({"broker": {"tolerations": [{"effect": 1}]}}, "effect"),
    "text where a whole number goes": (
        {"broker": {"tolerations": [{"key": "a", "tolerationSeconds": "soon"}]}},
        "soon",
    ),
}
"""Values values.schema.json lets through (it leaves affinity and tolerations to Kubernetes)
that render objects the API server would refuse."""


@pytest.mark.parametrize("case", sorted(BAD_FOR_KUBERNETES))
def test_a_value_that_breaks_the_kubernetes_schema_fails_validation(case: str) -> None:
    values, culprit = BAD_FOR_KUBERNETES[case]
    deployment = one(render(values), "Deployment")
    with pytest.raises(jsonschema.ValidationError) as caught:
        validate(deployment)
    assert culprit in str(caught.value.message) + str(list(caught.value.path))


def test_an_unknown_field_in_a_service_monitor_fails_validation() -> None:
    monitor = one(render(VALUE_SETS["gpu"]), "ServiceMonitor")
    bad = copy.deepcopy(monitor)
    bad["spec"]["endpoints"][0]["pathh"] = "/metrics"
    with pytest.raises(jsonschema.ValidationError, match="pathh"):
        validate(bad)


def test_a_kind_without_a_schema_is_an_error_not_a_pass() -> None:
    with pytest.raises(SchemaNotFoundError):
        validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})


BAD_VALUES = {
    "a port that is text": {"broker": {"port": "eighty"}},
    "an unknown top-level key": {"replicas": 2},
    "a misspelt pool key": {"catalog": {"pools": {"cpu": {"min_cuont": 1}}}},
    "an unknown template key": {"catalog": {"pools": {"cpu": {"template": {"imagee": "x"}}}}},
    "a rate that is text": {"kubernetes": {"createQps": "fast"}},
    "a secret name that is a number": {"store": {"existingSecret": 5}},
    "a literal secret in env": {"broker": {"env": {"AWS_SECRET_ACCESS_KEY": "hunter2"}}},
    "an unknown tag mode": {"catalog": {"pools": {"cpu": {"tag_mode": "sometimes"}}}},
    "an unknown package store": {"packageStore": {"kind": "ftp"}},
    "the s3 store without a bucket": {"packageStore": {"kind": "s3"}},
    "an object store endpoint that is no URL": {"objectStore": {"endpoint": "minio:9000"}},
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_values_schema_refuses_a_bad_value_before_anything_renders(case: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(BAD_VALUES[case])
    with pytest.raises(helm.HelmValuesError):
        render(BAD_VALUES[case])


def test_the_values_schema_forbids_unknown_keys_in_every_section_it_owns() -> None:
    with helm.Chart.load(CHART) as chart:
        schema = chart.schema
    assert schema is not None
    jsonschema.Draft202012Validator.check_schema(schema)
    open_ended = {"global"}  # Helm's own, shared with subcharts
    for section, spec in schema["properties"].items():
        if spec.get("type") == "object" and section not in open_ended:
            assert spec.get("additionalProperties") is False, section


def test_the_broker_is_one_replica_replaced_by_recreate(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    deployment = one(rendered[1], "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_the_role_manages_pods_and_secrets_and_nothing_more(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    role = one(rendered[1], "Role")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods", "secrets"],
            "verbs": ["create", "delete", "get", "list", "watch", "patch"],
        }
    ]
    binding = one(rendered[1], "RoleBinding")
    account = one(rendered[1], "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "firepool"}
    ]
    assert not by_kind(rendered[1], "ClusterRole")


def broker_env(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return {var["name"]: var for var in container["env"]}


def test_every_firepool_variable_the_broker_gets_is_a_setting_it_reads(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    known = {env_name(field) for field in Settings.__dataclass_fields__}
    env = broker_env(rendered[1])
    firepool = {name for name in env if name.startswith("FIREPOOL_")}
    assert firepool - known == set()
    assert env["FIREPOOL_BACKEND"]["value"] == "kubernetes"
    assert "FIREPOOL_K8S_KUBECONFIG" not in env  # in the cluster: the service account's config
    assert env["FIREPOOL_K8S_GPU_RESOURCE"]["value"] == "nvidia.com/gpu"  # HAMi's names
    assert env["FIREPOOL_K8S_GPU_UUID_ANNOTATION"]["value"] == "nvidia.com/use-gpuuuid"


def test_the_broker_parses_the_settings_the_chart_gives_it(
    rendered: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, var in broker_env(rendered[1]).items():
        if "value" in var and name.startswith("FIREPOOL_") and name != "FIREPOOL_CATALOG":
            monkeypatch.setenv(name, var["value"])
    settings = Settings.from_env()
    assert settings.backend == "kubernetes"
    assert settings.k8s_namespace == "firepool"
    assert settings.host == "0.0.0.0"


def test_secrets_come_by_reference_only() -> None:
    objects = render(VALUE_SETS["gpu"])
    assert not by_kind(objects, "Secret")
    env = broker_env(objects)
    for name in ("FIREPOOL_STORE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"]["name"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    key = next(v for v in pod["volumes"] if v["name"] == "signing-key")
    assert key["secret"]["secretName"] == "firepool-signing-key"


def test_the_catalog_config_map_is_a_catalog_the_broker_loads(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, objects = rendered
    config = one(objects, "ConfigMap")
    catalog = Catalog.from_mapping(yaml.safe_load(config["data"]["catalog.yaml"]))
    for pool in catalog.pools.values():
        assert pool.pod_template is not None
        assert pool.pod_template.image.endswith(":0.1.0")
    if name == "gpu":
        h200 = catalog.pool("h200")
        assert h200.standbys_per_active == 3
        assert h200.pod_template is not None
        assert h200.pod_template.resources["limits"]["nvidia.com/gpu"] == 1
        assert h200.pod_template.runtime_class == "nvidia"


def test_pods_reach_the_broker_dns_and_object_store_and_their_pool_peers() -> None:
    objects = render(VALUE_SETS["gpu"])
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(objects, "NetworkPolicy")}
    assert set(policies) == {"fp-firepool-pods", "fp-firepool-peers-cpu",
                             "fp-firepool-peers-h200"}  # fmt: skip
    pods = policies["fp-firepool-pods"]
    assert pods["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = pods["ingress"]
    assert ingress["ports"] == [{"port": 8090, "protocol": "TCP"}]
    assert ingress["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "broker"
    )
    egress_ports = [rule.get("ports") for rule in pods["egress"]]
    assert [{"port": 8080, "protocol": "TCP"}] in egress_ports
    assert [{"port": 9000, "protocol": "TCP"}] in egress_ports
    outside = next(rule["to"][0]["ipBlock"] for rule in pods["egress"] if "ipBlock" in
                   rule["to"][0])  # fmt: skip
    assert "10.0.0.0/8" in outside["except"] and "169.254.0.0/16" in outside["except"]
    h200 = policies["fp-firepool-peers-h200"]
    peer = {"podSelector": {"matchLabels": {"firepool.io/pool": "h200"}}}
    assert h200["podSelector"] == peer["podSelector"]
    assert h200["ingress"] == [{"from": [peer]}] and h200["egress"] == [{"to": [peer]}]


def test_the_notes_say_how_to_reach_the_broker_and_mint_a_token() -> None:
    text = notes()
    assert "port-forward svc/fp-firepool 8080:8080" in text
    assert "exec deploy/fp-firepool -- firepool token" in text
    assert "NOTE: no auth.signingKey.existingSecret" in text
    assert "NOTE" not in notes(VALUE_SETS["gpu"])


def readme_install_values() -> dict[str, Any]:
    """The ``--set`` values of the ``helm install`` in README's "Run on Kubernetes"."""
    readme = (CHART.parents[1] / "README.md").read_text()
    section = readme.split("## Run on Kubernetes", 1)[1].split("\n## ", 1)[0]
    command = section.split("helm install", 1)[1].split("\n\n", 1)[0].split("\nkubectl", 1)[0]
    words = command.replace("\\\n", " ").split()
    values: dict[str, Any] = {}
    for flag, value in itertools.pairwise(words):
        if flag == "--set":
            helm_values = helm.parse_set_string(value.replace("$REG", "registry.example.com/fp"))
            values = merge(values, helm_values)
    return values


def merge(into: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out = dict(into)
    for key, value in new.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merge(out[key], value) if both else value
    return out


def test_the_readme_install_renders_valid_objects_that_use_its_secrets() -> None:
    values = readme_install_values()
    assert values["store"] == {"existingSecret": "firepool-store"}
    objects = render(values)
    for obj in objects:
        validate(obj)
    env = broker_env(objects)
    assert env["FIREPOOL_STORE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "firepool-store"
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/fp/broker:0.1.0"


def test_the_signing_key_init_container_leaves_a_key_only_the_broker_reads(
    tmp_path: Path,
) -> None:
    """Runs the init container's own shell command, with the volumes' mount points moved
    under ``tmp_path``."""
    pod = one(render(VALUE_SETS["gpu"]), "Deployment")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    state, secret = tmp_path / "state", tmp_path / "secret"
    state.mkdir()
    secret.mkdir()
    key = "ab" * 32
    (secret / "signing.key").write_text(key)
    script = init["command"][2]
    script = script.replace(mounts["home"], str(state)).replace(mounts["signing-key"], str(secret))
    subprocess.run([*init["command"][:2], script], check=True, timeout=30)
    container = pod["containers"][0]
    home = {var["name"]: var.get("value") for var in container["env"]}["FIREPOOL_HOME"]
    local_home = state / Path(home).relative_to(mounts["home"])
    assert stat.S_IMODE(local_home.stat().st_mode) == 0o700
    assert stat.S_IMODE((local_home / "signing.key").stat().st_mode) == 0o600
    assert load_key(local_home / "signing.key") == bytes.fromhex(key)


def test_pods_in_another_namespace_get_the_role_and_policies_there() -> None:
    objects = render({"kubernetes": {"podNamespace": "firepool-pods"}})
    for obj in objects:
        validate(obj)
    elsewhere = {"Role", "RoleBinding", "NetworkPolicy"}
    for obj in objects:
        expected = "firepool-pods" if obj["kind"] in elsewhere else None
        assert obj["metadata"].get("namespace") == expected, obj["kind"]
    binding = one(objects, "RoleBinding")
    assert binding["subjects"][0]["namespace"] == "firepool"  # the broker's own
    assert broker_env(objects)["FIREPOOL_K8S_NAMESPACE"]["value"] == "firepool-pods"
    pods = next(p for p in by_kind(objects, "NetworkPolicy") if p["metadata"]["name"].endswith(
        "-pods"))  # fmt: skip
    (source,) = pods["spec"]["ingress"][0]["from"]
    assert source["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name":
                                                          "firepool"}  # fmt: skip
