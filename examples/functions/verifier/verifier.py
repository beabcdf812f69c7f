"""Example verifier: run a candidate solution against unit tests in a child interpreter.

Input: ``{"solution": "<python source>", "tests": "<python source using assert>"}``.
Output: ``{"ok": bool, "passed": int, "failed": int, "failures": [...]}``.
"""

import subprocess
import sys
import textwrap

HARNESS = textwrap.dedent(
    """
    import json, sys, traceback
    ns = {}
    exec(compile(sys.argv[1], "solution.py", "exec"), ns)
    passed, failures = 0, []
    for i, line in enumerate(l for l in sys.argv[2].splitlines() if l.strip()):
        try:
            exec(line, ns)
            passed += 1
        except Exception as exc:
            failures.append({"test": line, "error": repr(exc)})
    print(json.dumps({"passed": passed, "failures": failures}))
    """
)


def verify(request):
    proc = subprocess.run(
        [sys.executable, "-c", HARNESS, request["solution"], request["tests"]],
        capture_output=True,
        text=True,
        timeout=request.get("timeout_s", 10),
    )
    if proc.returncode != 0:
        return {
            "ok": False,
            "passed": 0,
            "failed": 1,
            "failures": [{"test": "<load>", "error": proc.stderr.strip()[-500:]}],
        }
    import json

    result = json.loads(proc.stdout.strip().splitlines()[-1])  # the solution may print too
    failed = len(result["failures"])
    return {
        "ok": failed == 0,
        "passed": result["passed"],
        "failed": failed,
        "failures": result["failures"],
    }
