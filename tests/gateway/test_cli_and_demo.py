"""The developer's path: the ``firepool`` CLI and the ``make run`` demo, as subprocesses (the
CLI's error exits, which need no broker, in this process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.auth import Authenticator, Role, load_or_create_key
from gateway.cli import main
from gateway.harness import REPO, BrokerServer, free_port, kill_pods, start_broker, wait_ready
from pool_manager.backends.local import pid_alive
from tests.conftest import BEHAVIOURS, EXAMPLES


def _firepool(
    server: BrokerServer, *args: str, token: str | None = None, exit_code: int = 0
) -> str:
    """The command's stdout (its stderr when it is to fail), once it exited ``exit_code``."""
    env = dict(os.environ, FIREPOOL_HOME=str(server.home), FIREPOOL_URL=server.url)
    if token:
        env["FIREPOOL_TOKEN"] = token
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == exit_code, (proc.stdout, proc.stderr)
    return proc.stdout if exit_code == 0 else proc.stderr


def test_token_deploy_invoke_and_jobs_through_the_cli(broker_server: BrokerServer) -> None:
    deploy_token = _firepool(broker_server, "token", "--caller", "cli-dev", "--role", "deploy")
    deploy_token = deploy_token.strip().splitlines()[-1]
    out = _firepool(
        broker_server,
        "deploy",
        str(EXAMPLES / "rollout"),
        "--name",
        "cli-rollout",
        "--sku",
        "cpu",
        "--entrypoint",
        "rollout:rollout",
        token=deploy_token,
    )
    assert json.loads(out)["name"] == "cli-rollout"
    token = _firepool(broker_server, "token", "--caller", "cli-user").strip().splitlines()[-1]
    job = json.loads(
        _firepool(
            broker_server,
            "invoke",
            "cli-rollout",
            "--input",
            '{"seed": 3}',
            "--tag",
            "t1",
            token=token,
        )
    )
    assert job["state"] == "SUCCEEDED" and job["output"]["steps"] > 0
    listed = json.loads(_firepool(broker_server, "jobs", "--json", token=token))
    assert job["id"] in {j["id"] for j in listed}
    one = json.loads(_firepool(broker_server, "jobs", job["id"], token=token))
    assert one["output"] == job["output"]
    # Every invoke option of the API, and a retried call with one idempotency key is one job.
    options = ("--priority", "5", "--timeout", "20", "--idempotency-key", "cli-k1", "--async")
    first = _firepool(broker_server, "invoke", "cli-rollout", *options, token=token)
    again = _firepool(broker_server, "invoke", "cli-rollout", *options, token=token)
    assert first == again
    queued = json.loads(_firepool(broker_server, "jobs", first.strip(), token=token))
    assert (queued["priority"], queued["timeout_s"]) == (5, 20.0), queued
    # Show one function, then delete it.
    shown = json.loads(_firepool(broker_server, "functions", "cli-rollout", token=token))
    assert shown["name"] == "cli-rollout" and shown["owner"] == "cli-dev"
    deleted = _firepool(broker_server, "functions", "cli-rollout", "--delete", token=deploy_token)
    assert json.loads(deleted) == {"deleted": "cli-rollout"}
    gone = _firepool(broker_server, "invoke", "cli-rollout", token=token, exit_code=2)
    assert gone.startswith("error: 404 NotFound"), gone


def test_logs_follow_prints_each_chunk_as_it_comes_byte_for_byte(
    broker_server: BrokerServer,
) -> None:
    """``firepool logs --follow`` prints each chunk as the job writes it (not once the job
    ended), bytes that are not UTF-8 as they are (not as U+FFFD), and nothing else on stdout:
    how the job ended goes to stderr."""
    with broker_server.client("cli-logs-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="cli-ticker", sku="cpu",
                  entrypoint="behaviours:ticker_undecodable")  # fmt: skip
    with broker_server.client("cli-logs") as fp:
        job_id = fp.submit("cli-ticker", 8)
        token = broker_server.token("cli-logs", Role.INVOKE)
        env = dict(os.environ, FIREPOOL_URL=broker_server.url, FIREPOOL_TOKEN=token)
        # Unbuffered: ``communicate`` with a timeout reads the pipe's fd itself, so whatever a
        # buffered ``readline`` had read past the first line would be lost to the test.
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "logs", job_id, "--follow"],
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            state_at_first_line = fp.job(job_id)["state"]
            rest, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert state_at_first_line == "RUNNING"
    assert proc.returncode == 0
    assert first + rest == b"".join(b"\xff\xfe tick %d\n" % i for i in range(8))
    assert err == f"job {job_id} SUCCEEDED (exit code 0)\n".encode()


