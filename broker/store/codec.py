"""Conversions between the domain objects (``Job``, ``FunctionSpec``) and row values.

Pure functions, no I/O. ``job_row`` runs on the event loop when a write is enqueued, so the
writer thread never touches a live ``Job`` (its owner task may mutate it meanwhile); the
``*_from_row`` functions build fresh objects and may run on any thread.

JSON-valued fields are stored as orjson text. ``None`` is stored as SQL NULL for every optional
JSON field; ``input`` is always present (``"null"`` for a JSON null input).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from broker.jobs import Attempt, Job, JsonText
from functions.spec import FunctionSpec
from pool_manager.states import JobState

#: Columns an ``update`` may change; every other job column is fixed at submit.
MUTABLE_JOB_COLUMNS: tuple[str, ...] = (
    "state",
    "output",
    "error",
    "exit_code",
    "retries",
    "attempts",
    "acquisition",
    "started",
    "first_instruction",
    "finished",
)


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _dumps_opt(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _loads_opt(text: str | bytes | None) -> Any:
    return None if text is None else orjson.loads(text)


def _output_text(output: Any) -> str | None:
    """The output column: an output kept as JSON text is stored as it is."""
    if output is None:
        return None
    if isinstance(output, JsonText):
        return output.text
    return orjson.dumps(output).decode()


def _output_json(text: str | bytes | None) -> JsonText | None:
    """A stored output as its JSON text, never parsed here."""
    if text is None:
        return None
    return JsonText(text if isinstance(text, str) else text.decode())


def job_mutable_values(job: Job) -> dict[str, Any]:
    """The values of ``MUTABLE_JOB_COLUMNS`` for ``job``."""
    return {
        "state": job.state.value,
        "output": _output_text(job.output),
        "error": _dumps_opt(job.error),
        "exit_code": job.exit_code,
        "retries": job.retries,
        "attempts": dumps([a.to_json() for a in job.attempts]),
        "acquisition": _dumps_opt(job.acquisition),
        "started": job.started,
        "first_instruction": job.first_instruction,
        "finished": job.finished,
    }


def job_row(job: Job) -> dict[str, Any]:
    """Every column of the ``jobs`` row for a newly submitted ``job``."""
    row = job_mutable_values(job)
    row.update(
        id=job.id,
        function=job.function,
        version=job.version,
        caller=job.caller,
        sku=job.sku,
        revision=job.revision,
        lease_tag=job.lease_tag,
        queue=job.queue,
        priority=job.priority,
        timeout_s=job.timeout_s,
        max_retries=job.max_retries,
        pods_needed=job.pods_needed,
        input=dumps(job.input),
        submitted=job.submitted,
        idempotency_key=job.idempotency_key,
        request_hash=job.request_hash,
        output_expired=False,
        single_use=job.single_use,
    )
    return row


def job_from_row(row: Mapping[str, Any]) -> Job:
    """Rebuild a ``Job`` from a ``jobs`` row (a mapping of column name to value); a row
    without ``input`` (a listing's) gives ``input`` None, and ``output_omitted`` is a
    listing's mark, never a column."""
    job = Job(
        id=row["id"],
        function=row["function"],
        version=row["version"],
        caller=row["caller"],
        sku=row["sku"],
        input=orjson.loads(row["input"]) if "input" in row else None,
        state=JobState(row["state"]),
        revision=row["revision"],
        lease_tag=row["lease_tag"],
        queue=row["queue"],
        priority=row["priority"],
        timeout_s=row["timeout_s"],
        max_retries=row["max_retries"],
        pods_needed=row["pods_needed"],
        output=_output_json(row["output"]),
        error=_loads_opt(row["error"]),
        exit_code=row["exit_code"],
        retries=row["retries"],
        attempts=[Attempt.from_json(a) for a in orjson.loads(row["attempts"])],
        acquisition=_loads_opt(row["acquisition"]),
        submitted=row["submitted"],
        started=row["started"],
        first_instruction=row["first_instruction"],
        finished=row["finished"],
        idempotency_key=row["idempotency_key"],
        request_hash=row["request_hash"],
        output_expired=bool(row["output_expired"]),
        output_omitted=bool(row.get("output_omitted", False)),
        single_use=bool(row.get("single_use", False)),
    )
    return job


def function_row(spec: FunctionSpec) -> dict[str, Any]:
    """Every column of the ``functions`` row for ``spec`` (version and created already set)."""
    return {
        "name": spec.name,
        "version": spec.version,
        "sku": spec.sku,
        "package_digest": spec.package_digest,
        "entrypoint": spec.entrypoint,
        "command": _dumps_opt(list(spec.command) if spec.command is not None else None),
        "requirements_digest": spec.requirements_digest,
        "env": dumps(spec.env),
        "timeout_s": spec.timeout_s,
        "max_retries": spec.max_retries,
        "pods": spec.pods,
        "single_use": spec.single_use,
        "created": spec.created,
        "owner": spec.owner,
        "deleted": False,
    }


def function_from_row(row: Mapping[str, Any]) -> FunctionSpec:
    """Rebuild a ``FunctionSpec`` from a full ``functions`` row."""
    command = _loads_opt(row["command"])
    return FunctionSpec(
        name=row["name"],
        version=row["version"],
        sku=row["sku"],
        package_digest=row["package_digest"],
        entrypoint=row["entrypoint"],
        command=tuple(command) if command is not None else None,
        requirements_digest=row["requirements_digest"],
        env=dict(orjson.loads(row["env"])),
        timeout_s=row["timeout_s"],
        max_retries=row["max_retries"],
        pods=row["pods"],
        single_use=bool(row["single_use"]),
        created=row["created"],
        owner=row["owner"],
    )
