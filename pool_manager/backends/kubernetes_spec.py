"""What the kubernetes backend writes to the API server, and how it reads a pod back.

A pod is built from its pool's template (``catalog.PodTemplate``) as plain JSON: one
container ``agent`` running ``python -m pod_runtime.agent`` (or the template's command) with
the agent's options as its arguments, listening on ``tcp:0.0.0.0:<agent port>``, and reading
its secret from the pod's own Secret (``secret_name``) through ``secretKeyRef``.

Everything recovery needs is on the pod itself, so a restarted broker rebuilds its view from
one list call (``backend_pod``):

- labels: ``firepool.io/pool`` (the pool; every pod of the backend has it: the list's
  selector), ``firepool.io/role`` (``active``/``standby``), ``firepool.io/template-hash``;
- the backend's annotations (``firepool.io/...``): the pool's template version, when the
  create was asked, the GPU the pod is pinned to (a standby's from its create, an active's
  once its card is known: the scheduler's annotation, else its agent's report);
- the broker's annotations (owner, tag, queue, hold, retire-after: ``broker.pods``), written
  by ``annotate`` as a merge patch; they are every annotation outside ``firepool.io/``.

GPUs (``gpu_share.GpuShare``): an active GPU pod asks for whole cards and tells its agent to
take the cards NVML shows it (``--gpu-uuid visible``); a standby asks for a fractional share of
its active's card, pinned by UUID with the scheduler's annotation, and its agent is given that
card. A pod's card is read back from ``firepool.io/gpu`` or the scheduler's annotation.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from pod_runtime.agent_auth import SECRET_ENV, tcp_endpoint
from pod_runtime.gpu import VISIBLE
from pool_manager.backends.base import BackendPod
from pool_manager.backends.gpu_share import GpuShare
from pool_manager.backends.local import limit_args
from pool_manager.catalog import PodTemplate, PoolSpec

LABEL_POOL = "firepool.io/pool"
LABEL_ROLE = "firepool.io/role"
LABEL_TEMPLATE = "firepool.io/template-hash"
OWN_PREFIX = "firepool.io/"
"""Annotations of this prefix are the backend's; every other is the broker's."""
ANNOTATION_TEMPLATE = "firepool.io/template"
ANNOTATION_CREATED = "firepool.io/created"
ANNOTATION_GPU = "firepool.io/gpu"
SECRET_KEY = "secret"
"""The key of the agent's secret in the pod's Secret."""
POD_DIR = "/pod"
"""The pod directory inside the container (an emptyDir)."""
AGENT_COMMAND = ("python", "-m", "pod_runtime.agent")
DEFAULT_SHARE = GpuShare()


def secret_name(pod: str) -> str:
    """The Secret holding pod ``pod``'s agent secret."""
    return f"{pod}-agent"


def template_hash(pool: PoolSpec) -> str:
    """A label value naming the pool's pod template and version (16 hex digits)."""
    template = pool.pod_template.digest if pool.pod_template else ""
    return hashlib.sha256(f"{pool.template}|{template}".encode()).hexdigest()[:16]


def agent_args(name: str, pool: PoolSpec, role: str, gpu: str | None, port: int) -> list[str]:
    """The agent's options: the pod's name, directory, where it listens, and the pool's. A
    pod with a card given is pinned to it; an active GPU pod without one takes the cards it
    sees (``VISIBLE``: its scheduler gave it those)."""
    args = ["--pod-name", name, "--pod-dir", POD_DIR, "--listen", f"tcp:0.0.0.0:{port}"]
    args += ["--role", role]
    if pool.preload:
        args += ["--preload", ",".join(pool.preload)]
    if not pool.zygote:
        args.append("--no-zygote")
    if gpu is not None:
        args += ["--gpu-uuid", gpu]
    elif pool.is_gpu:
        args += ["--gpu-uuid", VISIBLE]
    return args + limit_args(pool)


def _resources(template: PodTemplate, pool: PoolSpec, role: str, share: GpuShare) -> dict[str, Any]:
    """The template's resources; an active GPU pod that names no GPU limit asks for its
    ``units_per_pod`` cards; a standby asks for a fractional share of one (``share``), in
    place of any GPU limits its template names (those are the active's)."""
    resources = {k: dict(v) for k, v in template.resources.items()}
    if pool.is_gpu and role == "active":
        limits = resources.setdefault("limits", {})
        limits.setdefault(share.resource, pool.units_per_pod)
    elif pool.is_gpu:
        gpu_names = {share.resource, share.memory_resource, share.cores_resource}
        for kind in ("requests", "limits"):
            for key in gpu_names & set(resources.get(kind, {})):
                del resources[kind][key]
        resources.setdefault("limits", {}).update(share.standby_limits())
    return resources


