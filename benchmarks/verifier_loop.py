"""An agent's verifier loop through Firepool against the same verifier as local subprocesses
(issue 25).

``--checks`` checks (default 328) of generated Python solutions against their unit tests
(``checks``: a few small problems, each solution right or, deterministically, wrong) are
split among ``--agents`` (4) concurrent agents. Each round runs them twice, in alternating
order from round to round:

- **firepool**: each agent is a thread with its own ``functions.sdk.Client``, calling
  ``function("verify").invoke(check, tag=agent)`` one check after another (its lease tag
  keeps its pod warm); the function is ``benchmarks/verifier_fn`` (verifies in-process);
- **local** (the floor): each agent thread runs ``python -I -S -c`` importing the same
  ``verifier.verify`` per check, the check on stdin and the verdict on stdout (``-I -S``:
  no site-packages, which the stdlib-only verifier does not need and whose ``.pth`` files
  would add most of an interpreter's start here: the strictest floor).

Every verdict is compared with the expected one. Prints the wall time of each side (medians
over ``--rounds``), ``wall_ratio`` (firepool / local; the goal is <= 1.25), per-call latency
p50/p99 on each side and ``overhead_p50_ms`` / ``overhead_p99_ms``: per check, Firepool's
call time minus the same check's local subprocess time.

    python -m benchmarks.verifier_loop --json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from benchmarks.args import non_negative_int, positive_int
from benchmarks.invoke import pct
from functions.sdk import Client
from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker

VERIFIER = Path(__file__).resolve().parent / "verifier_fn"
CATALOG = (
    "budgets: {cpu: 16}\n"
    "pools:\n"
    "  cpu: {min_count: 4, max_idle_count: 4, max_count: 8, idle_timeout_s: 600}\n"
)
LOCAL_RUNNER = (
    "import json, sys\n"
    f"sys.path.insert(0, {str(VERIFIER)!r})\n"
    "from verifier import verify\n"
    "print(json.dumps(verify(json.loads(sys.stdin.read()))))\n"
)

PROBLEMS: list[tuple[str, str, list[str], list[str]]] = [
    # (name, right solution, wrong solutions, tests)
    (
        "add",
        "def add(a, b):\n    return a + b\n",
        ["def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a * b\n"],
        ["assert add(1, 2) == 3", "assert add(-4, 4) == 0", "assert add(10, 5) == 15"],
    ),
    (
        "reverse",
        "def reverse(s):\n    return s[::-1]\n",
        ["def reverse(s):\n    return s\n", "def reverse(s):\n    return sorted(s)\n"],
        ["assert reverse('abc') == 'cba'", "assert reverse('') == ''",
         "assert reverse('ab') == 'ba'"],
    ),
    (
        "fib",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
        "        a, b = b, a + b\n    return a\n",
        ["def fib(n):\n    return n\n", "def fib(n):\n    return fib(n - 1) + fib(n - 2)\n"],
        ["assert fib(0) == 0", "assert fib(1) == 1", "assert fib(10) == 55",
         "assert fib(20) == 6765"],
    ),
    (
        "is_prime",
        "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n**0.5) + 1))\n",
        ["def is_prime(n):\n    return n % 2 == 1\n", "def is_prime(n)\n    return True\n"],
        ["assert is_prime(2)", "assert not is_prime(9)", "assert is_prime(97)",
         "assert not is_prime(1)"],
    ),
    (
        "dedupe",
        "def dedupe(xs):\n    return sorted(set(xs))\n",
        ["def dedupe(xs):\n    return xs\n", "def dedupe(xs):\n    return list(set(xs))[::-1]\n"],
        ["assert dedupe([3, 1, 3, 2]) == [1, 2, 3]", "assert dedupe([]) == []"],
    ),
]  # fmt: skip


def checks(n: int) -> list[tuple[dict[str, Any], bool]]:
    """``n`` checks and whether each should pass: problem ``i % 5``; every third check of a
    problem is one of its wrong solutions (a wrong answer, a crash or a syntax error)."""
    out = []
    for i in range(n):
        _, right, wrong, tests = PROBLEMS[i % len(PROBLEMS)]
        turn = i // len(PROBLEMS)
        solution = wrong[(turn // 3) % len(wrong)] if turn % 3 == 2 else right
        out.append(({"solution": solution, "tests": tests}, solution == right))
    return out


Verdicts = list[tuple[float, bool]]
"""Per check, in check order: (milliseconds, passed)."""


def _agents(
    work: list[tuple[dict[str, Any], bool]],
    agents: int,
    call: Callable[[int, dict[str, Any]], bool],
) -> tuple[float, Verdicts]:
    """Run ``work`` split round-robin among ``agents`` threads, each one check at a time;
    returns the wall time (s) and each check's time and verdict."""
    results: list[tuple[float, bool] | None] = [None] * len(work)

    def agent(k: int) -> None:
        for i in range(k, len(work), agents):
            t0 = time.perf_counter()
            ok = call(k, work[i][0])
            results[i] = ((time.perf_counter() - t0) * 1000, ok)

    start = time.perf_counter()
    with ThreadPoolExecutor(agents) as pool:
        for future in [pool.submit(agent, k) for k in range(agents)]:
            future.result()
    wall = time.perf_counter() - start
    done = [r for r in results if r is not None]
    assert len(done) == len(work)
    for (_, expected), (_, ok) in zip(work, done, strict=True):
        if ok != expected:
            raise RuntimeError(f"a check gave {ok}, expected {expected}")
    return wall, done


