"""The ``firepool`` CLI as a client of a real broker: where inputs come from, where the gateway
options go, what each exit status means, answers that are not the API's, the jobs table, a
big deploy's memory, and the effective timeout on the job record. In this process where the
command allows (``main``), as a subprocess where the process itself is what is measured."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
import pytest

from functions.errors import Unauthorized
from functions.packaging import package_digest
from gateway.auth import Authenticator, Role
from gateway.cli import main
from gateway.harness import REPO, BrokerServer
from tests.conftest import BEHAVIOURS

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _no_gateway_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command names its gateway and token on the command line."""
    monkeypatch.delenv("FIREPOOL_URL", raising=False)
    monkeypatch.delenv("FIREPOOL_TOKEN", raising=False)


@pytest.fixture(scope="module")
def deployed(broker_server: BrokerServer) -> BrokerServer:
    """The broker with ``behaviours`` deployed as ``cli-echo`` (timeout 45 s), ``cli-fail``
    and ``cli-exit3`` (never retried)."""
    with broker_server.client("cli-owner", Role.DEPLOY) as fp:
        fp.deploy(EXAMPLES_NOOP, name="cli-echo", sku="cpu", entrypoint="noop:noop", timeout_s=45)
        for name, entrypoint in (("cli-fail", "fail"), ("cli-exit3", "exit3")):
            fp.deploy(BEHAVIOURS, name=name, sku="cpu", entrypoint=f"behaviours:{entrypoint}",
                      max_retries=0)  # fmt: skip
    return broker_server


EXAMPLES_NOOP = REPO / "examples" / "functions" / "noop"


def _gateway(server: BrokerServer, caller: str = "cli-client") -> list[str]:
    return ["--url", server.url, "--token", server.token(caller)]


