"""Pod-agent reset cost (paper App. C.2; issue 5).

Starts one local pod (sandboxed with bubblewrap when it works here), then for each scenario
runs a job that leaves the residue, calls ``POST /reset`` and records the agent's own
``duration_ms`` (kill + /proc verification + wipe):

- ``clean_ms``: after a no-op job (goal <= 5 ms);
- ``files_10k_ms``: 10,000 files left in scratch (goal <= 150 ms);
- ``shm_1gib_ms``: a 1 GiB file left in the pod's private /dev/shm (sandboxed only);
- ``leftover_procs_ms``: 20 processes left running, some double-forked daemons (goal <= 60).

Medians over ``--trials`` (fewer for the heavy scenarios). Every reset must report clean.

    python -m benchmarks.reset --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path
from typing import Any

from benchmarks.args import positive_int
from pod_runtime.launch import sandbox_status
from pod_runtime.localpod import LocalPod

JOBS = r"""
import os, subprocess

def noop(x):
    return None

def files(n):
    scratch = os.environ["TMPDIR"]
    for i in range(n):
        sub = os.path.join(scratch, f"d{i // 1000}")
        if i % 1000 == 0:
            os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"f{i}"), "w") as f:
            f.write("x")
    return n

def shm(mib):
    block = b"\1" * (1 << 20)
    with open("/dev/shm/big.bin", "wb") as f:
        for _ in range(mib):
            f.write(block)
    return mib

def procs(n):
    for i in range(n):
        if i % 2:
            subprocess.Popen(["sleep", "600"], start_new_session=True)
        elif os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "600"])
            os._exit(0)
    return n
"""


def _package(directory: Path) -> dict[str, str]:
    path = directory / "bench.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("bench.py", JOBS)
    return {"url": path.as_uri(), "digest": hashlib.sha256(path.read_bytes()).hexdigest()}


def _scenario(pod: LocalPod, package: dict[str, str], fn: str, arg: Any, trials: int) -> float:
    durations = []
    for _ in range(trials):
        result = pod.run(
            {
                "attempt_id": f"bench-{uuid.uuid4().hex[:12]}:1",
                "package": package,
                "entrypoint": f"bench:{fn}",
                "input": arg,
            }
        )
        if result["state"] != "succeeded":
            raise RuntimeError(f"{fn} failed: {result['error']}")
        pod.call("DELETE", f"/attempts/{result['attempt_id']}/result")
        report = pod.reset()
        if not report["clean"]:
            raise RuntimeError(f"reset after {fn} was unclean: {report['reason']}")
        durations.append(float(report["duration_ms"]))
    return round(statistics.median(durations), 2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.reset", description=__doc__)
    parser.add_argument("--trials", type=positive_int, default=30)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    sandboxed, why = sandbox_status()
    with tempfile.TemporaryDirectory(prefix="fp-bench-reset-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        pod_dir = root / "pod"
        pod_dir.mkdir()
        package = _package(pod_dir)
        pod = LocalPod.start(f"bench-reset-{uuid.uuid4().hex[:8]}", pod_dir)
        try:
            heavy = max(3, args.trials // 10)
            out: dict[str, Any] = {
                "clean_ms": _scenario(pod, package, "noop", None, args.trials),
                "files_10k_ms": _scenario(pod, package, "files", 10_000, heavy),
                "shm_1gib_ms": (_scenario(pod, package, "shm", 1024, 3) if sandboxed else None),
                "leftover_procs_ms": _scenario(pod, package, "procs", 20, heavy),
                "sandboxed": sandboxed,
                "sandbox": why,
                "cgroups": pod.call("GET", "/healthz")[1].get("cgroups"),
                "trials": args.trials,
            }
        finally:
            pod.stop()
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:>20}: {value}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
