"""The agent's wire types: ``AttemptSpec`` in, ``AttemptResult`` out (docs/architecture.md §1).

Decoding is strict: an unknown field is an ``UnknownField`` naming it, a wrongly typed one an
``InvalidRequest`` naming it. These are plain values; they carry no I/O and no locks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from functions.errors import ErrorClass, InvalidRequest, UnknownField

ATTEMPT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")
DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

SPEC_FIELDS = frozenset(
    {
        "attempt_id",
        "package",
        "entrypoint",
        "command",
        "input",
        "env",
        "system_env",
        "requirements",
        "timeout_s",
        "wait",
    }
)
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A content-addressed file the agent fetches: a (signed) URL and its sha256."""

    url: str
    digest: str


@dataclass(frozen=True, slots=True)
class AttemptSpec:
    """One attempt as the broker asks for it. Exactly one of entrypoint and command is set."""

    attempt_id: str
    package: BlobRef | None
    entrypoint: str | None
    command: tuple[str, ...] | None
    input: Any
    env: dict[str, str] = field(default_factory=dict)
    system_env: dict[str, str] = field(default_factory=dict)
    requirements: BlobRef | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    wait: bool = False


def encode_spec(spec: AttemptSpec) -> dict[str, Any]:
    """The POST /attempts body for ``spec``: ``decode_spec`` of it gives ``spec`` back."""

    def blob(ref: BlobRef | None) -> dict[str, str] | None:
        return None if ref is None else {"url": ref.url, "digest": ref.digest}

    return {
        "attempt_id": spec.attempt_id,
        "package": blob(spec.package),
        "entrypoint": spec.entrypoint,
        "command": list(spec.command) if spec.command is not None else None,
        "input": spec.input,
        "env": spec.env,
        "system_env": spec.system_env,
        "requirements": blob(spec.requirements),
        "timeout_s": spec.timeout_s,
        "wait": spec.wait,
    }


def _blob(data: Any, name: str) -> BlobRef | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise InvalidRequest(f"{name} must be an object {{url, digest}} or null", field=name)
    for key in data:
        if key not in ("url", "digest"):
            raise UnknownField(f"unknown field {name}.{key}", field=f"{name}.{key}")
    url, digest = data.get("url"), data.get("digest")
    if not isinstance(url, str) or not url:
        raise InvalidRequest(f"{name}.url must be a non-empty string", field=f"{name}.url")
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise InvalidRequest(f"{name}.digest must be 64 lowercase hex", field=f"{name}.digest")
    return BlobRef(url=url, digest=digest)


def _str_map(data: Any, name: str) -> dict[str, str]:
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise InvalidRequest(f"{name} must map strings to strings", field=name)
    return dict(data)


def decode_spec(data: Any) -> AttemptSpec:
    """Decode a POST /attempts body; raises ``UnknownField`` / ``InvalidRequest``."""
    if not isinstance(data, dict):
        raise InvalidRequest("body must be a JSON object")
    for key in data:
        if key not in SPEC_FIELDS:
            raise UnknownField(f"unknown field {key}", field=str(key))
    attempt_id = data.get("attempt_id")
    if not isinstance(attempt_id, str) or not ATTEMPT_ID_RE.fullmatch(attempt_id):
        raise InvalidRequest("attempt_id must look like <job-id>:<n>", field="attempt_id")
    entrypoint, command = data.get("entrypoint"), data.get("command")
    if (entrypoint is None) == (command is None):
        raise InvalidRequest("give exactly one of entrypoint and command", field="entrypoint")
    if entrypoint is not None and (
        not isinstance(entrypoint, str) or not ENTRYPOINT_RE.fullmatch(entrypoint)
    ):
        raise InvalidRequest("entrypoint must look like module:callable", field="entrypoint")
    if command is not None and (
        not isinstance(command, list)
        or not command
        or not all(isinstance(a, str) and a and "\0" not in a for a in command)
    ):
        raise InvalidRequest("command must be a non-empty list of strings", field="command")
    timeout_s = data.get("timeout_s", DEFAULT_TIMEOUT_S)
    if timeout_s is None:
        timeout_s = DEFAULT_TIMEOUT_S
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise InvalidRequest("timeout_s must be a positive number", field="timeout_s")
    wait = data.get("wait", False)
    if not isinstance(wait, bool):
        raise InvalidRequest("wait must be a boolean", field="wait")
    return AttemptSpec(
        attempt_id=attempt_id,
        package=_blob(data.get("package"), "package"),
        entrypoint=entrypoint,
        command=tuple(command) if command is not None else None,
        input=data.get("input"),
        env=_str_map(data.get("env"), "env"),
        system_env=_str_map(data.get("system_env"), "system_env"),
        requirements=_blob(data.get("requirements"), "requirements"),
        timeout_s=float(timeout_s),
        wait=wait,
    )


def safe_text(text: str) -> str:
    """``text`` as valid UTF-8. A file name that is not (``os.fsdecode`` keeps its bytes as
    lone surrogates, which JSON cannot carry) shows each undecodable byte as ``\\xNN``, the
    way ``repr`` of bytes does; any other lone surrogate as ``\\uDCNN``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_safe(value: Any) -> Any:
    """``value`` with every string (keys included) made ``safe_text``: what the agent sends
    when ``orjson`` refuses a body, so every answer is JSON the broker can read."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


class AttemptState(StrEnum):
    """An attempt's state as the agent reports it (the JSON carries the value)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(slots=True)
class AttemptResult:
    """What the agent reports about one attempt; mutated only by the attempt's own task."""

    attempt_id: str
    state: AttemptState = AttemptState.RUNNING
    output: Any = None
    error: dict[str, str] | None = None
    exit_code: int | None = None
    started: float = 0.0
    first_instruction: float | None = None
    finished: float | None = None

    def fail(self, error_class: ErrorClass, message: str, **extra: str) -> None:
        """Record a failure (the state is set by the caller: failed or cancelled)."""
        self.error = {"class": str(error_class), "message": message, **extra}

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt_id": self.attempt_id,
            "state": self.state,
            "output": self.output,
            "error": self.error,
            "exit_code": self.exit_code,
            "started": self.started,
            "first_instruction": self.first_instruction,
            "finished": self.finished,
        }
