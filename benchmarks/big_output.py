"""What a large job output costs the broker: memory and time to finish the job and to read it.

One function returns ``--values`` one-element lists (``[[0],[0],...]``, 4 bytes of JSON each,
16 MB by default: just under the 16 MiB output cap), the output that costs a Python process the
most memory per byte. A broker on local pods runs ``--jobs`` such sync invokes, then ``--reads``
reads of the finished job (``GET /v1/jobs/{id}``) and as many listings of the jobs
(``GET /v1/jobs?limit=JOBS``), while a thread samples the broker process's
resident memory every 20 ms. Prints the medians of each step's wall time (client parse
included) and the broker's peak resident memory above its level just before the step.

    python -m benchmarks.big_output --json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from tqdm import tqdm

from gateway.auth import Role
from gateway.harness import kill_pods, start_broker

FUNCTION = Path(__file__).parent / "output_fn"


class _Peak:
    """Samples a process's resident set every 20 ms; ``over()`` is the peak since ``mark()``."""

    def __init__(self, pid: int) -> None:
        self.pid, self.base, self.peak = pid, 0, 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def rss_mb(self) -> float:
        with open(f"/proc/{self.pid}/status") as f:
            kb = int(f.read().split("VmRSS:")[1].split()[0])
        return kb / 1024

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, int(self.rss_mb()))

    def mark(self) -> None:
        time.sleep(0.5)
        self.base = self.peak = int(self.rss_mb())

    def over(self) -> int:
        return self.peak - self.base

    def stop(self) -> None:
        self._stop.set()


def run(values: int, jobs: int, reads: int, bar: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="firepool-big-output-") as tmp:
        home = Path(tmp)
        server = start_broker(home)
        peak = _Peak(server.proc.pid)
        try:
            with server.client("bench-dev", Role.DEPLOY) as fp:
                fp.deploy(FUNCTION, name="nested", sku="cpu", entrypoint="outputs:nested")
            progress = tqdm(total=jobs + 2 * reads, disable=not bar, desc="big output", unit="call")
            with server.client("bench") as fp, progress:
                invoke_s, invoke_mb, job = [], [], None
                for _ in range(jobs):
                    peak.mark()
                    t0 = time.perf_counter()
                    job = fp.invoke("nested", values, lease_tag="bench")
                    invoke_s.append(time.perf_counter() - t0)
                    invoke_mb.append(peak.over())
                    assert job["state"] == "SUCCEEDED", job.get("error")
                    progress.update()
                assert job is not None
                size = len(orjson.dumps(job["output"]))
                read_s, read_mb = [], []
                for _ in range(reads):
                    peak.mark()
                    t0 = time.perf_counter()
                    got = fp.job(job["id"])
                    read_s.append(time.perf_counter() - t0)
                    read_mb.append(peak.over())
                    assert len(got["output"]) == values
                    progress.update()
                list_s, list_mb, listed = [], [], 0
                for _ in range(reads):
                    peak.mark()
                    t0 = time.perf_counter()
                    jobs_listed = fp.jobs(limit=jobs)
                    list_s.append(time.perf_counter() - t0)
                    list_mb.append(peak.over())
                    listed = sum(j.get("output") is not None for j in jobs_listed)
                    progress.update()
        finally:
            peak.stop()
            server.stop()
            kill_pods(home)
    return {
        "output_bytes": size,
        "jobs": jobs,
        "reads": reads,
        "invoke_median_s": statistics.median(invoke_s),
        "invoke_broker_peak_over_mb_median": statistics.median(invoke_mb),
        "read_median_s": statistics.median(read_s),
        "read_broker_peak_over_mb_median": statistics.median(read_mb),
        "list_median_s": statistics.median(list_s),
        "list_broker_peak_over_mb_median": statistics.median(list_mb),
        "list_outputs_included": listed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--values", type=int, default=4_000_000, help="lists in the output")
    parser.add_argument("--jobs", type=int, default=3, help="sync invokes")
    parser.add_argument("--reads", type=int, default=5, help="reads of the finished job")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if min(args.values, args.jobs, args.reads) < 1:
        parser.error("--values, --jobs and --reads must be at least 1")
    result = run(args.values, args.jobs, args.reads, bar=True)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:>36}: {value}")


if __name__ == "__main__":
    main()
