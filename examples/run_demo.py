"""``make run``: start the broker on the embedded default, deploy the examples, run the agent
loop, then keep serving until interrupted.

Everything is local: SQLite job store, local package store and local pods under
``$FIREPOOL_HOME`` (default ./.firepool). Ctrl-C, SIGTERM and SIGHUP (a closed terminal) all
stop the demo the same way: the broker drains and stops, then its pods are stopped, so nothing
of the demo is left running. The broker runs in its own process group (a terminal's signals
reach the demo alone, which stops it once), and is sent SIGTERM should the demo die without
stopping it (SIGKILL).

Where pods cannot be sandboxed (no bubblewrap), the demo's broker opts in to unsandboxed pods
for this single-user broker, unless ``FIREPOOL_ALLOW_UNSANDBOXED`` says otherwise, and says so
first: every job runs as this user and could read the broker's signing key and job store.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import NoReturn

import httpx

from broker.exclusive import BrokerLocks
from broker.pod_isolation import check_pod_isolation
from broker.settings import Settings, private_home
from examples import agent_loop
from functions.errors import Conflict, InvalidRequest
from functions.sdk import Client
from gateway.auth import Authenticator, Role, load_key
from gateway.harness import kill_pods
from pool_manager.backends.local import pid_alive

HERE = Path(__file__).parent
FUNCTIONS = {
    "verifier": "verifier:verify",
    "rollout": "rollout:rollout",
    "noop": "noop:noop",
}


def refuse(why: str) -> NoReturn:
    """One ``error:`` paragraph on stderr and exit 2, as ``firepool`` refuses."""
    sys.stderr.write(f"error: {why}\n")
    raise SystemExit(2)


class Stop(Exception):
    """A signal (SIGTERM, SIGHUP) asked the demo to stop, as Ctrl-C does."""


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP stop the demo as Ctrl-C does; once one came, every further one is
    ignored, so the broker's drain and the pods' stop are not cut short."""

    def stop(signum: int, frame: FrameType | None) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def die_with_parent() -> None:
    """In the broker's process, before exec: SIGTERM it when the demo dies, even by SIGKILL
    (Linux's parent-death signal), so no broker is left serving without its demo."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1


def refuse_a_second_broker(home: Path) -> None:
    """Exit 2 naming the other broker's pid if one serves ``home`` already."""
    lock = BrokerLocks(home, store_url="")
    try:
        lock.acquire_home()
    except Conflict as exc:
        refuse(exc.message)
    finally:
        lock.release()


def broker_output(log_path: Path, since: int) -> str:
    """What the broker wrote to its log from byte ``since`` (its refusal, say), indented."""
    with log_path.open("rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace").strip()
    return "\n".join("  " + line for line in text.splitlines()[-20:])


