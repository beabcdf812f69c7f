"""The floor of a warm call: a minimal HTTP server that forks the pod's zygote and answers.

``benchmarks.invoke`` starts this in the same bubblewrap sandbox a pod gets
(``pod_runtime.launch``) and sends it the same no-op calls it sends the broker. Each
``POST /invoke`` with ``{"input": ...}`` writes the input file, hands the job's config to the
pod runtime's own zygote (``pod_runtime.spawner.ZygoteClient``: the preloaded interpreter, a
spare child forked ahead while idle, ``pod_runtime.job_main``'s setup and seccomp filter),
waits for its exit through the pod runtime's ``Reaper``, reads the result file and answers
it. No queue, no store, no lease, no package extraction (the package is copied into the
package directory once, at start) and no reset: what is left is the work every warm call
must do, so a warm call's time is reported beside this one's.

    python -P -m benchmarks.floor_server --pod-dir DIR --port P --package DIR --preload a,b

Prints ``ready`` on stdout once it listens. One call at a time (a lock), like one pod.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from pod_runtime.jobenv import preload_list
from pod_runtime.spawner import Reaper, ZygoteClient


class FloorServer:
    """The zygote, the reaper and a counter of calls; ``invoke`` runs one call at a time."""

    def __init__(self, pod_dir: Path, entrypoint: str, zygote: ZygoteClient) -> None:
        self.pod_dir = pod_dir
        self.pkg = pod_dir / "workspace" / "pkg"
        self.entrypoint = entrypoint
        self.zygote = zygote
        self.calls = 0
        self.lock = asyncio.Lock()

    async def invoke(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        async with self.lock:
            self.calls += 1
            attempt = self.pod_dir / "attempts" / str(self.calls)
            attempt.mkdir(parents=True)
            files = {
                "input": str(attempt / "input.json"),
                "result": str(attempt / "result.json"),
                "first_instruction": str(attempt / "first_instruction"),
            }
            Path(files["input"]).write_bytes(orjson.dumps(body.get("input")))
            cfg: dict[str, Any] = {
                **files,
                "entrypoint": self.entrypoint,
                "command": None,
                "pkg_dir": str(self.pkg),
                "sys_path": [],
                "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": "/tmp"},
                "log": str(attempt / "log"),
                "cgroup_procs": None,
                "job_uid": None,
            }
            pid = await self.zygote.spawn(cfg)
            code = await self.zygote.reaper.wait(pid)
            result = orjson.loads(Path(files["result"]).read_bytes())
            await self.zygote.prefork(None)  # the spare for the next call, as an idle pod has
        status = 200 if code == 0 and result.get("ok") else 500
        return web.Response(
            body=orjson.dumps(result), status=status, content_type="application/json"
        )


async def serve(args: argparse.Namespace) -> None:
    pod_dir = Path(args.pod_dir).resolve()
    pkg = pod_dir / "workspace" / "pkg"
    pkg.mkdir(parents=True, exist_ok=True)
    shutil.copytree(args.package, pkg, dirs_exist_ok=True)
    reaper = Reaper(asyncio.get_running_loop())
    zygote = ZygoteClient(python=sys.executable, preload=preload_list(args.preload), reaper=reaper)
    await zygote.start()
    await zygote.prefork(None)
    floor = FloorServer(pod_dir, args.entrypoint, zygote)
    app = web.Application()
    app.router.add_post("/invoke", floor.invoke)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await zygote.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.floor_server", description=__doc__)
    parser.add_argument("--pod-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--package", required=True, help="directory copied into the package dir")
    parser.add_argument("--entrypoint", default="noop:noop")
    parser.add_argument("--preload", default="")
    args = parser.parse_args()
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
