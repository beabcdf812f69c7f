"""Prometheus text exposition of the broker's counters and pool gauges."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.service import Broker


def _line(name: str, value: float, labels: dict[str, str] | None = None) -> str:
    if labels:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}} {value}"
    return f"{name} {value}"


def render_metrics(broker: Broker) -> str:
    lines = [
        "# HELP firepool_jobs_total Jobs by event (submitted, or finished by state).",
        "# TYPE firepool_jobs_total counter",
    ]
    for key, value in sorted(broker.counters.items()):
        if key.startswith("jobs_"):
            lines.append(_line("firepool_jobs_total", value, {"event": key[5:]}))
    lines += [
        "# HELP firepool_acquisitions_total Claims by acquisition path.",
        "# TYPE firepool_acquisitions_total counter",
    ]
    for key, value in sorted(broker.counters.items()):
        if key.startswith("path_"):
            lines.append(_line("firepool_acquisitions_total", value, {"path": key[5:]}))
    lines += ["# HELP firepool_pods Pods by pool, state and role.", "# TYPE firepool_pods gauge"]
    counts: dict[tuple[str, str, str], int] = {}
    for pod in broker.pod_infos():
        labels = (pod.sku, str(pod.state), pod.role)
        counts[labels] = counts.get(labels, 0) + 1
    for (sku, state, role), n in sorted(counts.items()):
        lines.append(_line("firepool_pods", n, {"pool": sku, "state": state, "role": role}))
    lines += [
        "# HELP firepool_package_bytes_served_total Package bytes the broker served to pods "
        "(/v1/blobs); 0 with the s3 store, whose pods fetch from the bucket.",
        "# TYPE firepool_package_bytes_served_total counter",
        _line("firepool_package_bytes_served_total", broker.package_bytes_served),
    ]
    lines += [
        "# HELP firepool_queued_jobs Jobs waiting for pods.",
        "# TYPE firepool_queued_jobs gauge",
    ]
    lines.append(_line("firepool_queued_jobs", broker.queue_depth()))
    lines += [
        "# HELP firepool_held_unit_seconds_total GPU- or core-seconds the pools of each "
        "accelerator held: reserved at create until deleted (busy, idle, owner-held, starting, "
        "terminating); rate() of it is the capacity held.",
        "# TYPE firepool_held_unit_seconds_total counter",
    ]
    for acc, held in sorted(broker.held_unit_seconds().items()):
        lines.append(
            _line("firepool_held_unit_seconds_total", round(held, 3), {"accelerator": acc})
        )
    return "\n".join(lines) + "\n"
