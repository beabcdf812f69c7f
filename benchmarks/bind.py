"""Late-binding cost at the pod agent (paper §4, §9.2, App. C.5; issue 5).

One local pod (sandboxed when bubblewrap works here) and a package of 200 files / 4 MB of
incompressible data served over real HTTP (``http.server`` on loopback). Medians of:

- ``bind_p50_ms``: a package the pod has never seen: fetch over HTTP + sha256 + safe
  extraction + job start, measured by the agent as ``first_instruction - started``
  (goal <= 50 ms); ``bind_e2e_p50_ms`` is the same job's HTTP round trip to the agent;
- ``bind_cached_p50_ms``: the same package again (verified cache, extraction + start);
- ``warm_noop_e2e_p50_ms``: round trip of a no-op job with no package (the agent's share of
  a warm invoke) after a 50 ms pause, and ``warm_noop_back_to_back_e2e_p50_ms`` with the next
  job sent right after the previous reset (the spare child may still be getting ready);
- ``deps_hit_ms``: ``Dependencies.ensure`` when the requirements marker is present
  (goal <= 5 ms), and ``deps_hit_e2e_delta_ms``, the round-trip difference it makes;
- ``zygote_start_p50_ms`` / ``exec_start_p50_ms``: round trip of a no-op job whose module
  imports numpy, on a pod with ``preload=[numpy]`` forking from its zygote vs one that execs
  a fresh interpreter per job.

Each job is followed by an untimed reset, as the broker does.

    python -m benchmarks.bind --json

``--store s3`` measures the object-store path instead (issue 22): a real SeaweedFS on loopback
(``tests/functions/s3_server.py``) holds the same kind of 4 MB package, and two medians are
taken in one run, interleaved:

- ``s3_bind_p50_ms``: what a pod does with a presigned GET: fetch it (``BlobCache``, aiohttp),
  verify its sha256, and extract it safely (``archive.extract``), into a fresh cache and
  directory each trial;
- ``boto3_floor_p50_ms``: a plain ``boto3`` ``get_object`` of the same object and a
  ``zipfile`` ``extractall`` (no verification, no safety checks);

and ``ratio`` = the first over the second (goal <= 1.3).

    python -m benchmarks.bind --store s3 --json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import hashlib
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.args import positive_int
from pod_runtime.deps import Dependencies
from pod_runtime.launch import sandbox_status
from pod_runtime.localpod import LocalPod
from pod_runtime.package import BlobCache
from pod_runtime.protocol import BlobRef

FILES = 200
THINK_S = 0.05
FILE_BYTES = 4 * 1024 * 1024 // FILES


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _package(path: Path, salt: str) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("app/__init__.py", "")
        zf.writestr("app/main.py", f"SALT = {salt!r}\ndef noop(x):\n    return None\n")
        for i in range(FILES - 2):
            zf.writestr(f"app/data/blob_{i:03d}.bin", os.urandom(FILE_BYTES))


def _wheel(directory: Path) -> Path:
    files = {
        "bench_dep/__init__.py": b"",
        "bench_dep-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: bench-dep\n"
        b"Version: 1.0\n",
        "bench_dep-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    lines = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
    files["bench_dep-1.0.dist-info/RECORD"] = ("\n".join(lines) + "\nRECORD,,\n").encode()
    wheel = directory / "bench_dep-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel


@contextmanager
def _http_server(directory: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _job(pod: LocalPod, spec: dict[str, Any]) -> tuple[dict[str, Any], float]:
    spec = {"attempt_id": f"bench-{uuid.uuid4().hex[:12]}:1", "input": None, **spec}
    start = time.perf_counter()
    result = pod.run(spec)
    e2e = (time.perf_counter() - start) * 1000.0
    if result["state"] != "succeeded":
        raise RuntimeError(f"job failed: {result['error']}")
    pod.call("DELETE", f"/attempts/{result['attempt_id']}/result")
    pod.reset()
    return result, e2e


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def _agent_ms(result: dict[str, Any]) -> float:
    return (result["first_instruction"] - result["started"]) * 1000.0


def _bind(pod: LocalPod, serve: Path, base: str, trials: int) -> dict[str, float]:
    cold, cold_e2e, cached = [], [], []
    for trial in range(trials):
        name = f"pkg-{trial}.zip"
        _package(serve / name, uuid.uuid4().hex)
        ref = {"url": f"{base}/{name}?sig=bench", "digest": _digest(serve / name)}
        result, e2e = _job(pod, {"package": ref, "entrypoint": "app.main:noop"})
        cold.append(_agent_ms(result))
        cold_e2e.append(e2e)
        result, _ = _job(pod, {"package": ref, "entrypoint": "app.main:noop"})
        cached.append(_agent_ms(result))
    return {
        "bind_p50_ms": _p50(cold),
        "bind_e2e_p50_ms": _p50(cold_e2e),
        "bind_cached_p50_ms": _p50(cached),
    }


def _deps(pod: LocalPod, serve: Path, base: str, trials: int) -> dict[str, float]:
    wheel = _wheel(pod.pod_dir)
    (serve / "req.txt").write_text(f"{wheel}\n")
    req = {"url": f"{base}/req.txt", "digest": _digest(serve / "req.txt")}
    source = "import os\ndef noop(x):\n    return None\n"
    with zipfile.ZipFile(serve / "noop.zip", "w") as zf:
        zf.writestr("noopmod.py", source)
    pkg = {"url": f"{base}/noop.zip", "digest": _digest(serve / "noop.zip")}
    _job(pod, {"package": pkg, "entrypoint": "noopmod:noop", "requirements": req})
    with_deps = [
        _job(pod, {"package": pkg, "entrypoint": "noopmod:noop", "requirements": req})[1]
        for _ in range(trials)
    ]
    without = [_job(pod, {"package": pkg, "entrypoint": "noopmod:noop"})[1] for _ in range(trials)]
    noop = {"package": None, "entrypoint": "json:dumps"}
    back_to_back = [_job(pod, noop)[1] for _ in range(trials)]
    warm = []
    for _ in range(trials):
        time.sleep(THINK_S)  # a caller's pause: the pod is idle, reset and re-armed
        warm.append(_job(pod, noop)[1])

    async def hit_ms() -> float:
        blobs = BlobCache(pod.pod_dir / "cache" / "blobs", max_bytes=1 << 20)
        deps = Dependencies(
            pod.pod_dir / "cache" / "site",
            pod.pod_dir / "cache",
            python=sys.executable,
            blobs=blobs,
            reaper=None,
        )
        ref = BlobRef(req["url"], req["digest"])
        samples = []
        for _ in range(200):
            start = time.perf_counter()
            await deps.ensure(ref, pod.pod_dir / "unused.log")
            samples.append((time.perf_counter() - start) * 1000.0)
        await blobs.close()
        return statistics.median(samples)

    return {
        "deps_hit_ms": round(asyncio.run(hit_ms()), 4),
        "deps_hit_e2e_delta_ms": round(_p50(with_deps) - _p50(without), 2),
        "warm_noop_e2e_p50_ms": _p50(warm),
        "warm_noop_back_to_back_e2e_p50_ms": _p50(back_to_back),
    }


def _starts(root: Path, trials: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with zipfile.ZipFile(root / "np.zip", "w") as zf:
        zf.writestr("npjob.py", "import numpy\ndef noop(x):\n    return None\n")
    for mode, zygote in (("zygote", True), ("exec", False)):
        pod_dir = root / f"pod-{mode}"
        pod_dir.mkdir()
        (pod_dir / "np.zip").write_bytes((root / "np.zip").read_bytes())
        pkg = {"url": (pod_dir / "np.zip").as_uri(), "digest": _digest(pod_dir / "np.zip")}
        pod = LocalPod.start(
            f"bench-{mode}-{uuid.uuid4().hex[:8]}", pod_dir, preload=["numpy"], zygote=zygote
        )
        try:
            _job(pod, {"package": pkg, "entrypoint": "npjob:noop"})
            samples = [
                _job(pod, {"package": pkg, "entrypoint": "npjob:noop"})[1] for _ in range(trials)
            ]
        finally:
            pod.stop()
        out[f"{mode}_start_p50_ms"] = _p50(samples)
    return out


S3_GOAL_RATIO = 1.3


def _s3_bind(trials: int) -> dict[str, Any]:
    """The ``--store s3`` medians (module docstring), against a SeaweedFS of its own."""
    import io
    import shutil

    from functions.stores import S3PackageStore
    from pod_runtime.archive import ArchiveLimits, extract
    from tests.functions.s3_server import S3Server

    server = S3Server.start()
    try:
        os.environ.update(server.env())
        store = S3PackageStore(server.config())
        with tempfile.TemporaryDirectory(prefix="fp-bench-s3-") as tmp:
            root = Path(tmp)
            _package(root / "pkg.zip", uuid.uuid4().hex)
            digest = _digest(root / "pkg.zip")
            with (root / "pkg.zip").open("rb") as f:
                store.put_verified(digest, f, (root / "pkg.zip").stat().st_size)
            client: Any = store.client
            key = store.key(digest)

            cache = BlobCache(root / "cache", max_bytes=1 << 30)  # one per pod: one session

            async def ours(n: int) -> float:
                cache.path(digest).unlink(missing_ok=True)  # not cached: fetched afresh
                start = time.perf_counter()
                zip_path, cached = await cache.get(BlobRef(store.url(digest), digest))
                extract(zip_path, root / f"ours-{n}", ArchiveLimits())
                took = (time.perf_counter() - start) * 1000.0
                assert not cached
                return took

            def floor(n: int) -> float:
                start = time.perf_counter()
                body = client.get_object(Bucket=store.bucket, Key=key)["Body"].read()
                with zipfile.ZipFile(io.BytesIO(body)) as zf:
                    zf.extractall(root / f"floor-{n}")
                return (time.perf_counter() - start) * 1000.0

            async def run() -> tuple[list[float], list[float]]:
                floor(-1)  # warm both: connections, imports
                await ours(-1)
                mine, plain = [], []
                for n in range(trials):  # interleaved, the order alternating
                    if n % 2:
                        plain.append(floor(n))
                        mine.append(await ours(n))
                    else:
                        mine.append(await ours(n))
                        plain.append(floor(n))
                    for leftover in (f"ours-{n}", f"floor-{n}"):
                        shutil.rmtree(root / leftover, ignore_errors=True)
                await cache.close()
                return mine, plain

            mine, plain = asyncio.run(run())
    finally:
        server.close()
    ratio = statistics.median(mine) / statistics.median(plain)
    return {
        "store": "s3", "trials": trials, "package_bytes": (4 * 1024 * 1024),
        "s3_bind_p50_ms": _p50(mine), "boto3_floor_p50_ms": _p50(plain),
        "ratio": round(ratio, 3), "goal_ratio": S3_GOAL_RATIO,
        "meets_goal": ratio <= S3_GOAL_RATIO,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="benchmarks.bind", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--trials", type=positive_int, default=20)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--store", choices=("http", "s3"), default="http",
        help="http: the pod benchmarks above; s3: fetch+verify+unpack from SeaweedFS vs boto3",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.store == "s3":
        result = _s3_bind(args.trials)
        print(
            json.dumps(result)
            if args.json
            else "\n".join(f"{k:>24}: {v}" for k, v in result.items())
        )
        return
    sandboxed, _ = sandbox_status()
    # /var/tmp, not /tmp: a sandboxed pod has a private /tmp and reads file:// URLs from /.
    with tempfile.TemporaryDirectory(prefix="fp-bench-bind-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        serve = root / "serve"
        serve.mkdir()
        pod_dir = root / "pod"
        out: dict[str, Any] = {"sandboxed": sandboxed, "trials": args.trials}
        with _http_server(serve) as base:
            pod = LocalPod.start(f"bench-bind-{uuid.uuid4().hex[:8]}", pod_dir)
            try:
                out.update(_bind(pod, serve, base, args.trials))
                out.update(_deps(pod, serve, base, args.trials))
            finally:
                pod.stop()
        out.update(_starts(root, args.trials))
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:>24}: {value}")


if __name__ == "__main__":
    main()
