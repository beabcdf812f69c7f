"""Crash recovery under load (issue 4, paper A.1 and C.3).

Callers submit jobs through real HTTP (agent loops of sync invokes with lease tags, RL-style
fan-outs of async jobs), every request with an Idempotency-Key and retried with the same key
while the broker is down. Meanwhile the broker is SIGKILLed ``--kills`` times at random moments
and restarted on the same state directory. The function reports each execution to a recorder
on loopback, so a job whose user code ran twice is caught from its own side effects.

Prints ``lost`` (accepted jobs that never succeeded, or succeeded without running),
``duplicated`` (keys executed more than once), ``holds_restored`` / ``holds_before`` (owner
holds the broker had when it was killed that the restarted broker still has for the same
owner, ``count_holds``; ``holds_ended_before_kill``: holds read before a kill that the broker
itself ended between that read and the kill, counted in neither) and
``restart_to_dispatch_p50_s`` (process start → recovered and dispatching, from the broker's
own log; ``recovery_p50_s`` is the recovery alone, ``spawn_to_ready_p50_s`` what a client
sees from the restart to a ready ``/readyz``).

    python -m benchmarks.crash --kills 30 --json
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import orjson
from tqdm import tqdm

from benchmarks.args import positive_int
from gateway.auth import Role
from gateway.harness import BrokerServer, free_port, kill_pods, start_broker

FN = Path(__file__).resolve().parent / "crash_fn"
CATALOG = (
    "budgets: {cpu: 32}\n"
    "pools:\n"
    # network: host: each run reports itself to the benchmark's recorder on this host's
    # loopback, which pods of the default (none) have no route to
    "  cpu: {min_count: 2, max_idle_count: 4, max_count: 16, idle_timeout_s: 600,"
    " network: host}\n"
)
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
DISPATCHING = re.compile(r"dispatching ([0-9.]+) s after process start .*recovery ([0-9.]+) s")
HOLD_ENDED = re.compile(r"deleting pod (\S+): | on (\S+), path recycled")
"""Broker log lines that end a pod's owner hold: its deletion begins (the line comes before
the backend is asked), or a job of another of its owner's sessions takes it, which persists
the pod's retire mark after this line (``broker.dispatcher``)."""
OWNER_TOOK = re.compile(r"job (\S+) started: attempt \S+ on (\S+), path (?:warm|recycled)")
"""A job took the pods from their owner hold (``claim_policy``: its caller's hold)."""
QUEUED = re.compile(r"job (\S+) queued: \S+ v\S+ for (\S+) on ")
"""A job and its caller."""


def _pods_named(pattern: re.Pattern[str], log: str) -> set[str]:
    return {name for match in pattern.finditer(log) for group in match.groups() if group
            for name in group.split(",")}  # fmt: skip


def count_holds(
    held: dict[str, str],
    after: dict[str, str],
    window_log: str,
    restart_log: str,
    callers: dict[str, str],
) -> tuple[dict[str, str], set[str], set[str]]:
    """``held``: pod -> owner of the idle held pods read from the broker just before it was
    killed; ``after``: pod -> owner of every pod the restarted broker reports;
    ``window_log``: what the killed broker logged from just before that read to its end;
    ``restart_log``: what the restarted broker logged from its start;
    ``callers``: job id -> caller.

    The read and the kill are two moments: between them the broker runs on, and may end a
    hold itself (break it for a queued job at the pool's ceiling, delete a pod that
    stopped, or hand it to a job of its owner's next session), which the restarted broker
    rightly does not restore. Such holds (``HOLD_ENDED`` in ``window_log``) are no hold the
    broker had at the kill. Returns the holds at the kill (pod -> owner), the ones restored
    (the restarted broker reports the pod with the same owner, or its log shows that a job
    took it from the hold for a job of that owner), and the ones ended before the kill."""
    ended = _pods_named(HOLD_ENDED, window_log) & set(held)
    at_kill = {name: owner for name, owner in held.items() if name not in ended}
    taken = {
        (pod, callers.get(job)) for job, pods in OWNER_TOOK.findall(restart_log)
        for pod in pods.split(",")
    }  # fmt: skip
    restored = {n for n, owner in at_kill.items() if after.get(n) == owner or (n, owner) in taken}
    return at_kill, restored, ended


