"""`firepool serve` stopped with Ctrl-C (SIGINT) exits 130 after a clean stop, with no
traceback in its log."""

from __future__ import annotations

from pathlib import Path

from gateway.harness import kill_pods, start_broker


def test_serve_stopped_by_sigint_exits_130_without_a_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_broker(home, extra_env={"FIREPOOL_ALLOW_UNSANDBOXED": "1"})
    try:
        server.stop()
        assert server.proc.returncode == 130
        log = server.log()
        assert "Traceback" not in log, log[-3000:]
        assert "KeyboardInterrupt" not in log, log[-3000:]
    finally:
        kill_pods(home)
