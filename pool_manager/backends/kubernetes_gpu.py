"""The kubernetes backend's reading of its pods' cards, from the pods' own agents (paper §6, A.4).

A broker on a cluster cannot read a node's cards; each pod's agent can (NVML inside the pod)
and answers ``GET /gpu`` with its card report (``pod_runtime.gpu.Nvml.report``), authorised by
the pod's secret. From those reports:

- ``card_of``: the card an active pod got, when the scheduler wrote none on the pod: asked
  until the agent answers (it starts after the pod has its IP), the pod stops, or the
  deadline passes; None when the agent sees no card (no NVML in the pod);
- ``sweep``: each card's exclusivity from every pod pinned to it (``gpus.card_verdict``),
  failing closed: a card whose agents all fail to answer is left out (nothing changes), one
  whose report is missing or lists a process of no group agent's job is not exclusive.

Concurrency: runs on the backend's event loop; one ``httpx.AsyncClient`` (made on first use,
closed by ``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from pod_runtime.agent_auth import bearer, pod_secret
from pool_manager.backends.gpus import card_verdict

REPORT_TIMEOUT_S = 5.0
"""How long one report may take (NVML answers in milliseconds; a hung agent does not hold
up the sweep)."""
POLL_S = 0.1
"""How often ``card_of`` asks an agent that has not answered yet."""


class AgentGpuReports:
    """Card reports from pod agents reached at ``http://<pod IP>:<port>``."""

    def __init__(self, agent_key: bytes, port: int) -> None:
        self.agent_key = agent_key
        self.port = port
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=REPORT_TIMEOUT_S)
        return self._client

    async def report(self, name: str, ip: str) -> dict[str, Any] | None:
        """Pod ``name``'s card report, or None when its agent did not answer with one."""
        host = f"[{ip}]" if ":" in ip else ip
        headers = bearer(pod_secret(self.agent_key, name))
        try:
            response = await self._http().get(f"http://{host}:{self.port}/gpu", headers=headers)
            if response.status_code != 200:
                return None
            body = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    async def card_of(
        self, name: str, ip: str, gone: Callable[[], bool], timeout_s: float
    ) -> str | None:
        """The first card pod ``name``'s agent reports; None when it reports none, or never
        answers before ``timeout_s`` or ``gone()`` (the pod stopped)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not gone() and loop.time() < deadline:
            report = await self.report(name, ip)
            if report is not None:
                cards = [c.get("uuid") for c in report.get("cards") or () if isinstance(c, dict)]
                return next((c for c in cards if isinstance(c, str) and c), None)
            await asyncio.sleep(POLL_S)
        return None

    async def sweep(
        self, gpus: Sequence[str], pods: Mapping[str, Sequence[tuple[str, str]]]
    ) -> dict[str, bool]:
        """Each card's verdict from the reports of ``pods[card]`` (``(name, ip)`` of every
        live pod pinned to it); cards with no verdict (no pod, no answer) are left out."""
        wanted = {pod for gpu in gpus for pod in pods.get(gpu, ())}
        names = sorted(wanted)
        answers = await asyncio.gather(*(self.report(name, ip) for name, ip in names))
        got = dict(zip(names, answers, strict=True))
        verdicts = {}
        for gpu in gpus:
            verdict = card_verdict(gpu, [got[pod] for pod in pods.get(gpu, ())])
            if verdict is not None:
                verdicts[gpu] = verdict
        return verdicts

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
            self._client = None
