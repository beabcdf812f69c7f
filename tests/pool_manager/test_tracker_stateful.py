"""The control-plane state machine (``tests/pool_manager/control_plane.py``) as a test:
FIREPOOL_STATEFUL_EXAMPLES runs more examples than the 60 of the suite."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from tests.pool_manager.control_plane import ControlPlane

TestControlPlane = ControlPlane.TestCase
TestControlPlane.settings = settings(
    max_examples=int(os.environ.get("FIREPOOL_STATEFUL_EXAMPLES", "60")),
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
