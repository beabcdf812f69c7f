"""``make run``: start the broker on the embedded default, deploy the examples, run the agent
loop, then keep serving until interrupted.

Everything is local: SQLite job store, local package store and local pods under
``$FIREPOOL_HOME`` (default ./.firepool).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from broker.settings import Settings, private_home
from examples import agent_loop
from functions.sdk import Client
from gateway.auth import Authenticator, Role, load_key

HERE = Path(__file__).parent
FUNCTIONS = {
    "verifier": "verifier:verify",
    "rollout": "rollout:rollout",
    "noop": "noop:noop",
}


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the broker exited with {proc.returncode}; see its log")
        try:
            if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the broker did not become ready within {timeout:.0f} s")


def deploy_examples(url: str, token: str) -> None:
    with Client(url, token) as fp:
        for name, entrypoint in FUNCTIONS.items():
            fn = fp.deploy(
                HERE / "functions" / name, name=name, sku="cpu", entrypoint=entrypoint, timeout_s=60
            )
            print(f"deployed {name} v{fn['version']} ({fn['package_digest'][:12]}…)")


def try_it(url: str, home: Path) -> str:
    """What to paste to call the demo's broker: every command names its URL and state
    directory, so it reaches this broker from any shell (``make run PORT=…`` printed a
    ``firepool invoke`` that talked to :8080: adversarial run)."""
    return (
        "\nThe broker keeps serving. Try it (from this directory):\n"
        f"  export FIREPOOL_URL={shlex.quote(url)} FIREPOOL_HOME={shlex.quote(str(home))}\n"
        "  export FIREPOOL_TOKEN=$(.venv/bin/firepool token --caller me | tail -1)\n"
        '  curl -s -X POST "$FIREPOOL_URL/v1/functions/noop:invoke" \\\n'
        '    -H "Authorization: Bearer $FIREPOOL_TOKEN" -d \'{"input": {"hello": 1}}\'\n'
        "  .venv/bin/firepool invoke rollout --input '{\"seed\": 7}' --tag mine\n"
        "Ctrl-C stops the broker; its warm pods keep running for the next start "
        "(`.venv/bin/firepool down` stops them once the broker is stopped)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--once", action="store_true", help="stop the broker after the loop")
    args = parser.parse_args()
    url = f"http://{args.host}:{args.port}"
    try:
        httpx.get(f"{url}/healthz", timeout=0.5)
        raise SystemExit(f"something already listens on {url}; stop it or pass PORT=…")
    except httpx.HTTPError:
        pass

    settings = Settings.from_env()
    env = dict(os.environ, FIREPOOL_HOME=str(settings.home))
    private_home(settings.home)
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
    with log_path.open("ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(url, proc)
        auth = Authenticator(load_key(settings.home / "signing.key"), settings.audience)
        deploy_examples(url, auth.mint("deployer", Role.DEPLOY))
        tokens = {c: auth.mint(c) for c in ("alice", "bob", "trainer")}
        counts = agent_loop.run(url, tokens)
        print(f"acquisition paths: {counts}")
        print(try_it(url, settings.home), flush=True)
        if not args.once:
            proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
