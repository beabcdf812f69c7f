"""Zero-VRAM standby on a real card (paper §6, §9.3 and Table 6; issue 21).

Needs a machine with an NVIDIA GPU and its driver (NVML). Starts a broker on local pods with
one pool on the first card: one active pod, one standby on the same card
(``standbys_per_active: 1``) and a budget of that one card, so no second card is ever
used. The job (``gpu_standby_fn/vram.py``) allocates
``--mib`` MiB on the card (torch, else cupy, else ``cudaMalloc``/``cuMemAlloc`` through
ctypes), holds them ``--hold-s`` seconds and frees them.

One caller runs ``--jobs`` jobs, each with a fresh reuse tag (the paper's standby benchmark,
§9.3), each submitted as soon as the previous one runs: a job cannot reuse the busy pod, so
it claims the standby if one is idle and verified, and the per-GPU gate promotes it when the
previous job's processes are gone; otherwise it waits for the gate and runs once on a
previous pod (``recycled``), which then retires and leaves room for the next standby.

- **handover**: for each job served by a promoted standby, **release → standby's first
  instruction** (the previous job's ``finished`` → this one's ``first_instruction``), against
  the paper's 0.94 s (Table 6, the median queue wait over handovers on H200); its queue wait
  (``submitted`` → ``started``) is printed too;
- **floor**: the same gap for the jobs that ran on a previous pod through the same gate (no
  promotion), measured in the same run: ``handover_over_floor`` is what promotion adds;
- **standby VRAM**: every 50 ms while it runs, NVML's compute processes on the card are
  mapped to pods (a process below a pod's agent is that pod's): the most device memory any
  idle standby's processes held (0 bytes is the claim), and the most the card had in use
  (the jobs' allocations).

With no GPU (no driver, NVML ``LibraryNotFound``, or no card) it says so on stderr, prints a
JSON object with ``"gpu": false`` and the reason, and exits 0.

    python -m benchmarks.gpu_standby --json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.args import non_negative_int, positive_int
from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker
from pod_runtime.gpu import MiB, Nvml, descends_from

PAPER_HANDOVER_S = 0.94
"""Table 6: median queue wait at a handover with standby on H200."""
FN_DIR = Path(__file__).parent / "gpu_standby_fn"
CATALOG = """\
gpus: {{bench: [{uuid}]}}
budgets: {{bench: 1}}
pools:
  bench: {{accelerator: bench, min_count: 0, max_count: 1, idle_timeout_s: 600,
           standbys_per_active: 1}}
"""
SAMPLE_S = 0.05
REFILL_WAIT_S = 120.0
"""How long the loop waits for the first standby to be staged (a pod start)."""


def find_card(nvml: Nvml) -> tuple[str, str] | str:
    """The first card's ``(uuid, name)``, or why there is none."""
    devices = nvml.devices()
    if devices is None:
        return nvml.error or "NVML could not list the devices"
    if not devices:
        return "NVML lists no GPU on this machine"
    return devices[0]


def no_gpu(reason: str) -> dict[str, Any]:
    return {"benchmark": "gpu_standby", "gpu": False, "reason": reason,
            "paper_handover_s": PAPER_HANDOVER_S}  # fmt: skip


