"""What a function is: a name bound to a pool, a content-addressed package and an entrypoint.

A ``FunctionSpec`` is one registered version. Versions are immutable; registering again under
the same name creates version ``n + 1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from functions.errors import InvalidRequest
from functions.resources import Resources

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
MAX_TIMEOUT_S = 86400
"""Longest ``timeout_s`` a function, or one call of it, may ask for (a day)."""


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """One immutable version of a function.

    Exactly one of ``entrypoint`` (``module:callable``, called with the job input) and
    ``command`` (argv run in the package directory) is set. ``sku`` is the pool its jobs
    run on: named by the deployer, or chosen at registration from ``resources``.
    """

    name: str
    sku: str
    package_digest: str
    entrypoint: str | None = None
    command: tuple[str, ...] | None = None
    requirements_digest: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 300.0
    max_retries: int = 2
    pods: int = 1
    single_use: bool = False
    version: int = 0
    created: float = 0.0
    owner: str = ""
    resources: Resources | None = None
    """What the deployer asked for instead of a pool, until registration chose ``sku`` from
    it; not stored (the version records the pool)."""

    def validate(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise InvalidRequest("name must match [a-z0-9][a-z0-9_-]{0,62}", field="name")
        if not DIGEST_RE.fullmatch(self.package_digest):
            raise InvalidRequest("package_digest must be 64 hex digits", field="package_digest")
        if self.requirements_digest is not None and not DIGEST_RE.fullmatch(
            self.requirements_digest
        ):
            raise InvalidRequest(
                "requirements must be the sha256 of an uploaded requirements file",
                field="requirements",
            )
        if (self.entrypoint is None) == (self.command is None):
            raise InvalidRequest("give exactly one of entrypoint and command", field="entrypoint")
        if self.entrypoint is not None and (
            not ENTRYPOINT_RE.fullmatch(self.entrypoint) or len(self.entrypoint) > 255
        ):
            raise InvalidRequest(
                "entrypoint must look like module:callable (at most 255 characters)",
                field="entrypoint",
            )
        # What the pod's agent (pod_runtime.protocol) and execve accept: a NUL in an argument
        # or in the environment, or "=" in a variable's name, cannot reach a process.
        if self.command is not None and (
            not self.command or not all(a and "\0" not in a for a in self.command)
        ):
            raise InvalidRequest(
                "command must be a non-empty list of non-empty strings without NUL",
                field="command",
            )
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise InvalidRequest(f"timeout_s must be in (0, {MAX_TIMEOUT_S}]", field="timeout_s")
        if not 0 <= self.max_retries <= 10:
            raise InvalidRequest("max_retries must be in [0, 10]", field="max_retries")
        if not 1 <= self.pods <= 64:
            raise InvalidRequest("pods must be in [1, 64]", field="pods")
        for key, value in self.env.items():
            if not isinstance(key, str) or not key or "=" in key or "\0" in key:
                raise InvalidRequest(
                    f"env name {key!r} must be a non-empty string without '=' or NUL",
                    field="env",
                )
            if not isinstance(value, str) or "\0" in value:
                raise InvalidRequest(f"env {key} must be a string without NUL", field="env")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "sku": self.sku,
            "package_digest": self.package_digest,
            "entrypoint": self.entrypoint,
            "command": list(self.command) if self.command is not None else None,
            "requirements": self.requirements_digest,
            "env": dict(self.env),
            "timeout_s": self.timeout_s,
            "max_retries": self.max_retries,
            "pods": self.pods,
            "single_use": self.single_use,
            "created": self.created,
            "owner": self.owner,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FunctionSpec:
        command = data.get("command")
        return cls(
            name=data["name"],
            version=int(data.get("version", 0)),
            sku=data["sku"],
            package_digest=data["package_digest"],
            entrypoint=data.get("entrypoint"),
            command=tuple(command) if command is not None else None,
            requirements_digest=data.get("requirements"),
            env=dict(data.get("env") or {}),
            timeout_s=float(data.get("timeout_s", 300.0)),
            max_retries=int(data.get("max_retries", 2)),
            pods=int(data.get("pods", 1)),
            single_use=bool(data.get("single_use", False)),
            created=float(data.get("created", 0.0)),
            owner=str(data.get("owner", "")),
        )
