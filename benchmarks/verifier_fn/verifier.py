"""A verifier for ``benchmarks.verifier_loop``: run a candidate solution against its unit tests
in this process and say whether it passed.

Input: ``{"solution": "<python source>", "tests": ["<assert ...>", ...]}``.
Output: ``{"ok": bool, "passed": int, "failed": int}``; a solution that does not even load
fails every test. The same function runs in a Firepool pod and in a local subprocess
(``python -c``), so the two sides of the benchmark do the same work.
"""

from __future__ import annotations

from typing import Any


def verify(request: dict[str, Any]) -> dict[str, Any]:
    tests: list[str] = list(request["tests"])
    namespace: dict[str, Any] = {}
    try:
        exec(compile(request["solution"], "solution.py", "exec"), namespace)
    except Exception:
        return {"ok": False, "passed": 0, "failed": len(tests)}
    passed = 0
    for test in tests:
        try:
            exec(test, namespace)
            passed += 1
        except Exception:  # a wrong answer (AssertionError) or a crash: a failed test
            pass
    failed = len(tests) - passed
    return {"ok": failed == 0, "passed": passed, "failed": failed}
