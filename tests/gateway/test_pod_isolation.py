"""A job cannot see the broker's state nor rewrite what the broker knows of its pod (found by
an adversarial run: a job that rewrote its pod's record could, after a broker restart, have
its pod handed to another caller, and make a delete kill any process group it named).

The sandbox hides the broker's state directory (signing key, job store, packages, logs, other
pods and every pod's record), and a pod inherits only a whitelisted environment. Needs
bubblewrap: without it pods are plain processes, and this test says so as it skips.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.settings import private_home
from functions.sdk import Client
from gateway.auth import Role, load_or_create_key
from gateway.harness import BrokerServer, kill_pods, start_broker
from pod_runtime.cgroups import pod_cgroup_name
from tests.conftest import BEHAVIOURS, require_sandbox


@pytest.fixture(scope="module")
def server() -> Iterator[BrokerServer]:
    require_sandbox()
    # Not under /tmp, which every sandbox replaces anyway. The layout of a checkout in the
    # broker user's home run with the default state directory: $HOME/proj/.firepool, with
    # the checkout on the broker's sys.path (PYTHONPATH here), so the sandbox binds it back
    # inside the hidden $HOME, and must still hide the state directory inside it.
    base = Path(tempfile.mkdtemp(prefix="firepool-isolation-", dir="/var/tmp"))
    base.chmod(0o755)  # so the sandbox's host scan looks inside, at the two below
    (base / "root-only").write_text("canary")  # a root-only file: masked
    (base / "root-only").chmod(0o600)
    deep = base / "a" / "b" / "c"  # below the depth the host scan masks
    deep.mkdir(parents=True)
    (deep / "root-only").write_text('{"ok": true, "output": "canary"}')  # a result, if read
    (deep / "root-only").chmod(0o600)
    host_socket = socket.socket(socket.AF_UNIX)  # a host daemon's socket: masked
    host_socket.bind(str(base / "daemon.sock"))
    host_socket.listen()
    operator = base / "home"  # the broker user's $HOME
    (operator / ".aws").mkdir(parents=True)
    (operator / ".aws" / "credentials").write_text("canary")
    home = operator / "proj" / ".firepool"
    secrets = {
        "FIREPOOL_TOKEN": "canary-token",
        "AWS_SECRET_ACCESS_KEY": "canary-aws",
        "HOME": str(operator),
        "PYTHONPATH": str(home.parent),
    }
    server = start_broker(home, "pools:\n  cpu: {max_count: 2, tmpfs_mb: 64}\n", extra_env=secrets)
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="snoop", sku="cpu", entrypoint="behaviours:snoop")
            fp.deploy(BEHAVIOURS, name="read", sku="cpu", entrypoint="behaviours:read")
            fp.deploy(BEHAVIOURS, name="connect", sku="cpu", entrypoint="behaviours:connect")
            fp.deploy(BEHAVIOURS, name="tamper", sku="cpu", entrypoint="behaviours:tamper")
            fp.deploy(BEHAVIOURS, name="plant", sku="cpu", entrypoint="behaviours:plant_result")
        yield server
    finally:
        host_socket.close()
        server.stop()
        kill_pods(home)
        shutil.rmtree(base, ignore_errors=True)


def test_a_job_sees_only_its_own_pod_directory_and_none_of_the_operators_secrets(
    server: BrokerServer,
) -> None:
    with Client(server.url, server.token("snooper", Role.INVOKE)) as fp:
        job = fp.invoke("snoop", str(server.home), lease_tag="t")
        aws = fp.invoke("read", str(server.home.parent.parent / ".aws/credentials"), lease_tag="t")
    assert aws["state"] == "FAILED" and "No such file" in aws["error"]["message"], aws
    assert job["state"] == "SUCCEEDED", job
    pod = job["attempts"][-1]["pods"][0]
    seen = job["output"]
    assert seen["home"] == ["pods"], seen  # no signing.key, jobs.db, packages, logs
    assert seen["pods"] == [pod], seen  # no other pod, no pod's record
    assert seen["canaries"] == [], seen  # the broker's environment stayed with the broker
    # The host's root-only files read empty, its daemons' sockets refuse.
    base = server.home.parent.parent.parent
    assert (base / "root-only").read_text() == "canary"  # as the broker sees it
    with Client(server.url, server.token("snooper", Role.INVOKE)) as fp:
        hidden = fp.invoke("read", str(base / "root-only"), lease_tag="t")
        shadow = fp.invoke("read", "/etc/shadow", lease_tag="t")
        daemon = fp.invoke("connect", str(base / "daemon.sock"), lease_tag="t")
    assert hidden["output"] == "", (hidden["state"], hidden["error"])
    if Path("/etc/shadow").is_file():
        assert shadow["output"] == "", shadow
    assert daemon["output"].startswith("refused"), daemon
    # What the job wrote in its view changed nothing the broker keeps.
    record = json.loads((server.home / "pods" / f"{pod}.json").read_text())
    assert record["annotations"]["firepool/owner"] == "snooper", record
    assert not (server.home / "pods" / f"{pod}.json").read_text().startswith('{"annotations": {}')


def test_a_new_state_directory_is_private_and_an_open_one_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another broker's job store (0644 in a 0755 home) and packages were readable by any
    local user, and by jobs in pods (found by an adversarial run)."""
    home = tmp_path / "new" / "state"
    key = load_or_create_key(home / "signing.key")  # as ``firepool serve`` makes it
    assert home.stat().st_mode & 0o777 == 0o700
    assert (home / "signing.key").stat().st_mode & 0o777 == 0o600
    assert load_or_create_key(home / "signing.key") == key
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="firepool.broker"):
        private_home(shared)
    assert shared.stat().st_mode & 0o777 == 0o755, "an operator's directory is left as it is"
    assert "open to other users (mode 755)" in caplog.text


