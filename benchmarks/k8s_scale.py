"""The kubernetes backend at scale, against the emulated API server (kmock, with the node
emulator writing each pod's status back but starting no agent: ``run_agents=False``).

    python -m benchmarks.k8s_scale --pods 2000 --json [--qps 100] [--passes 50]

The cluster runs in a child process (``--serve-cluster``), so this process is the broker's
side alone. It measures:

- creates: ``--pods`` creates asked at once; the backend serialises them behind its create
  lock and paces them at ``--qps``; the rate is pods over the time until the last has an IP,
  beside the limit (ratio = achieved / limit: at most 1);
- the reconcile pass: what the broker asks of its backend per pass, ``list()`` and
  ``exited()`` of every pod, both served from the watch's view (goal: p99 <= 0.5 s at 2,000
  pods; paper: <= 0.56 s), beside its floor measured in the same run: one bare list call of
  the same pods from the API server (the request and the JSON parse, nothing else), and the
  ratio of the two;
- broker memory per pod: this process's resident memory grown while it made the pods and
  holds their view, per pod, beside the size of one pod's JSON as the API server sends it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.args import positive_int
from pod_runtime.agent_auth import agent_key
from pool_manager.backends.kubernetes import KubernetesBackend
from pool_manager.backends.kubernetes_api import KubeApi, connect
from pool_manager.backends.kubernetes_spec import LABEL_POOL
from pool_manager.catalog import PodTemplate, PoolSpec

POOL = PoolSpec(sku="cpu", pod_template=PodTemplate(image="firepool-pod:bench"))


def rss_bytes() -> int:
    """This process's resident memory now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def serve_cluster() -> None:
    """The child: an emulated cluster whose URL is the first line printed; runs until its
    standard input closes."""
    from tests.backends.k8s_node_emulator import EmulatedCluster

    with tempfile.TemporaryDirectory(prefix="firepool-k8s-bench-") as root:
        cluster = EmulatedCluster(Path(root), run_agents=False).start()
        print(cluster.url, flush=True)
        sys.stdin.read()
        cluster.stop()


async def measure(kubeconfig: Path, pods: int, qps: float, passes: int) -> dict[str, Any]:
    api = KubeApi(connect(kubeconfig), "firepool")
    backend = KubernetesBackend(api, agent_key(b"bench".ljust(32)), create_qps=qps,
                                ip_timeout_s=600)  # fmt: skip
    await backend.list()  # the watch is up: the first list came
    gc.collect()
    before = rss_bytes()

    t0 = time.perf_counter()
    made = await asyncio.gather(*(backend.create(f"cpu-{i:05d}", POOL) for i in range(pods)))
    create_s = time.perf_counter() - t0
    assert len(made) == pods

    deadline = time.monotonic() + 60
    while len(backend.observed) < pods and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the watch has shown every pod
    gc.collect()
    per_pod = (rss_bytes() - before) / pods

    passes_s: list[float] = []
    for _ in range(passes):
        t = time.perf_counter()
        listed = await backend.list()
        for pod in listed:
            await backend.exited(pod.name)
        passes_s.append(time.perf_counter() - t)
        assert len(listed) == pods, len(listed)

    floor_s: list[float] = []
    for _ in range(max(5, passes // 5)):
        t = time.perf_counter()
        items, _ = await asyncio.to_thread(api.list, "pods", LABEL_POOL)
        floor_s.append(time.perf_counter() - t)
        assert len(items) == pods
    pod_json = len(json.dumps(items[0]))

    await backend.close()
    p50, p99 = statistics.median(passes_s), percentile(passes_s, 0.99)
    floor = statistics.median(floor_s)
    return {
        "benchmark": "k8s_scale",
        "pods": pods,
        "reconcile_pass_p50_s": round(p50, 4),
        "reconcile_pass_p99_s": round(p99, 4),
        "reconcile_goal_s": 0.5,
        "reconcile_within_goal": p99 <= 0.5,
        "floor_bare_list_p50_s": round(floor, 4),
        "reconcile_p50_over_floor": round(p50 / floor, 3),
        "creates_per_s": round(pods / create_s, 1),
        "create_qps_limit": qps,
        "creates_over_limit": round(pods / create_s / qps, 3),
        "broker_bytes_per_pod": round(per_pod),
        "pod_json_bytes": pod_json,
        "bytes_per_pod_over_json": round(per_pod / pod_json, 2),
        "passes": passes,
        "note": "emulated API server (kmock) in a child process; no pod agents started",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.k8s_scale", description=__doc__)
    parser.add_argument("--pods", type=positive_int, default=2000)
    parser.add_argument("--qps", type=float, default=100.0, help="the create QPS limit")
    parser.add_argument("--passes", type=positive_int, default=50)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-cluster", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_cluster:
        serve_cluster()
        return
    if not args.qps > 0:
        parser.error("--qps must be > 0")
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.k8s_scale", "--serve-cluster"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdin is not None
        url = child.stdout.readline().strip()
        if not url:
            raise SystemExit("the emulated cluster did not start")
        from tests.backends.k8s_node_emulator import kubeconfig_text

        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = Path(tmp) / "kubeconfig"
            kubeconfig.write_text(kubeconfig_text(url))
            result = asyncio.run(measure(kubeconfig, args.pods, args.qps, args.passes))
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(30)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['pods']} pods: reconcile pass p50 {result['reconcile_pass_p50_s']} s, "
            f"p99 {result['reconcile_pass_p99_s']} s (bare list {result['floor_bare_list_p50_s']}"
            f" s); creates {result['creates_per_s']}/s of {args.qps}; "
            f"{result['broker_bytes_per_pod']} B/pod"
        )


if __name__ == "__main__":
    main()
