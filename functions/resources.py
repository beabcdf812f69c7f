"""What a function asks for instead of naming a pool (paper §4, SKU round-up): CPU cores,
memory, GPUs and their model. Registration picks the smallest catalog pool that fits
(``pool_manager.catalog.Catalog.smallest_fit``) and records that pool in the version."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from functions.errors import InvalidRequest, UnknownField

FIELDS = ("cpu", "memory", "gpus", "accelerator")


@dataclass(frozen=True, slots=True)
class Resources:
    """One call's needs. Invariants (``from_json`` holds them): ``cpu`` > 0, ``memory_mb``
    None or >= 1, ``gpus`` >= 0, ``accelerator`` None or a name (``cpu`` only with no GPUs)."""

    cpu: float = 1.0
    """Cores (fractions round up to a whole core): a CPU pool's ``units_per_pod``."""
    memory_mb: int | None = None
    """MiB one job may use: a pool's ``memory_limit_mb`` (a pool without one has no cap)."""
    gpus: int = 0
    """GPUs per pod: a GPU pool's ``units_per_pod``."""
    accelerator: str | None = None
    """The GPU model (the catalog's accelerator name, e.g. ``h200``); None: any."""

    @property
    def wants_gpu(self) -> bool:
        return self.gpus > 0 or self.accelerator not in (None, "cpu")

    def describe(self) -> str:
        """The request as a caller wrote it, for messages: ``cpu=3, memory=2048``."""
        parts = [f"gpus={self.gpus}" if self.wants_gpu else f"cpu={self.cpu:g}"]
        if self.accelerator is not None:
            parts.append(f"accelerator={self.accelerator}")
        if self.memory_mb is not None:
            parts.append(f"memory={self.memory_mb}")
        return ", ".join(parts)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Resources:
        """The request in a JSON object of ``FIELDS``; ``UnknownField`` for another key and
        ``InvalidRequest`` for a value out of range, each naming ``resources.<key>``."""
        for key in data:
            if key not in FIELDS:
                raise UnknownField(
                    f"unknown resource {key!r} (resources take: {', '.join(FIELDS)})",
                    field=f"resources.{key}",
                )
        if not data:
            raise InvalidRequest(
                f"resources needs at least one of {', '.join(FIELDS)}", field="resources"
            )
        cpu = data.get("cpu", 1.0)
        if not _number(cpu) or not 0 < cpu < math.inf:
            raise InvalidRequest("resources.cpu must be a number of cores above 0",
                                 field="resources.cpu")  # fmt: skip
        memory = data.get("memory")
        if memory is not None and (not _whole(memory) or memory < 1):
            raise InvalidRequest("resources.memory must be a whole number of MiB >= 1",
                                 field="resources.memory")  # fmt: skip
        gpus = data.get("gpus", 0)
        if not _whole(gpus) or gpus < 0:
            raise InvalidRequest("resources.gpus must be a whole number >= 0",
                                 field="resources.gpus")  # fmt: skip
        accelerator = data.get("accelerator")
        if accelerator is not None and (not isinstance(accelerator, str) or not accelerator):
            raise InvalidRequest("resources.accelerator must be a pool accelerator's name",
                                 field="resources.accelerator")  # fmt: skip
        if accelerator == "cpu" and gpus:
            raise InvalidRequest("resources: gpus on the cpu accelerator",
                                 field="resources.accelerator")  # fmt: skip
        memory_mb = int(memory) if memory is not None else None
        return cls(cpu=float(cpu), memory_mb=memory_mb, gpus=int(gpus), accelerator=accelerator)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"cpu": self.cpu, "gpus": self.gpus}
        if self.memory_mb is not None:
            body["memory"] = self.memory_mb
        if self.accelerator is not None:
            body["accelerator"] = self.accelerator
        return body


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: object) -> bool:
    """A whole number as JSON has it: ``2`` or ``2.0`` (JSON has one number type, and JSON
    Schema's ``integer`` takes both), not ``true``."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)