class VramSampler(threading.Thread):
    """Samples the card's compute processes and maps them to the broker's pods."""

    def __init__(self, server: BrokerServer, nvml: Nvml, uuid: str) -> None:
        super().__init__(daemon=True)
        self.server, self.nvml, self.uuid = server, nvml, uuid
        self.stop_event = threading.Event()
        self.samples = 0
        self.standby_samples = 0
        """Samples taken while at least one standby was idle."""
        self.standby_max_bytes = 0
        self.card_max_used_mib = 0
        self.unreadable = 0
        self.errors: list[str] = []

    def _agent_pids(self, names: set[str]) -> set[int]:
        pids = set()
        for name in names:
            try:
                meta = json.loads((self.server.home / "pods" / f"{name}.json").read_text())
            except (OSError, ValueError):
                continue
            if isinstance(meta.get("pid"), int):
                pids.add(meta["pid"])
        return pids

    def sample(self, admin: Any) -> None:
        pods = admin._http.get("/v1/pools?pods=1").json()["pod_list"]
        idle = {p["name"] for p in pods if p["role"] == "standby" and p["state"] == "IDLE"}
        standby_pids = self._agent_pids(idle)
        nvml = self.nvml._init()
        handle = nvml.nvmlDeviceGetHandleByUUID(self.uuid)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        self.card_max_used_mib = max(self.card_max_used_mib, int(memory.used // MiB))
        held = 0
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if standby_pids and descends_from(int(proc.pid), standby_pids):
                used = proc.usedGpuMemory
                if used is None:
                    self.unreadable += 1
                held += int(used or 0) or 1  # a context with unknown memory still counts
        self.samples += 1
        if standby_pids:
            self.standby_samples += 1
            self.standby_max_bytes = max(self.standby_max_bytes, held)

    def run(self) -> None:
        with self.server.client("sampler", Role.ADMIN) as admin:
            while not self.stop_event.is_set():
                try:
                    self.sample(admin)
                except Exception as exc:  # one failed sample is reported, not fatal
                    if len(self.errors) < 5:
                        self.errors.append(repr(exc))
                self.stop_event.wait(SAMPLE_S)


def _pods(server: BrokerServer) -> list[dict[str, Any]]:
    with server.client("ops", Role.ADMIN) as fp:
        return list(fp._http.get("/v1/pools?pods=1").json()["pod_list"])


def _idle_standby(server: BrokerServer, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p["role"] == "standby" and p["state"] == "IDLE" for p in _pods(server)):
            return True
        time.sleep(0.05)
    return False


def _until_running(server: BrokerServer, job_id: str, timeout_s: float = 120.0) -> None:
    with server.client("ops", Role.ADMIN) as fp:
        deadline = time.monotonic() + timeout_s
        while fp.job(job_id)["state"] in ("PENDING", "QUEUED"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id} never started")
            time.sleep(0.02)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def run(args: argparse.Namespace, uuid: str, name: str, nvml: Nvml) -> dict[str, Any]:
    request = {"mib": args.mib, "hold_s": args.hold_s}
    with tempfile.TemporaryDirectory(prefix="fp-bench-gpu-standby-") as tmp:
        home = Path(tmp)
        server = start_broker(home, CATALOG.format(uuid=uuid),
                              extra_env={"FIREPOOL_GPU_SWEEP_S": "0.5"})  # fmt: skip
        sampler = VramSampler(server, nvml, uuid)
        try:
            with server.client("deployer", Role.DEPLOY) as fp:
                fp.deploy(FN_DIR, name="vram", sku="bench", entrypoint="vram:alloc",
                          timeout_s=600, max_retries=0)  # fmt: skip
            sampler.start()
            with server.client("loop") as fp:
                first = fp.invoke("vram", request, lease_tag="t0")  # makes the active pod
                standby_staged = _idle_standby(server, REFILL_WAIT_S)
                ids = [fp.submit("vram", request, lease_tag="t1")]
                for k in range(2, args.jobs + 1):
                    _until_running(server, ids[-1])
                    ids.append(fp.submit("vram", request, lease_tag=f"t{k}"))
                jobs = [first] + [fp.wait(job_id, timeout_s=600) for job_id in ids]
        finally:
            sampler.stop_event.set()
            sampler.join(10)
            server.stop()
            kill_pods(home)
    failed = [j for j in jobs if j["state"] != "SUCCEEDED"]
    handovers: list[float] = []
    floor: list[float] = []
    waits: list[float] = []
    paths: list[str] = []
    for before, job in itertools.pairwise(jobs):
        path = job["acquisition"]["path"]
        paths.append(path)
        if job["state"] != "SUCCEEDED":
            continue
        gap = job["timings"]["first_instruction"] - before["timings"]["finished"]
        if path == "standby":
            handovers.append(gap)
            waits.append(job["timings"]["started"] - job["timings"]["submitted"])
        elif path in ("recycled", "warm"):
            floor.append(gap)
    handover_s, floor_s = _median(handovers), _median(floor)
    return {
        "benchmark": "gpu_standby",
        "gpu": True,
        "card": {"uuid": uuid, "name": name},
        "job": {"mib": args.mib, "hold_s": args.hold_s,
                "via": sorted({j["output"]["via"] for j in jobs if j.get("output")})},
        "jobs": len(jobs),
        "paths": {p: paths.count(p) for p in sorted(set(paths))},
        "standby_staged": standby_staged,
        "handovers": len(handovers),
        "handover_release_to_first_instruction_s": handover_s,
        "handover_queue_wait_s": _median(waits),
        "floor_release_to_first_instruction_s": floor_s,
        "floor_jobs": len(floor),
        "handover_over_floor": round(handover_s / floor_s, 2) if handover_s and floor_s else None,
        "paper_handover_s": PAPER_HANDOVER_S,
        "handover_over_paper": round(handover_s / PAPER_HANDOVER_S, 2) if handover_s else None,
        "standby_vram_max_bytes": sampler.standby_max_bytes,
        "standby_vram_samples": sampler.standby_samples,
        "standby_vram_unreadable": sampler.unreadable,
        "card_used_max_mib": sampler.card_max_used_mib,
        "sampler_errors": sampler.errors,
        "failed_jobs": [{"id": j["id"], "error": j.get("error")} for j in failed],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_standby",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=20,
        help="jobs of the loop after the first, each with a fresh reuse tag",
    )
    parser.add_argument(
        "--mib",
        type=non_negative_int,
        default=1024,
        help="device memory each job allocates; 0: none (a dry run of the path)",
    )
    parser.add_argument(
        "--hold-s",
        type=float,
        default=3.0,
        help="how long each job holds its memory (the standby refills meanwhile)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    nvml = Nvml()
    card = find_card(nvml)
    if isinstance(card, str):
        print(f"gpu_standby: no NVIDIA GPU here ({card}); the benchmark needs one, nothing "
              "was measured", file=sys.stderr)  # fmt: skip
        result = no_gpu(card)
    else:
        result = run(args, card[0], card[1], nvml)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0 if result["gpu"] is False or not result["failed_jobs"] else 1


if __name__ == "__main__":
    sys.exit(main())
