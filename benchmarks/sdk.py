"""What the SDK adds to a warm call (issue 23): ``invoke`` through ``AsyncClient`` and the
sync ``Client`` against a raw aiohttp POST to the same endpoint, in the same run.

Starts a broker (SQLite, local pods) in a temporary state directory, deploys the no-op
function and, after ``--warmup`` rounds, runs ``--calls`` rounds; each round makes one call
of each kind on a stable lease tag (warm pod), in a rotating order so no kind always goes
first. The raw call is the floor: one ``POST /v1/functions/noop:invoke`` on a keep-alive
aiohttp session, no Idempotency-Key, the body built once. The SDK's calls each make an
Idempotency-Key, encode the input, go through the retry policy and decode the output.
``raw_keyed`` is the raw call with a fresh Idempotency-Key, to show what the key costs the
gateway apart from the SDK's own work.

Prints p50/p90 per kind and ``*_ratio_p50`` (SDK p50 / raw p50); the goal is <= 1.2.

    python -m benchmarks.sdk --json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from tqdm import tqdm

from benchmarks.args import non_negative_int, positive_int
from benchmarks.invoke import CATALOG, NOOP, pct
from functions.sdk import AsyncClient, Client
from gateway.auth import Role
from gateway.harness import kill_pods, start_broker

TAG = "bench-sdk"
INPUT = {"x": 1}
KINDS = ("raw", "raw_keyed", "sdk_async", "sdk_sync")


async def _rounds(url: str, token: str, calls: int, progress: bool) -> dict[str, list[float]]:
    path = f"{url}/v1/functions/noop:invoke"
    body = orjson.dumps({"input": INPUT, "lease_tag": TAG})
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    async with aiohttp.ClientSession() as raw, AsyncClient(url, token) as fp:
        sync = Client(url, token)
        noop_async, noop_sync = fp.function("noop"), sync.function("noop")

        async def post(extra: dict[str, str]) -> None:
            async with raw.post(path, data=body, headers={**headers, **extra}) as resp:
                answer = orjson.loads(await resp.read())
                assert resp.status == 200 and answer["output"] == INPUT, answer

        async def raw_call() -> None:
            await post({})

        async def raw_keyed() -> None:
            await post({"Idempotency-Key": uuid.uuid4().hex})

        async def sdk_async() -> None:
            assert await noop_async.invoke(INPUT, tag=TAG) == INPUT

        async def sdk_sync() -> None:  # blocks the loop: nothing else runs meanwhile
            assert noop_sync.invoke(INPUT, tag=TAG) == INPUT

        kinds: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("raw", raw_call), ("raw_keyed", raw_keyed),
            ("sdk_async", sdk_async), ("sdk_sync", sdk_sync),
        ]  # fmt: skip
        try:
            for i in tqdm(range(calls), desc="rounds", disable=not progress, file=sys.stderr):
                shift = i % len(kinds)
                for kind, call in kinds[shift:] + kinds[:shift]:
                    start = time.perf_counter()
                    await call()
                    times[kind].append((time.perf_counter() - start) * 1000)
        finally:
            sync.close()
    return times


def run(calls: int, warmup: int, progress: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fp-bench-sdk-") as tmp:
        home = Path(tmp)
        server = start_broker(home, CATALOG)
        try:
            with server.client("deployer", Role.DEPLOY) as fp:
                fp.deploy(NOOP, name="noop", sku="cpu", entrypoint="noop:noop")
            token = server.token("bench")
            asyncio.run(_rounds(server.url, token, warmup, False))
            times = asyncio.run(_rounds(server.url, token, calls, progress))
        finally:
            server.stop()
            kill_pods(home)
    p50 = {kind: statistics.median(v) for kind, v in times.items()}
    result: dict[str, Any] = {"calls": calls}
    for kind, values in times.items():
        result[f"{kind}_p50_ms"] = round(p50[kind], 3)
        result[f"{kind}_p90_ms"] = round(pct(values, 0.9), 3)
    for kind in ("raw_keyed", "sdk_async", "sdk_sync"):
        result[f"{kind}_ratio_p50"] = round(p50[kind] / p50["raw"], 3)
    result["goal"] = {"sdk_async_ratio_p50": 1.2, "sdk_sync_ratio_p50": 1.2}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=positive_int, default=400, help="rounds (one per kind)")
    parser.add_argument("--warmup", type=non_negative_int, default=30)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    result = run(args.calls, args.warmup, progress=not args.json)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")


if __name__ == "__main__":
    main()