def test_an_unreachable_gateway_and_bad_input_exit_2_with_one_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["--url", url, "--token", "t", "functions"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: no answer from the gateway at {url} (ConnectError"), err
    assert err.count("\n") == 1
    assert main(["--url", url, "--token", "t", "invoke", "noop", "--input", "{bad"]) == 2
    assert capsys.readouterr().err.startswith("error: --input is not JSON: ")
    assert main(["--url", url, "--token", "t", "functions", "--delete"]) == 2
    assert capsys.readouterr().err == "error: --delete needs the function's NAME\n"
    monkeypatch.delenv("FIREPOOL_TOKEN", raising=False)
    assert main(["--url", url, "functions"]) == 2
    assert capsys.readouterr().err.startswith("error: no token: set FIREPOOL_TOKEN or --token")


def test_the_demo_runs_the_example_loop_end_to_end(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    env = dict(os.environ, FIREPOOL_HOME=str(home))
    port = free_port()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "examples.run_demo", "--once", "--port", str(port)],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        kill_pods(home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "path=warm" in proc.stdout
    assert "alice starts a new episode" in proc.stdout
    assert "acquisition paths:" in proc.stdout
    assert "curl" in proc.stdout
    # The hint names the broker it started (not :8080 whatever PORT is).
    assert f"export FIREPOOL_URL=http://127.0.0.1:{port} FIREPOOL_HOME={home}\n" in proc.stdout


def _live_pods(home: Path) -> list[str]:
    """The pods under ``home`` whose launcher runs (a record has no pid until it is spawned)."""
    pids = {r.stem: json.loads(r.read_text()).get("pid") for r in (home / "pods").glob("*.json")}
    return sorted(name for name, pid in pids.items() if isinstance(pid, int) and pid_alive(pid))


def test_down_refuses_while_a_broker_serves_the_home_and_counts_running_pods(
    tmp_path: Path,
) -> None:
    """``down`` under a running broker would kill the pods of running jobs (their user code
    would run again on new pods the broker makes at once); it counts running pods, not
    records, so a repeated ``down`` says there are none."""
    home = tmp_path / "home"
    server = start_broker(home)
    down = [sys.executable, "-m", "gateway.cli", "down"]
    env = {**os.environ, "FIREPOOL_HOME": str(home)}

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*down, *extra], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=60)  # fmt: skip

    try:
        deadline = time.monotonic() + 60
        while not (pods := _live_pods(home)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the default catalog's floor pod, made once the broker is ready
        assert pods
        refused = run()
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused
        assert refused.stderr.startswith(
            f"error: a broker (pid {server.proc.pid}) is serving FIREPOOL_HOME={home}: "
        ), refused.stderr
        assert "stop the broker first (Ctrl-C), or pass --force" in refused.stderr
        assert _live_pods(home) == pods, "a refused down stops nothing"
        forced = run("--force")
        assert forced.returncode == 0 and forced.stdout.startswith("stopped "), forced
        assert not set(_live_pods(home)) & set(pods)
        server.stop()
        after = run()  # the pods the broker made after the forced down, if any
        assert after.returncode == 0 and not _live_pods(home), after
        again = run()
        assert again.returncode == 0, again
        assert again.stdout == f"no running pods under {home / 'pods'}\n"
    finally:
        server.stop()
        kill_pods(home)


def test_a_relative_state_directory_works(tmp_path: Path) -> None:
    """``make run`` uses ./.firepool: pods must not inherit a path relative to the broker."""
    env = dict(os.environ, FIREPOOL_HOME=".firepool-rel")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    home = tmp_path / ".firepool-rel"
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, home / "broker.log")
        server = BrokerServer(
            url=f"http://127.0.0.1:{port}",
            home=home,
            proc=proc,
            auth=Authenticator(load_or_create_key(home / "signing.key")),
        )
        with server.client("rel-dev", Role.DEPLOY) as fp:
            fp.deploy(EXAMPLES / "noop", name="noop", sku="cpu", entrypoint="noop:noop")
        with server.client("rel-user") as fp:
            job = fp.wait(fp.submit("noop", 5), timeout_s=30)
            assert job["state"] == "SUCCEEDED" and job["output"] == 5
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        kill_pods(home)


def test_firepool_simulate_takes_its_own_options() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "simulate",
            "--venue",
            "h200",
            "--workload",
            "w-agent",
            "--arms",
            "reuse-on,fresh",
            "--repeats",
            "1",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result["arms"]) == {"reuse-on", "fresh"}
    assert result["arms"]["reuse-on"]["makespan_median_s"] > 0