def wait_ready(
    url: str, proc: subprocess.Popen[bytes], log_path: Path, since: int, timeout: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            refuse(
                f"the broker exited with {proc.returncode} before it was ready; it said "
                f"(in {log_path}):\n{broker_output(log_path, since)}"
            )
        try:
            if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    refuse(f"the broker did not become ready within {timeout:.0f} s; see {log_path}")


def unsandboxed_warning(settings: Settings, env: dict[str, str]) -> str | None:
    """Where pods cannot be sandboxed: the warning to print, the demo's broker opted in
    (``env``) unless the operator set ``FIREPOOL_ALLOW_UNSANDBOXED`` (to 0: it refuses, and
    the demo shows its refusal). None where every job is sandboxed."""
    chosen = ALLOW_ENV in os.environ
    try:
        warning = check_pod_isolation(
            settings if chosen else replace(settings, allow_unsandboxed=True)
        )
    except InvalidRequest:
        return None  # the broker refuses with the same words; ``wait_ready`` shows them
    if warning is not None and not chosen:
        env[ALLOW_ENV] = "1"
        warning += (
            f" (The demo opted in for its own broker, on this machine; {ALLOW_ENV}=0 makes it "
            "refuse instead.)"
        )
    return warning


ALLOW_ENV = "FIREPOOL_ALLOW_UNSANDBOXED"


def banner(text: str) -> str:
    rule = "!" * 100
    return f"{rule}\n{textwrap.fill(text, 100)}\n{rule}"


def stop(proc: subprocess.Popen[bytes], home: Path | None, drain_s: float) -> None:
    """Stop the broker (SIGTERM: it stops taking jobs and lets running ones finish for
    ``drain_s``), then every pod under ``home`` (None: the broker never served it)."""
    if proc.poll() is None:
        print(f"stopping the broker (pid {proc.pid}) and its pods…", flush=True)
        proc.terminate()
        try:
            proc.wait(timeout=drain_s + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if home is not None:
        running = [r for r in (home / "pods").glob("*.json") if pid_alive(_pod_pid(r))]
        kill_pods(home)
        print(f"the broker is stopped, and {len(running)} pod(s) with it", flush=True)


def _pod_pid(record: Path) -> int:
    try:
        pid = json.loads(record.read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return -1
    return pid if isinstance(pid, int) else -1


def deploy_examples(url: str, token: str) -> None:
    with Client(url, token) as fp:
        for name, entrypoint in FUNCTIONS.items():
            fn = fp.deploy(
                HERE / "functions" / name, name=name, sku="cpu", entrypoint=entrypoint, timeout_s=60
            )
            print(f"deployed {name} v{fn['version']} ({fn['package_digest'][:12]}…)")


def try_it(url: str, home: Path) -> str:
    """What to paste to call the demo's broker: every command names its URL and state
    directory, so it reaches this broker from any shell (and a ``make run PORT=…``'s)."""
    return (
        "\nThe broker keeps serving. Try it (from this directory):\n"
        f"  export FIREPOOL_URL={shlex.quote(url)} FIREPOOL_HOME={shlex.quote(str(home))}\n"
        "  export FIREPOOL_TOKEN=$(.venv/bin/firepool token --caller me | tail -1)\n"
        '  curl -s -X POST "$FIREPOOL_URL/v1/functions/noop:invoke" \\\n'
        '    -H "Authorization: Bearer $FIREPOOL_TOKEN" -d \'{"input": {"hello": 1}}\'\n'
        "  .venv/bin/firepool invoke rollout --input '{\"seed\": 7}' --tag mine\n"
        "Ctrl-C (or SIGTERM, SIGHUP) stops the broker and its pods."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--once", action="store_true", help="stop the broker after the loop")
    args = parser.parse_args()
    url = f"http://{args.host}:{args.port}"
    try:
        settings = Settings.from_env()
    except InvalidRequest as exc:
        refuse(exc.message)
    private_home(settings.home)
    refuse_a_second_broker(settings.home)
    try:
        httpx.get(f"{url}/healthz", timeout=0.5)
        refuse(f"something already listens on {url}; stop it or pass PORT=…")
    except httpx.HTTPError:
        pass

    env = dict(os.environ, FIREPOOL_HOME=str(settings.home))
    warning = unsandboxed_warning(settings, env)
    if warning is not None:
        print(banner(warning), flush=True)
    log_path = settings.home / "broker.log"
    print(
        f"starting the broker on {url} (state in {settings.home}/, log in {log_path})", flush=True
    )
    argv = [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--host",
        args.host,
        "--port",
        str(args.port),
    ]
    proc: subprocess.Popen[bytes] | None = None
    served = False
    stop_on_signals()
    try:
        with log_path.open("ab") as log:
            since = log.tell()
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=die_with_parent,
            )
        wait_ready(url, proc, log_path, since)
        served = True
        auth = Authenticator(load_key(settings.home / "signing.key"), settings.audience)
        deploy_examples(url, auth.mint("deployer", Role.DEPLOY))
        tokens = {c: auth.mint(c) for c in ("alice", "bob", "trainer")}
        counts = agent_loop.run(url, tokens)
        print(f"acquisition paths: {counts}")
        print(try_it(url, settings.home), flush=True)
        if warning is not None:
            print(banner(warning), flush=True)
        if not args.once:
            proc.wait()
            print(f"the broker exited with {proc.returncode}; see {log_path}", flush=True)
    except (KeyboardInterrupt, Stop):
        pass
    finally:
        for sig in STOP_SIGNALS:  # the stop below is bounded: nothing cuts it short
            signal.signal(sig, signal.SIG_IGN)
        if proc is not None:
            stop(proc, settings.home if served else None, settings.drain_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