def test_processes_creating_the_signing_key_at_once_agree_on_one(tmp_path: Path) -> None:
    """Each wrote the same temporary file and replaced the key: 26 of 30 rounds of 8 such
    processes ended with callers holding another key than the file's (adversarial run)."""
    for round_ in range(5):
        path = tmp_path / f"home{round_}" / "signing.key"
        with multiprocessing.get_context("fork").Pool(8) as pool:
            keys = pool.map(load_or_create_key, [path] * 8)
        assert set(keys) == {bytes.fromhex(path.read_text())}, round_
        assert [p.name for p in path.parent.iterdir()] == ["signing.key"]  # no temporary left


def test_a_job_runs_as_an_unprivileged_uid_that_cannot_touch_its_agent(
    server: BrokerServer,
) -> None:
    """Jobs ran as the agent's uid 0: one could signal or replace its agent and zygote,
    rewrite the pod's installed dependencies for the caller's next session, and read any
    root-only file the host scan did not reach (deeper than three levels)."""
    if os.geteuid() != 0:
        pytest.skip("the broker is not root here: jobs run as its own uid")
    secret = server.home.parent.parent.parent / "a" / "b" / "c" / "root-only"
    with Client(server.url, server.token("tamperer", Role.INVOKE)) as fp:
        job = fp.invoke("tamper", str(secret), lease_tag="t")
        again = fp.invoke("tamper", str(secret), lease_tag="t")
        planted = fp.invoke("plant", str(secret), lease_tag="t")
    assert job["state"] == "SUCCEEDED", job
    seen, pod = job["output"], job["attempts"][-1]["pods"][0]
    assert seen["uid"] == 65534, seen
    assert seen["helpers"] == ["agent", "zygote"], seen
    assert seen["signal agent"] == seen["signal zygote"] == "PermissionError", seen
    assert seen["replace agent.sock"] == "PermissionError", seen
    assert seen["write site cache"] == "PermissionError", seen
    assert seen["read root-only"] == "PermissionError", seen
    own_cgroup = pod_cgroup_name(server.home / "pods" / pod)
    assert seen["pod cgroups"] in (None, [own_cgroup]), "no other pod's cgroup is in sight"
    assert seen["/tmp MiB"] == seen["/dev/shm MiB"] == 64, "the pool's tmpfs_mb, not half the RAM"
    wrote = {k: v for k, v in seen.items() if k.startswith("write ") and "cache" not in k}
    assert wrote == dict.fromkeys(wrote, "allowed") and len(wrote) == 5, wrote
    assert seen["update a shipped file"] == "allowed", "its package is its own to change"
    # Its own places were wiped by the reset, and handed to the next job again.
    assert again["acquisition"]["path"] == "warm" and again["output"] == seen, again
    # The agent reads what the job wrote without following a link it planted.
    assert planted["state"] == "FAILED", planted
    assert planted["output"] is None and "canary" not in json.dumps(planted), planted