def test_input_comes_from_a_file_with_at_or_from_stdin_with_a_dash(
    deployed: BrokerServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An input past the argument limit (128 KiB per argument on Linux) travels as a file."""
    big = {"text": "x" * 300_000, "n": 7}
    path = tmp_path / "input.json"
    path.write_text(json.dumps(big))
    assert main(["invoke", "cli-echo", "--input", f"@{path}", *_gateway(deployed)]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == big
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"from": "stdin"}')))
    assert main(["invoke", "cli-echo", "--input", "-", *_gateway(deployed)]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == {"from": "stdin"}


@pytest.mark.parametrize(
    ("content", "says"),
    [(None, "No such file or directory: {path}"), (b"{bad", "error: --input (@{path}) is not JSON"),
     (b"\xff\xfe", "error: --input (@{path}) is not JSON")],
    ids=["missing", "not-json", "not-utf8"],
)  # fmt: skip
def test_a_bad_input_file_is_one_error_line_and_exit_2(
    content: bytes | None, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "input.json"
    if content is not None:
        path.write_bytes(content)
    argv = ["invoke", "x", "--input", f"@{path}", "--url", "http://127.0.0.1:9", "--token", "t"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert says.format(path=path) in err, err


def test_gateway_options_are_taken_before_or_after_the_command(
    deployed: BrokerServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url, token = deployed.url, deployed.token("cli-options")
    wrong = "http://127.0.0.1:9"
    for argv in (["--url", url, "--token", token, "functions"],
                 ["functions", "--url", url, "--token", token],
                 ["--url", url, "functions", "--token", token],
                 ["--url", wrong, "functions", "--url", url, "--token", token]):  # fmt: skip
        assert main(argv) == 0, (argv, capsys.readouterr().err)
        names = {f["name"] for f in json.loads(capsys.readouterr().out)}
        assert "cli-echo" in names, argv


def test_help_documents_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["invoke", "--help"], ["logs", "--help"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert "exit status:\n  0  done; for invoke and logs --follow, the job SUCCEEDED\n" in out
        assert "  1  the job FAILED or was CANCELLED (invoke, logs --follow)\n" in out
        assert "  2  refused or unreachable: " in out


def test_exit_0_for_success_1_for_a_failed_job_2_for_a_refusal(
    deployed: BrokerServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["invoke", "cli-echo", "--input", "1", *_gateway(deployed)]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "SUCCEEDED"
    assert main(["invoke", "cli-fail", *_gateway(deployed)]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["class"] == "FunctionError"
    assert main(["invoke", "no-such-function", *_gateway(deployed)]) == 2
    assert capsys.readouterr().err.startswith("error: 404 NotFound: ")


def _follow(server: BrokerServer, job_id: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIREPOOL_")}
    argv = ["logs", job_id, "--follow", *_gateway(server)]
    return subprocess.run([sys.executable, "-m", "gateway.cli", *argv], env=env, cwd=REPO,
                          capture_output=True, timeout=60)  # fmt: skip


def test_logs_follow_ends_with_how_the_job_ended_and_exits_as_invoke_does(
    deployed: BrokerServer,
) -> None:
    with deployed.client("cli-client") as fp:
        failed = fp.submit("cli-exit3", None)
        succeeded = fp.submit("cli-echo", 1)
    done = _follow(deployed, failed)
    assert done.returncode == 1, done
    assert done.stderr.decode() == (
        f"job {failed} FAILED: NonZeroExit: the process exited with code 3 (exit code 3)\n"
    )
    done = _follow(deployed, succeeded)
    assert done.returncode == 0, done
    assert done.stderr.decode() == f"job {succeeded} SUCCEEDED (exit code 0)\n"


def test_jobs_prints_a_table_and_json_with_the_flag(
    deployed: BrokerServer, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway = _gateway(deployed, "cli-table")
    assert main(["invoke", "cli-echo", "--input", "2", *gateway]) == 0
    job = json.loads(capsys.readouterr().out)
    assert main(["jobs", *gateway]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["ID", "FUNCTION", "STATE", "PATH", "SUBMITTED", "DURATION"]
    assert len(rows) == 1
    cells = rows[0].split()
    assert cells[:5] == [job["id"], "cli-echo", "v1", "SUCCEEDED", job["acquisition"]["path"]]
    assert cells[-1].endswith("s")  # seconds it ran, e.g. 0.01s
    assert main(["jobs", "--json", *gateway]) == 0
    assert [j["id"] for j in json.loads(capsys.readouterr().out)] == [job["id"]]


class _NotTheGateway(BaseHTTPRequestHandler):
    """Another web server at the URL: an HTML page (200) for every GET, HEAD and POST, a 404
    page for the rest; with ``?json`` in the URL's path, JSON that is not the API's."""

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        status = 200 if self.command in ("GET", "HEAD", "POST") else 404
        body, kind = b"<!doctype html>\n<html><body><h1>Welcome</h1>\n</body></html>\n", "text/html"
        if "json" in self.path:
            body, kind = b'{"hello": "world"}', "application/json"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def other_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotTheGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("prefix", ["", "/json"], ids=["html", "other-json"])
@pytest.mark.parametrize(
    "argv",
    [["jobs"], ["jobs", "ID"], ["functions"], ["invoke", "x"], ["cancel", "ID"], ["logs", "ID"],
     ["pools"], ["deploy", str(BEHAVIOURS), "--name", "x", "--sku", "cpu", "--entrypoint", "m:f"]],
    ids=lambda argv: argv[0] + ("-one" if argv[1:2] == ["ID"] else ""),
)  # fmt: skip
def test_a_url_that_is_not_the_gateway_is_one_line_not_the_page(
    argv: list[str], prefix: str, other_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = other_server + prefix
    assert main([*argv, "--url", url, "--token", "t"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    says = "not the Firepool API: is that the gateway's URL? (--url or FIREPOOL_URL)\n"
    assert captured.err.endswith(says), captured.err
    assert "<html" not in captured.err and "hello" not in captured.err


KEY = b"k" * 32
CLAIMS = {"sub": "someone", "aud": "firepool", "exp": 2**31}


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("not-a-jwt", "malformed token: not a JSON Web Token"),
        ("a.b.c", "malformed token: not a JSON Web Token"),
        ("eyJhbGciOiJIUzI1NiJ9.e30", "malformed token: not a JSON Web Token"),
        (jwt.encode(CLAIMS, b"0" * 32, algorithm="HS256"),
         "bad token signature: not signed by this broker's key"),
        (jwt.encode(CLAIMS, None, algorithm="none"),
         "token algorithm not allowed (allowed: HS256)"),
        (jwt.encode({**CLAIMS, "exp": 1}, KEY, algorithm="HS256"), "token expired"),
        (jwt.encode({**CLAIMS, "aud": "other"}, KEY, algorithm="HS256"),
         "token for another audience"),
        (jwt.encode({"aud": "firepool", "exp": 2**31}, KEY, algorithm="HS256"),
         "token lacks the 'sub' claim"),
    ],
    ids=["not-a-jwt", "bad-segments", "two-segments", "forged", "alg-none", "expired",
         "audience", "no-subject"],
)  # fmt: skip
def test_a_refused_token_says_what_is_wrong_without_the_decoders_internals(
    token: str, says: str
) -> None:
    with pytest.raises(Unauthorized) as refused:
        Authenticator(KEY).authenticate(f"Bearer {token}")
    assert refused.value.message.startswith(says), refused.value.message
    for internal in ("segment", "padding", "Signature verification", "decode", "Invalid"):
        assert internal not in refused.value.message


def test_the_cli_shows_a_malformed_tokens_refusal_in_one_line(
    broker_server: BrokerServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["jobs", "--url", broker_server.url, "--token", "garbage"]) == 2
    assert capsys.readouterr().err == (
        "error: 401 Unauthorized: malformed token: not a JSON Web Token\n"
    )


def test_a_job_record_shows_the_timeout_that_applies(
    deployed: BrokerServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The call's ``timeout_s`` if it gave one, else the function's (45 s for ``cli-echo``)."""
    gateway = _gateway(deployed, "cli-timeout")
    assert main(["invoke", "cli-echo", *gateway]) == 0
    assert json.loads(capsys.readouterr().out)["timeout_s"] == 45.0
    assert main(["invoke", "cli-echo", "--timeout", "7", *gateway]) == 0
    assert json.loads(capsys.readouterr().out)["timeout_s"] == 7.0


PEAK_RSS = (
    "import sys\n"
    "from gateway.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "with open('/proc/self/status') as status:\n"
    "    print(next(line for line in status if line.startswith('VmHWM:')), file=sys.stderr)\n"
    "sys.exit(code)\n"
)
"""``firepool`` that prints its peak RSS (``VmHWM``, this program's own since its exec; a
child's ``ru_maxrss`` counts the forking test process's pages too)."""


def test_a_deploy_streams_the_package_instead_of_holding_it(
    broker_server: BrokerServer, tmp_path: Path
) -> None:
    """A 64 MiB package (incompressible) is built in a temporary file and uploaded from it in
    chunks: the deploying process's peak RSS stays below the package's size (held whole, it
    was at least three times that on top of the interpreter's ~40 MiB)."""
    code = tmp_path / "big"
    code.mkdir()
    (code / "m.py").write_text("def f(x):\n    return x\n")
    for i in range(4):
        (code / f"blob{i}.bin").write_bytes(os.urandom(16 * MiB))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIREPOOL_")}
    token = broker_server.token("cli-big", Role.DEPLOY)
    argv = ["deploy", str(code), "--name", "cli-big", "--sku", "cpu", "--entrypoint", "m:f",
            "--url", broker_server.url, "--token", token]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, *argv], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    peak_kib = int(proc.stderr.split("VmHWM:")[1].split()[0])
    assert peak_kib * 1024 < 64 * MiB, f"peak RSS {peak_kib // 1024} MiB"
    with broker_server.client("cli-big") as fp:
        registered = fp.describe_function("cli-big")
    assert registered["package_digest"] == package_digest(code)[0]
