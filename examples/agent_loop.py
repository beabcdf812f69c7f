"""An example agent loop: agents verify candidate solutions and fan out RL rollouts.

Each call prints the caller, the function, how its pod was acquired and the latency, so the
warm-pool behaviour is visible: the first call of a caller lands on a never-used or new pod,
later calls with the same lease tag land ``warm`` on the same pod, and a new tag runs once
``recycled`` on the old pod, which then retires.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from functions.sdk import Client

SOLUTIONS = [
    "def add(a, b):\n    return a - b\n",
    "def add(a, b):\n    return a + b if a else b\n",
    "def add(a, b):\n    return a + b\n",
]
TESTS = "assert add(1, 2) == 3\nassert add(0, 5) == 5\nassert add(-1, 1) == 0"


def _show(caller: str, fn: str, job: dict[str, Any], ms: float) -> None:
    acq = job.get("acquisition") or {}
    pods = job["attempts"][-1]["pods"] if job.get("attempts") else []
    reason = f"  ({acq.get('reason')})" if acq.get("reason") else ""
    print(
        f"  {caller:<8} {fn:<9} {job['state']:<9} path={acq.get('path', '-'):<9} "
        f"{ms:7.1f} ms  pod={','.join(pods)}{reason}",
        flush=True,
    )


def coding_agent(url: str, token: str, caller: str, episode: str) -> list[str]:
    paths = []
    with Client(url, token) as fp:
        for solution in SOLUTIONS:
            t0 = time.perf_counter()
            job = fp.invoke("verifier", {"solution": solution, "tests": TESTS}, lease_tag=episode)
            _show(caller, "verifier", job, (time.perf_counter() - t0) * 1000)
            paths.append((job.get("acquisition") or {}).get("path", "-"))
            if job["state"] == "SUCCEEDED" and job["output"]["ok"]:
                break
    return paths


def rl_step(url: str, token: str, caller: str, iteration: int, fanout: int = 4) -> list[str]:
    with Client(url, token) as fp:
        ids = [
            fp.submit("rollout", {"seed": iteration * 100 + i}, lease_tag="trainer")
            for i in range(fanout)
        ]
        jobs = [fp.wait(job_id) for job_id in ids]
    returns = [j["output"]["return"] for j in jobs if j["state"] == "SUCCEEDED"]
    print(
        f"  {caller:<8} rollout   iteration {iteration}: {len(returns)}/{fanout} rollouts, "
        f"mean return {sum(returns) / max(len(returns), 1):+.3f}, paths "
        f"{sorted((j.get('acquisition') or {}).get('path', '-') for j in jobs)}",
        flush=True,
    )
    return [(j.get("acquisition") or {}).get("path", "-") for j in jobs]


def run(url: str, tokens: dict[str, str]) -> dict[str, int]:
    """Run the whole example; return counts of acquisition paths."""
    counts: dict[str, int] = {}

    def tally(paths: list[str]) -> None:
        for p in paths:
            counts[p] = counts.get(p, 0) + 1

    print("two coding agents, three verifier attempts each, stable lease tag:")
    with ThreadPoolExecutor(2) as pool:
        for paths in pool.map(
            lambda c: coding_agent(url, tokens[c], c, "episode-1"), ["alice", "bob"]
        ):
            tally(paths)
    print("the same agents, same episode again (warm):")
    with ThreadPoolExecutor(2) as pool:
        for paths in pool.map(
            lambda c: coding_agent(url, tokens[c], c, "episode-1"), ["alice", "bob"]
        ):
            tally(paths)
    print("alice starts a new episode (new tag: recycled once, then the old pod retires):")
    tally(coding_agent(url, tokens["alice"], "alice", "episode-2"))
    print("an RL trainer fans out rollouts:")
    for iteration in range(3):
        tally(rl_step(url, tokens["trainer"], "trainer", iteration))
    return counts
