"""Rendering the Helm chart offline and checking its manifests, for the chart tests.

``helm_python`` (helm-python-sdk) binds Helm's own Go SDK through the ``libhelm_c`` library
its wheel ships, so rendering and linting here are Helm's, with no helm binary and no
cluster (``lookup`` finds nothing). Core kinds are checked by ``kubernetes_validate``
against the Kubernetes OpenAPI schemas in strict mode (an unknown field is an error). The
one custom kind, the Prometheus Operator's ServiceMonitor, has no schema in any package
reachable here that installs cleanly beside the suite, so ``servicemonitor.schema.json``
beside this file stands in: the CRD's types, enums and duration pattern for the fields the
chart renders, and every other field refused (stricter than the CRD, never looser on what
it lists; a field the chart starts rendering must be added there first).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "firepool"
KUBE_VERSION = "1.33.0"
"""The Kubernetes release the manifests are checked against (the chart's kubeVersion floor,
1.29, is checked too)."""
RELEASE = "fp"
NAMESPACE = "firepool"


def values_file(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / name).read_text()) or {}
    return loaded


def render(values: dict[str, Any] | None = None, chart_dir: Path = CHART) -> list[dict[str, Any]]:
    """Every object the chart in ``chart_dir`` renders with ``values`` over its defaults;
    ``HelmValuesError`` when they break values.schema.json, ``HelmRenderError`` when a
    template fails."""
    with helm.Chart.load(chart_dir) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def notes(values: dict[str, Any] | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


@cache
def _service_monitor_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((Path(__file__).parent / "servicemonitor.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate(obj: dict[str, Any], version: str = KUBE_VERSION) -> None:
    """Raise (``jsonschema.ValidationError`` or its ``kubernetes_validate`` subclass) unless
    ``obj`` fits its kind's schema strictly; a kind with no schema raises too
    (``SchemaNotFoundError``), so nothing passes unchecked."""
    if obj.get("apiVersion") == "monitoring.coreos.com/v1" and obj.get("kind") == "ServiceMonitor":
        _service_monitor_validator().validate(obj)
        return
    kubernetes_validate.validate(obj, version, strict=True)


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = by_kind(objects, kind)
    return found
