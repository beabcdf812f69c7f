"""``python -m benchmarks.gpu_standby`` without a GPU: it says so and exits cleanly with a JSON
object, and, on an emulated card (the node emulator's ``pynvml``, which lists a card that
does not exist: ``tests/backends/emulated_nvml/pynvml.py`` says what it is not), its loop runs
end to end with ``--mib 0`` (nothing allocated): the figures it prints come from promoted
standbys and from its floor, measured in the same run. What a real card shows (the standby's
0 bytes of VRAM while a job's allocation is on the card, the handover against the paper's
0.94 s) only a machine with a GPU can say. Timings are never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gateway.harness import REPO
from tests.backends.k8s_node_emulator import EMULATED_NVML
from tests.benchmarks.rounding import ratio_of_printed


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_standby", *args, "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, **env},
    )  # fmt: skip


def test_without_a_gpu_it_says_so_and_prints_a_json_object_not_a_traceback(
    tmp_path: Path,
) -> None:
    # The emulated driver with no state file is a driver that is not loaded, on any machine.
    env = {"PYTHONPATH": str(EMULATED_NVML), "FIREPOOL_TEST_NVML_STATE": str(tmp_path / "no")}
    done = run(env)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["gpu"] is False and result["benchmark"] == "gpu_standby"
    assert "LibraryNotFound" in result["reason"]
    assert result["paper_handover_s"] == 0.94
    assert "no NVIDIA GPU here" in done.stderr and "Traceback" not in done.stderr


def test_on_an_emulated_card_the_loop_promotes_standbys_and_prints_them_beside_the_floor(
    tmp_path: Path,
) -> None:
    state = tmp_path / "cards.json"
    state.write_text(json.dumps({"cards": [{"uuid": "GPU-dry-0", "name": "NVIDIA H200",
                                            "memory_total_mib": 143771, "readable": True,
                                            "processes": []}]}))  # fmt: skip
    env = {"PYTHONPATH": str(EMULATED_NVML), "FIREPOOL_TEST_NVML_STATE": str(state),
           "FIREPOOL_TEST_NVML_VISIBLE": "GPU-dry-0"}  # fmt: skip
    done = run(env, "--jobs", "4", "--mib", "0", "--hold-s", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["gpu"] is True and result["card"]["uuid"] == "GPU-dry-0"
    assert result["failed_jobs"] == [] and result["jobs"] == 5
    assert result["job"]["via"] == ["none"]
    assert result["handovers"] >= 1 and result["paths"]["standby"] == result["handovers"]
    handover = result["handover_release_to_first_instruction_s"]
    assert handover > 0
    # timings printed rounded to 1 ms, their ratios to 0.01
    assert ratio_of_printed(result["handover_over_paper"], handover, 0.94, ratio_step=0.01)
    if result["floor_jobs"]:
        floor = result["floor_release_to_first_instruction_s"]
        assert ratio_of_printed(result["handover_over_floor"], handover, floor, ratio_step=0.01)
    assert result["standby_vram_samples"] > 0 and result["sampler_errors"] == []
