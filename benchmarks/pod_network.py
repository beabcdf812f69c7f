"""What a pod's network isolation costs at start (issue 26): a sandboxed local pod's start,
spawn to ``/healthz`` answering, with the host's network (``host``, the floor: what pods had
before pools chose), ``none`` (bwrap ``--unshare-net``) and ``outbound`` (a namespace pasta
configures before bwrap starts), in ``--rounds`` alternating rounds so load hits every mode
alike. Prints p50/max per mode and each mode's p50 over the floor's.

    python -m benchmarks.pod_network --json

Needs bubblewrap (and pasta for ``outbound``, which is left out, with the reason, without it).
The warm path is not measured here: a warm call never crosses the pod's network (the broker
talks to the agent over its unix socket, jobs fork from the zygote, the package is cached by
digest), so ``benchmarks.invoke`` with the pool's ``network`` set measures it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from pod_runtime.launch import agent_command, sandbox_status
from pod_runtime.network import outbound_status
from pool_manager.backends.local import pod_environment, spawn_agent, stop_pod

READY_TIMEOUT_S = 60.0


async def _ready(sock: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if sock.exists():
            try:
                connector = aiohttp.UnixConnector(path=str(sock))
                async with (
                    aiohttp.ClientSession(connector=connector) as session,
                    session.get("http://pod/healthz") as resp,
                ):
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
        await asyncio.sleep(0.005)
    raise TimeoutError(f"the pod at {sock} was not ready in {READY_TIMEOUT_S} s")


def start_ms(root: Path, name: str, network: bool | str) -> float:
    """Spawn one sandboxed pod, time it to ready, stop it."""
    pod_dir = root / name
    pod_dir.mkdir()
    sock = pod_dir / "agent.sock"
    argv = agent_command(
        pod_name=name, pod_dir=pod_dir, listen=f"unix:{sock}", network=network, sandbox=True
    )
    began = time.perf_counter()
    pid = spawn_agent(argv, pod_environment({"PATH": "/usr/bin:/bin"}), root / f"{name}.log")
    pod_dir.with_name(name + ".json").write_text(orjson.dumps({"pid": pid}).decode())
    try:
        asyncio.run(_ready(sock))
        return (time.perf_counter() - began) * 1000
    finally:
        stop_pod(pod_dir)
        os.waitpid(pid, 0)


def run(rounds: int) -> dict[str, Any]:
    ok, why = sandbox_status()
    if not ok:
        raise SystemExit(f"needs a sandbox: {why}")
    modes: list[bool | str] = [True, "none"]
    result: dict[str, Any] = {}
    has_pasta, pasta_why = outbound_status()
    if has_pasta:
        modes.append("outbound")
    else:
        result["outbound_skipped"] = pasta_why
    times: dict[str, list[float]] = {("host" if m is True else str(m)): [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="fp-netb-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        for r in range(rounds):
            for mode in modes:
                label = "host" if mode is True else str(mode)
                times[label].append(start_ms(root, f"{label}{r}", mode))
    floor = statistics.median(times["host"])
    for label, values in times.items():
        result[f"{label}_start_p50_ms"] = round(statistics.median(values), 1)
        result[f"{label}_start_max_ms"] = round(max(values), 1)
        result[f"{label}_over_host_p50"] = round(statistics.median(values) / floor, 3)
    result["rounds"] = rounds
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    result = run(args.rounds)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key}: {value}", file=sys.stdout)


if __name__ == "__main__":
    main()
