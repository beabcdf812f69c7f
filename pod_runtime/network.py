"""A sandboxed pod's network: ``none`` (its own namespace, only ``lo``) or ``outbound``
(its own namespace plus a user-mode stack, ``pasta``, that reaches the outside world).

Modes (a pool's ``network``):

* ``none``: bwrap ``--unshare-net``; the namespace holds only its own loopback. No address
  outside the pod can be reached, the host's loopback services (a database on 127.0.0.1)
  included.
* ``outbound``: the launcher (``python -m pod_runtime.network``) unshares a network
  namespace, has ``pasta`` (package ``passt``) attach to it from the host's namespace, and
  only once pasta has configured it (an interface with the host's address and default route,
  DNS through pasta) execs the sandbox inside it. pasta runs with ``--no-map-gw`` (the
  gateway address is not translated to the host's loopback) and with every port forward off
  (``-t none -u none -T none -U none``: no inbound ports, no namespace-to-host-loopback
  forwards). So a job opens TCP and UDP connections to any address the host itself could
  reach (the internet, a package index, other machines, the host's addresses other than the
  one the namespace takes over), but never the host's loopback (127.0.0.1, ::1) and never the
  host's primary address, which inside the namespace is the namespace's own. Nothing can
  connect in.
* ``host`` (only without a pool: ``agent_command(network=True)``, direct callers and tests):
  the host's network, shared.

pasta runs as root (``--runas 0``: as ``nobody``, its default drop, it may not enter a
namespace that root owns), in the pod's cgroup (the launcher joined it first, so deleting the
pod kills it) and writes its pid beside the pod's record (``pasta_pid_file``), outside the
pod's sight, for ``stop_pasta``.

Packages still arrive without the network: the agent fetches its http(s) package URLs through
the broker's fetch socket (``pool_manager.backends.package_proxy``) when the launcher gives it
one (``--fetch-socket``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

NetworkMode = Literal["none", "outbound", "host"]
NETWORK_MODES: tuple[str, ...] = ("none", "outbound", "host")
CLONE_NEWNET = 0x40000000
PASTA_TIMEOUT_S = 10.0
"""Longest the launcher waits for pasta to configure the namespace before the pod fails."""
PASTA_OPTIONS = (
    "--config-net",
    "--no-map-gw",
    "-t", "none", "-u", "none", "-T", "none", "-U", "none",
    "--runas", "0",
    "--quiet",
)  # fmt: skip
"""pasta's options besides its pid file and target (see the module docstring)."""


class NetworkUnavailable(RuntimeError):
    """The pool's network mode cannot be provided on this host (``pasta`` missing or
    failing); the message says what to install."""


@functools.cache
def outbound_status() -> tuple[bool, str]:
    """Whether ``outbound`` pods can be made here, and why (or why not)."""
    pasta = shutil.which("pasta")
    if pasta is None:
        return False, (
            "network: outbound needs pasta, which is not installed (Debian/Ubuntu: "
            "apt-get install passt)"
        )
    return True, pasta


def pasta_pid_file(pod_dir: Path) -> Path:
    """Where the pod's pasta writes its pid: beside the pod's record, out of the pod's sight."""
    return pod_dir.with_name(pod_dir.name + ".pasta.pid")


def stop_pasta(pod_dir: Path) -> None:
    """SIGKILL the pod's pasta, if its pid file names a live pasta. Safe when there is none."""
    path = pasta_pid_file(pod_dir)
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return
    with contextlib.suppress(OSError):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if cmdline.split(b"\0", 1)[0].endswith(b"pasta"):
            os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)


def launcher_argv(pod_dir: Path, python: str = sys.executable) -> list[str]:
    """The argv prefix that runs what follows it in a fresh network namespace configured by
    pasta (``outbound``); ``NetworkUnavailable`` when pasta is missing."""
    ok, why = outbound_status()
    if not ok:
        raise NetworkUnavailable(why)
    return [python, "-P", "-m", "pod_runtime.network", str(pasta_pid_file(pod_dir)), "--"]


def _unshare_net() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")


def launch(pid_file: Path, argv: Sequence[str]) -> None:
    """Unshare a network namespace, have pasta configure it from the host's, exec ``argv``.

    A child forked before the unshare stays in the host's namespace, waits until this process
    has its new namespace, runs pasta against it (pasta daemonizes once the namespace is
    configured) and exits with pasta's status; this process reaps it, so nothing is left a
    zombie, and execs only on success. Exits 3 with a message on stderr otherwise."""
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # the host's namespace
        os.close(ready_w)
        os.read(ready_r, 1)
        # pasta drops its capabilities before it opens the namespace, and then may not open
        # another root process's: it gets the one opened here, as its own descriptor.
        netns = os.open(f"/proc/{os.getppid()}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        cmd = [shutil.which("pasta") or "pasta", *PASTA_OPTIONS, "-P", str(pid_file)]
        cmd += ["--netns", f"/proc/self/fd/{netns}", "--netns-only"]
        try:
            done = subprocess.run(
                cmd,
                timeout=PASTA_TIMEOUT_S,
                check=False,
                stdin=subprocess.DEVNULL,
                pass_fds=(netns,),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"firepool network: pasta failed: {exc!r}", file=sys.stderr)
            os._exit(3)
        os._exit(0 if done.returncode == 0 else 3)
    os.close(ready_r)
    try:
        _unshare_net()
    except OSError as exc:
        print(f"firepool network: {exc}", file=sys.stderr)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        sys.exit(3)
    os.write(ready_w, b"x")
    os.close(ready_w)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        print("firepool network: pasta could not configure the pod's namespace", file=sys.stderr)
        sys.exit(3)
    os.execvp(argv[0], list(argv))


def main(args: Sequence[str]) -> None:
    """``python -m pod_runtime.network PID_FILE -- ARGV...``"""
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m pod_runtime.network PID_FILE -- ARGV...", file=sys.stderr)
        sys.exit(2)
    launch(Path(args[0]), args[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