def _local_call(_: int, check: dict[str, Any]) -> bool:
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", LOCAL_RUNNER],
        input=orjson.dumps(check), capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    return bool(orjson.loads(done.stdout)["ok"])


def run(n: int, agents: int, rounds: int, warmup: int) -> dict[str, Any]:
    work = checks(n)
    walls: dict[str, list[float]] = {"firepool": [], "local": []}
    calls: dict[str, list[Verdicts]] = {"firepool": [], "local": []}
    with tempfile.TemporaryDirectory(prefix="fp-bench-verifier-") as tmp:
        home = Path(tmp)
        server: BrokerServer = start_broker(home, CATALOG)
        clients: list[Client] = []
        try:
            with server.client("deployer", Role.DEPLOY) as fp:
                fp.deploy(VERIFIER, name="verify", sku="cpu", entrypoint="verifier:verify")
            clients = [server.client(f"agent-{k}") for k in range(agents)]
            handles = [c.function("verify") for c in clients]

            def firepool_call(k: int, check: dict[str, Any]) -> bool:
                return bool(handles[k].invoke(check, tag=f"agent-{k}")["ok"])

            sides: dict[str, Callable[[int, dict[str, Any]], bool]] = {
                "firepool": firepool_call,
                "local": _local_call,
            }
            for side in sides.values():
                _agents(work[: warmup * agents], agents, side)
            for r in range(rounds):
                order = list(sides) if r % 2 == 0 else list(sides)[::-1]
                for name in order:
                    wall, done = _agents(work, agents, sides[name])
                    walls[name].append(wall)
                    calls[name].append(done)
        finally:
            for client in clients:
                client.close()
            server.stop()
            kill_pods(home)
    fp_ms = [ms for done in calls["firepool"] for ms, _ in done]
    local_ms = [ms for done in calls["local"] for ms, _ in done]
    overhead = [f - loc for f, loc in zip(fp_ms, local_ms, strict=True)]
    fp_wall, local_wall = statistics.median(walls["firepool"]), statistics.median(walls["local"])
    return {
        "checks": n,
        "agents": agents,
        "rounds": rounds,
        "wrong_solutions": sum(1 for _, ok in work if not ok),
        "firepool_wall_s": round(fp_wall, 3),
        "local_wall_s": round(local_wall, 3),
        "wall_ratio": round(fp_wall / local_wall, 3),
        "firepool_walls_s": [round(w, 3) for w in walls["firepool"]],
        "local_walls_s": [round(w, 3) for w in walls["local"]],
        "firepool_call_p50_ms": round(statistics.median(fp_ms), 3),
        "firepool_call_p99_ms": round(pct(fp_ms, 0.99), 3),
        "local_call_p50_ms": round(statistics.median(local_ms), 3),
        "local_call_p99_ms": round(pct(local_ms, 0.99), 3),
        "overhead_p50_ms": round(statistics.median(overhead), 3),
        "overhead_p99_ms": round(pct(overhead, 0.99), 3),
        "load_average": list(os.getloadavg()),
        "goal": {"wall_ratio": 1.25},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checks", type=positive_int, default=328)
    parser.add_argument("--agents", type=positive_int, default=4)
    parser.add_argument("--rounds", type=positive_int, default=3, help="alternating rounds")
    parser.add_argument("--warmup", type=non_negative_int, default=2, help="checks per agent")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = run(args.checks, args.agents, args.rounds, args.warmup)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")


if __name__ == "__main__":
    main()
