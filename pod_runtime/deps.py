"""Incremental dependencies keyed by the requirements file's sha256 (paper §4, A.2).

Where: a per-pod target directory ``DIR/cache/site`` that each job gets on ``sys.path`` ahead
of its package. Installing into the pod's shared interpreter (the base image's venv) would be
the paper's choice inside a container, but here local pods share one venv with the broker and
with each other, so a pod writes only below its own directory (the sandbox enforces it).

Marker protocol: before every install remove every marker; run ``uv pip install --target``
(falling back to ``python -m pip install --target`` when uv is missing); write the marker
``.firepool-requirements-<sha256>`` only after a clean exit. So at most one marker exists,
naming the last pin set installed completely; the same digest again installs nothing; going
back to an earlier pin set reinstalls it. Installs add and upgrade, never uninstall.

Event-loop only; one install at a time (the agent runs one attempt at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path

from functions.errors import ErrorClass, FirepoolError
from pod_runtime import jobuser, spawner
from pod_runtime.jobenv import AGENT_PRIVATE_PREFIXES
from pod_runtime.package import BlobCache
from pod_runtime.protocol import BlobRef

MARKER_PREFIX = ".firepool-requirements-"
LOG_TAIL_BYTES = 4000


class DependencyInstallFailed(FirepoolError):
    error_class = ErrorClass.DEPENDENCY_INSTALL_FAILED


def find_uv(python: str) -> str | None:
    """uv next to the interpreter (a venv's bin/), else on PATH."""
    beside = Path(python).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("uv")


INSTALL_TIMEOUT_S = 900.0
"""A requirements install that runs longer fails the attempt (the installer is killed). It is
not part of the job's ``timeout_s``, which starts at the job's process; the broker waits this
much longer for an attempt of a function with requirements (``broker.executor``)."""


class Dependencies:
    """Installs requirements for one pod into ``site``; see the module docstring."""

    def __init__(
        self,
        site: Path,
        cache_dir: Path,
        *,
        python: str,
        blobs: BlobCache,
        reaper: spawner.Reaper | None,
        use_uv: bool = True,
        job_uid: int | None = None,
    ) -> None:
        self.site = site
        self.job_uid = job_uid
        """Install as this uid (``pod_runtime.jobuser``); the result is made root's after."""
        self.cache_dir = cache_dir
        self.python = python
        self.blobs = blobs
        self.reaper = reaper
        self.uv = find_uv(python) if use_uv else None
        self.site.mkdir(parents=True, exist_ok=True)

    def _installer_paths(self) -> list[Path]:
        """What an install writes: the target and the installers' caches (not the rest of
        ``cache_dir``: the verified packages there stay root's)."""
        paths = [self.site, self.cache_dir / "uv", self.cache_dir / "pip"]
        for path in paths:
            path.mkdir(parents=True, exist_ok=True)
        return paths

    def marker(self, digest: str) -> Path:
        return self.site / f"{MARKER_PREFIX}{digest}"

    def installed(self) -> str | None:
        """Digest of the last pin set installed completely, if any."""
        for entry in self.site.iterdir():
            if entry.name.startswith(MARKER_PREFIX):
                return entry.name[len(MARKER_PREFIX) :]
        return None

    def _argv(self, requirements: Path) -> list[str]:
        if self.uv is not None:
            return [
                self.uv,
                "pip",
                "install",
                "--python",
                self.python,
                "--target",
                str(self.site),
                "-r",
                str(requirements),
            ]
        return [
            self.python,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--upgrade",
            "--target",
            str(self.site),
            "-r",
            str(requirements),
        ]

    async def ensure(self, ref: BlobRef, log: Path) -> Path:
        """Make ``site`` hold ``ref``'s pins; return ``site``. Raises DependencyInstallFailed."""
        if self.marker(ref.digest).exists():
            return self.site
        try:
            requirements, _ = await self.blobs.get(ref)
        except FirepoolError as exc:
            raise DependencyInstallFailed(f"requirements file: {exc.message}") from exc
        self._clear_markers()
        install_log = log.with_name("install.log")
        # Not the agent's own variables (its secret): an install runs the caller's build code.
        env = {k: v for k, v in os.environ.items() if not k.startswith(AGENT_PRIVATE_PREFIXES)}
        env.update(
            {
                "UV_CACHE_DIR": str(self.cache_dir / "uv"),
                "PIP_CACHE_DIR": str(self.cache_dir / "pip"),
                "UV_NO_PROGRESS": "1",
            }
        )
        if self.reaper is None:
            raise DependencyInstallFailed("no process reaper")
        argv = jobuser.as_job_user(self._argv(requirements), self.job_uid, self.python)
        if self.job_uid is not None:  # the install is the user's code too: never root's
            env["HOME"] = str(self.cache_dir / "pip")
            for path in self._installer_paths():
                await asyncio.to_thread(jobuser.hand_over_tree, path, self.job_uid)
        pid = spawner.spawn_process(argv, env, log=install_log, reaper=self.reaper)
        try:
            code = await self.reaper.wait(pid)
        except asyncio.CancelledError:  # cancelled attempt: stop the installer's session too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            raise
        finally:
            if self.job_uid is not None:  # kept for later jobs, which must not rewrite it
                for path in self._installer_paths():
                    await asyncio.to_thread(jobuser.take_back, path)
        output = install_log.read_bytes() if install_log.exists() else b""
        with log.open("ab") as out:
            out.write(b"[firepool] installing requirements " + ref.digest.encode() + b"\n")
            out.write(output)
        if code != 0:
            tail = output[-LOG_TAIL_BYTES:].decode("utf-8", "replace")
            raise DependencyInstallFailed(f"install exited with code {code}: {tail}")
        self._clear_markers()  # the install's own code may have planted some
        self.marker(ref.digest).touch()
        return self.site

    def _clear_markers(self) -> None:
        for entry in list(self.site.iterdir()):
            if entry.name.startswith(MARKER_PREFIX):
                entry.unlink(missing_ok=True)
