"""The crash benchmark's function: report one execution to the recorder, then work briefly.

Its side effect (an HTTP hit on the benchmark's recorder) is how duplicates are detected: a
job whose user code ran twice hits twice, whatever the job store says.
"""

import time
import urllib.request
from typing import Any


def work(request: dict[str, Any]) -> dict[str, Any]:
    url = f"{request['recorder']}/hit?key={request['key']}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        resp.read()
    time.sleep(float(request.get("sleep", 0.02)))
    return {"key": request["key"]}