class Recorder:
    """Counts executions per key over HTTP on loopback."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        lock = threading.Lock()
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                key = parse_qs(urlparse(self.path).query).get("key", [""])[0]
                with lock:
                    hits[key] += 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Load:
    """Caller threads; every job key is tracked from acceptance to its final state."""

    def __init__(self, url: str, tokens: dict[str, str], recorder: str, jobs_per_caller: int):
        self.url = url
        self.tokens = tokens
        self.recorder = recorder
        self.jobs_per_caller = jobs_per_caller
        self.accepted: dict[str, str] = {}  # key -> job id
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.progress = 0

    def _post(
        self, http: httpx.Client, path: str, body: dict[str, Any], key: str
    ) -> dict[str, Any]:
        """POST until the broker answers (retrying with the same key while it is down)."""
        while True:
            try:
                resp = http.post(
                    path,
                    content=orjson.dumps(body),
                    headers={"Idempotency-Key": key, "Content-Type": "application/json"},
                )
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            if resp.status_code >= 500:
                time.sleep(0.1)
                continue
            if resp.status_code not in (200, 202):
                raise RuntimeError(f"{path} {key}: {resp.status_code} {resp.text[:300]}")
            data: dict[str, Any] = resp.json()
            job_id = data.get("job_id") or data["id"]
            with self.lock:
                self.accepted[key] = job_id
            return data

    def _wait(self, http: httpx.Client, job_id: str) -> dict[str, Any]:
        delay = 0.02
        while True:
            try:
                resp = http.get(f"/v1/jobs/{job_id}")
                if resp.status_code == 200 and resp.json()["state"] in TERMINAL:
                    result: dict[str, Any] = resp.json()
                    return result
            except httpx.HTTPError:
                pass
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def agent(self, caller: str) -> None:
        with httpx.Client(
            base_url=self.url,
            timeout=30,
            headers={"Authorization": f"Bearer {self.tokens[caller]}"},
        ) as http:
            for i in range(self.jobs_per_caller):
                key = f"{caller}-{i}"
                body = {
                    "input": {"key": key, "recorder": self.recorder},
                    "lease_tag": f"{caller}-ep{i // 25}",
                }
                data = self._post(http, "/v1/functions/work:invoke", body, key)
                if data.get("state") not in TERMINAL:
                    self._wait(http, data.get("job_id") or data["id"])
                with self.lock:
                    self.progress += 1
                time.sleep(random.uniform(0.0, 0.05))  # think time

    def trainer(self, caller: str, fanout: int = 8) -> None:
        with httpx.Client(
            base_url=self.url,
            timeout=30,
            headers={"Authorization": f"Bearer {self.tokens[caller]}"},
        ) as http:
            for it in range(self.jobs_per_caller // fanout):
                ids = []
                for r in range(fanout):
                    key = f"{caller}-{it}-{r}"
                    body = {"input": {"key": key, "recorder": self.recorder}, "lease_tag": caller}
                    ids.append(self._post(http, "/v1/functions/work/jobs", body, key)["job_id"])
                for job_id in ids:
                    self._wait(http, job_id)
                with self.lock:
                    self.progress += fanout


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def held_pods(server: BrokerServer, admin: str) -> dict[str, tuple[str, float]]:
    """Idle pods held for an owner: name -> (owner, hold_until)."""
    resp = httpx.get(
        f"{server.url}/v1/pools",
        params={"pods": "1"},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=5,
    )
    now = time.time()
    return {
        p["name"]: (p["owner"], p["hold_until"])
        for p in resp.json()["pod_list"]
        if p["state"] == "IDLE" and p["owner"] and (p["hold_until"] or 0) > now + 2
    }


def run(
    kills: int, callers: int, jobs: int, seed: int, progress: bool, keep: Path | None = None
) -> dict[str, Any]:
    random.seed(seed)
    recorder = Recorder()
    tmp = tempfile.TemporaryDirectory(prefix="fp-crash-")
    home = keep or Path(tmp.name)
    port = free_port()
    server = start_broker(home, CATALOG, port=port)
    restarts: list[float] = []
    dispatching: list[float] = []
    recovery: list[float] = []
    holds_before = holds_restored = holds_ended = 0
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(FN, name="work", sku="cpu", entrypoint="crashfn:work", max_retries=3)
        names = [f"agent{i}" for i in range(callers - callers // 3)]
        names += [f"trainer{i}" for i in range(callers // 3)]
        tokens = {n: server.token(n) for n in names}
        admin = server.token("ops", Role.ADMIN)
        load = Load(server.url, tokens, recorder.url, jobs // callers)
        threads = [
            threading.Thread(
                target=load.trainer if n.startswith("trainer") else load.agent,
                args=(n,),
                daemon=True,
            )
            for n in names
        ]
        for t in threads:
            t.start()
        bar = tqdm(total=kills, desc="kills", disable=not progress, file=sys.stderr)
        for _ in range(kills):
            time.sleep(random.uniform(0.5, 2.0))
            log_at_read = log_size(home)
            try:
                held = held_pods(server, admin)
            except httpx.HTTPError:
                held = {}
            server.kill()
            log_at_kill = log_size(home)
            t0 = time.monotonic()
            server = start_broker(home, CATALOG, port=port)
            restarts.append(time.monotonic() - t0)
            timing = DISPATCHING.findall(server.log())
            if timing:
                dispatching.append(float(timing[-1][0]))
                recovery.append(float(timing[-1][1]))
            after = held_pods_any_state(server, admin)
            # A hold that ran out while the broker restarted (a slow restart on a loaded
            # machine) is not one the restarted broker should still have.
            read_at = time.time()
            due = {n: owner for n, (owner, until) in held.items() if until > read_at + 1}
            log = (home / "broker.log").read_bytes()
            before, restored, ended = count_holds(
                due,
                after,
                log[log_at_read:log_at_kill].decode(errors="replace"),
                log[log_at_kill:].decode(errors="replace"),
                dict(QUEUED.findall(log.decode(errors="replace"))),
            )
            holds_before += len(before)
            holds_restored += len(restored)
            holds_ended += len(ended)
            restart_log = log[log_at_kill:].decode(errors="replace").splitlines()
            for name in sorted(set(before) - restored):
                print(
                    f"hold not restored: {name} (owner {before[name]}, now {after.get(name)})",
                    *[f"    {line[:300]}" for line in restart_log if name in line][:5],
                    sep="\n",
                    file=sys.stderr,
                )
            bar.update()
        bar.close()
        for t in threads:
            t.join(timeout=600)
        final = final_states(server, admin, load.accepted)
    finally:
        server.stop()
        kill_pods(home)
        recorder.close()
        tmp.cleanup()
    hits = recorder.hits
    lost = [k for k, state in final.items() if state != "SUCCEEDED" or hits[k] == 0]
    duplicated = [k for k in load.accepted if hits[k] > 1]
    return {
        "kills": kills,
        "callers": callers,
        "jobs": len(load.accepted),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "holds_restored": holds_restored,
        "holds_before": holds_before,
        "holds_ended_before_kill": holds_ended,
        "restart_to_dispatch_p50_s": _median(dispatching),
        "restart_to_dispatch_max_s": round(max(dispatching), 3) if dispatching else None,
        "recovery_p50_s": _median(recovery),
        "spawn_to_ready_p50_s": _median(restarts),
        "examples": {"lost": lost[:5], "duplicated": duplicated[:5]},
    }


def log_size(home: Path) -> int:
    """Bytes in the broker log (every broker of the run appends to the one file)."""
    return (home / "broker.log").stat().st_size


def held_pods_any_state(server: BrokerServer, admin: str) -> dict[str, str]:
    resp = httpx.get(
        f"{server.url}/v1/pools",
        params={"pods": "1"},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=5,
    )
    return {p["name"]: p["owner"] for p in resp.json()["pod_list"] if p["owner"]}


def final_states(server: BrokerServer, admin: str, accepted: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    with httpx.Client(
        base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {admin}"}
    ) as http:
        for key, job_id in accepted.items():
            resp = http.get(f"/v1/jobs/{job_id}")
            out[key] = resp.json()["state"] if resp.status_code == 200 else "MISSING"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=positive_int, default=30)
    parser.add_argument("--callers", type=positive_int, default=12)
    parser.add_argument("--jobs", type=positive_int, default=3100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, help="state directory to keep for inspection")
    args = parser.parse_args()
    result = run(args.kills, args.callers, args.jobs, args.seed, not args.json, args.keep)
    if args.json:
        print(orjson.dumps(result).decode())
    else:
        for key, value in result.items():
            print(f"{key:>26}: {value}")


if __name__ == "__main__":
    main()
