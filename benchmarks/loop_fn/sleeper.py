"""A fixed-duration job body for the loop benchmarks: sleeps ``input["s"]`` seconds."""

import time
from typing import Any


def run(request: dict[str, Any]) -> dict[str, Any]:
    time.sleep(float(request["s"]))
    return {"slept": request["s"]}