def test_serve_with_a_bad_catalog_exits_2_naming_the_file_and_the_field(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("pools:\n  cpu: {max_count: 4, min_count: 6}\n")
    env = dict(os.environ, FIREPOOL_HOME=str(tmp_path / "home"), FIREPOOL_CATALOG=str(catalog))
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "serve"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {catalog}: pool 'cpu': the floor min_count (6) is above the ceiling max_count (4)"
    )


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["deploy", "{nonutf8}", "--name", "x", "--sku", "cpu", "--entrypoint", "m:f"], {},
         "is not a UTF-8 file name"),
        (["deploy", "{code}", "--name", "x", "--sku", "cpu", "--requirements", "/nonexistent"],
         {}, "No such file or directory: /nonexistent"),
        (["invoke", "x", "--idempotency-key", "é"], {}, "an Idempotency-Key is printable ASCII"),
        (["invoke", "x", "--input", "123456789012345678901234567890"], {},
         "the request cannot be sent as JSON"),
        (["jobs"], {"FIREPOOL_TOKEN": "é"}, "the token has characters no HTTP header can carry"),
        (["jobs"], {"FIREPOOL_URL": "http://[::1"}, "is not a URL"),
        (["serve", "--port", "{port}"], {"FIREPOOL_RESULT_RETENTION_S": "abc"},
         "FIREPOOL_RESULT_RETENTION_S must be a number of seconds >= 0, not 'abc'"),
        (["serve", "--port", "{port}"], {"FIREPOOL_CATALOG": "/nonexistent.yaml"},
         "No such file or directory: /nonexistent.yaml"),
        (["serve", "--port", "{busy}"], {}, "cannot listen on 127.0.0.1:"),
        (["token", "--caller", " "], {}, "--caller must name someone"),
    ],
    ids=["non-utf8-name", "missing-requirements", "non-ascii-key", "wide-integer",
         "non-ascii-token", "bad-url", "retention-not-a-number", "missing-catalog", "port-in-use",
         "empty-caller"],
)  # fmt: skip
def test_bad_local_input_exits_2_with_one_error_line(
    argv: list[str], env: dict[str, str], says: str, tmp_path: Path, broker_server: BrokerServer
) -> None:
    """Each is a refused request: exit 2 with one ``error:`` line (README), not a Python
    traceback and exit 1."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "m.py").write_text("def f(x):\n    return x\n")
    nonutf8 = tmp_path / "nonutf8"
    nonutf8.mkdir()
    (nonutf8 / os.fsdecode(b"bad\xff.py")).write_text("")
    busy = broker_server.url.rsplit(":", 1)[1]
    values = {"code": str(code), "nonutf8": str(nonutf8), "port": str(free_port()), "busy": busy}
    token = broker_server.token("cli-bad", Role.DEPLOY)
    full = {**os.environ, "FIREPOOL_HOME": str(tmp_path / "home"),
            "FIREPOOL_URL": broker_server.url, "FIREPOOL_TOKEN": token, **env}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *(a.format(**values) for a in argv)],
        env=full, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    kill_pods(tmp_path / "home")
    assert proc.returncode == 2, proc
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "argv",
    [["serve", "--port", "83740"], ["token", "--caller", "a", "--ttl", "-5"],
     ["invoke", "x", "--timeout", "nan"], ["deploy", ".", "--name", "x", "--sku", "cpu",
     "--env", "FOO"]],
    ids=["port-past-65535", "negative-ttl", "nan-timeout", "env-without-value"],
)  # fmt: skip
def test_out_of_range_options_are_refused_by_the_parser(argv: list[str]) -> None:
    """Refused before anything runs: ``serve --port 83740`` (the port would wrap to 18204),
    ``token --ttl -5`` (a token already expired), ``--timeout nan`` (it would go as null: the
    default), ``--env FOO`` (no value)."""
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