def pod_manifest(
    name: str,
    pool: PoolSpec,
    role: str,
    gpu: str | None,
    *,
    namespace: str,
    port: int,
    created: float,
    rendezvous_port: int | None = None,
    share: GpuShare = DEFAULT_SHARE,
) -> dict[str, Any]:
    """The pod ``name`` of ``pool``, its agent on ``port`` and, when given, the gang
    rendezvous port its job listens on as a gang's rank 0 (``MASTER_PORT``) declared beside
    it. A pod given a card ``gpu`` (a standby) is pinned to it by the scheduler's UUID
    annotation (``share``). Raises ``ValueError`` for a pool without a template."""
    template = pool.pod_template
    if template is None:
        raise ValueError(f"pool {pool.sku} has no pod template (its catalog entry's template:)")
    annotations = {ANNOTATION_TEMPLATE: pool.template, ANNOTATION_CREATED: repr(created)}
    if gpu is not None:
        annotations[ANNOTATION_GPU] = gpu
        if share.uuid_annotation:
            annotations[share.uuid_annotation] = gpu
    ports = [{"name": "agent", "containerPort": port, "protocol": "TCP"}]
    if rendezvous_port is not None:
        ports.append({"name": "rendezvous", "containerPort": rendezvous_port, "protocol": "TCP"})
    container: dict[str, Any] = {
        "name": "agent",
        "image": template.image,
        "command": list(template.command or AGENT_COMMAND),
        "args": agent_args(name, pool, role, gpu, port),
        "ports": ports,
        "env": [
            {
                "name": SECRET_ENV,
                "valueFrom": {"secretKeyRef": {"name": secret_name(name), "key": SECRET_KEY}},
            }
        ],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 2},
        "volumeMounts": [{"name": "pod", "mountPath": POD_DIR}],
    }
    resources = _resources(template, pool, role, share)
    if resources:
        container["resources"] = resources
    if template.security_context:
        container["securityContext"] = dict(template.security_context)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # jobs get no API credentials
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": [{"name": "pod", "emptyDir": {}}],
    }
    if template.node_selector:
        spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        spec["tolerations"] = [dict(t) for t in template.tolerations]
    if template.runtime_class:
        spec["runtimeClassName"] = template.runtime_class
    if template.service_account:
        spec["serviceAccountName"] = template.service_account
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_POOL: pool.sku, LABEL_ROLE: role, LABEL_TEMPLATE: template_hash(pool)},
            "annotations": annotations,
        },
        "spec": spec,
    }


def secret_manifest(pod: str, pool: PoolSpec, secret: str, namespace: str) -> dict[str, Any]:
    """The Secret holding pod ``pod``'s agent secret (owned by the pod once it exists:
    ``owner_patch``)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name(pod),
            "namespace": namespace,
            "labels": {LABEL_POOL: pool.sku},
        },
        "data": {SECRET_KEY: base64.b64encode(secret.encode()).decode()},
    }


def owner_patch(pod: dict[str, Any]) -> dict[str, Any]:
    """Makes a Secret the pod's: the cluster deletes it with the pod."""
    meta = pod["metadata"]
    owner = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta.get("uid", "")}
    return {"metadata": {"ownerReferences": [owner]}}


def pod_ip(pod: dict[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("podIP") or None


def pod_dead(pod: dict[str, Any]) -> bool:
    """The pod has stopped or is stopping: its phase is final, its agent container
    terminated, or it is being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return True
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    return any(
        "terminated" in (c.get("state") or {}) for c in status.get("containerStatuses") or ()
    )


def is_ours(pod: dict[str, Any]) -> bool:
    return LABEL_POOL in ((pod.get("metadata") or {}).get("labels") or {})


def pod_card(pod: dict[str, Any], share: GpuShare = DEFAULT_SHARE) -> str | None:
    """The card the pod is pinned to: ``firepool.io/gpu`` (written by the backend), else the
    first the scheduler's annotation names; None when neither says."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    gpu = annotations.get(ANNOTATION_GPU)
    if isinstance(gpu, str) and gpu:
        return gpu
    cards = share.scheduled_cards(annotations)
    return cards[0] if cards else None


def backend_pod(pod: dict[str, Any], port: int, share: GpuShare = DEFAULT_SHARE) -> BackendPod:
    """What the backend reports of a pod object from the API server. Before the pod has an
    IP its endpoint has no host (a call to it fails at once)."""
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    try:
        created = float(annotations.get(ANNOTATION_CREATED, "0"))
    except ValueError:
        created = 0.0
    return BackendPod(
        name=meta["name"],
        sku=labels.get(LABEL_POOL, ""),
        role=labels.get(LABEL_ROLE, "active"),
        created=created,
        endpoint=tcp_endpoint(pod_ip(pod) or "", port, meta["name"]),
        alive=not pod_dead(pod),
        gpu=pod_card(pod, share),
        template=annotations.get(ANNOTATION_TEMPLATE, "v1"),
        annotations={k: v for k, v in annotations.items() if _brokers(k, share)},
    )


def _brokers(key: str, share: GpuShare) -> bool:
    """Whether a pod annotation is the broker's: not the backend's own, not the scheduler's
    GPU annotations (the pin this backend wrote, the cards the scheduler wrote)."""
    return (
        not key.startswith(OWN_PREFIX)
        and key != share.uuid_annotation
        and (key not in share.card_annotations)
    )
