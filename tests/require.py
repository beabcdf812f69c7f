"""Skip a test for want of a service or tool, or fail it where CI requires that one.

CI (``.ci/run``) sets each ``FIREPOOL_REQUIRE_*`` to ``1``, so a missing service there is a
failure, never a hidden skip; a developer's machine without it skips with the reason."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(require_env: str, why: str) -> NoReturn:
    """Skip the calling test with ``why``, or fail it where ``require_env`` is ``1``."""
    if os.environ.get(require_env) == "1":
        pytest.fail(f"{require_env}=1 but {why}")
    pytest.skip(why)
