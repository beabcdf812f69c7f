"""``make run``'s demo stops its broker and every pod on SIGTERM and SIGHUP as on Ctrl-C, and
refuses, naming the other broker's pid, a state directory another broker serves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.harness import REPO, free_port, kill_pods, start_broker
from pool_manager.backends.local import pid_alive


def live_pods(home: Path) -> list[str]:
    """The pods under ``home`` whose launcher runs."""
    pids = {r.stem: json.loads(r.read_text()).get("pid") for r in (home / "pods").glob("*.json")}
    return sorted(name for name, pid in pids.items() if isinstance(pid, int) and pid_alive(pid))


def processes_naming(path: Path) -> list[int]:
    """Live processes whose command line names ``path`` (a broker or pod of that home)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(path).encode() in argv and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def demo(home: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, FIREPOOL_HOME=str(home))
    return subprocess.Popen(
        [sys.executable, "-m", "examples.run_demo", "--port", str(free_port()), *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_demo_stops_its_broker_and_every_pod_as_ctrl_c_does(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The demo's broker stayed serving, re-parented to PID 1, and the next ``make run``
    failed on its state directory."""
    home = tmp_path / "demo"
    proc = demo(home)
    try:
        deadline = time.monotonic() + 120
        broker = None
        while time.monotonic() < deadline and proc.poll() is None:
            lock = home / "broker.lock"
            text = lock.read_text().strip() if lock.exists() else ""
            if text.isdigit() and int(text) != proc.pid and live_pods(home):
                broker = int(text)  # serving, with pods, the example loop under way
                break
            time.sleep(0.05)
        assert broker is not None and pid_alive(broker), proc.communicate(timeout=5)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err)
        assert not pid_alive(broker), "the broker stopped"
        assert live_pods(home) == [], "its pods stopped"
        assert processes_naming(home) == [], "nothing of the demo runs on"
        assert "stopping the broker" in out and "pod(s) with it" in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_pods(home)


def test_a_demo_on_a_home_another_broker_serves_exits_2_naming_its_pid(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_broker(home)
    try:
        proc = demo(home)
        out, err = proc.communicate(timeout=60)
    finally:
        server.stop()
        kill_pods(home)
    assert proc.returncode == 2, (out, err)
    assert err.startswith(f"error: the state directory {home} is in use by another broker "
                          f"(pid {server.proc.pid})"), err  # fmt: skip
    assert err.count("\n") == 1 and "Traceback" not in err, err
