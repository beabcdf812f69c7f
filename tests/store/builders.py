"""Builders of the rows the job store tests write: jobs and function specs."""

from __future__ import annotations

import secrets
import time
from typing import Any

from broker.jobs import Job
from functions.spec import FunctionSpec

_counter = iter(range(1_000_000))


def make_job(**overrides: Any) -> Job:
    """A QUEUED job with distinct id and submit time; override any field."""
    n = next(_counter)
    fields: dict[str, Any] = {
        "id": f"job-{n:06d}-{secrets.token_hex(3)}",
        "function": "echo",
        "version": 1,
        "caller": "alice",
        "sku": "cpu-small",
        "input": {"n": n},
        "submitted": time.time() + n * 1e-3,
    }
    fields.update(overrides)
    return Job(**fields)


def make_spec(**overrides: Any) -> FunctionSpec:
    fields: dict[str, Any] = {
        "name": "echo",
        "sku": "cpu-small",
        "package_digest": "a" * 64,
        "entrypoint": "main:handler",
    }
    fields.update(overrides)
    return FunctionSpec(**fields)
