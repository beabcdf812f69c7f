"""The kubernetes backend's view of its pods: one list, then a watch, on a thread of its own.

``PodWatch.run`` (the thread) lists the backend's pods (``labelSelector=firepool.io/pool``),
then watches from the list's resourceVersion with bookmarks, so a watch that ends (the
server's ``timeoutSeconds``, a dropped connection) resumes where it was without a list.
Every ``resync_s`` it lists again (a resync: whatever a missed event hid is corrected), as it
does when the server answers 410 Gone (the version is too old) or the watch fails.

Concurrency: the thread only reads the API server and hands what it read to the event loop
(``loop.call_soon_threadsafe``): ``on_list(pods, started)`` with a whole list and the
monotonic time it was asked at, ``on_event(type, pod)`` with one ADDED, MODIFIED or DELETED
pod. Every state those callbacks change lives on the loop; nothing here is shared.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pool_manager.backends.kubernetes_api import ApiException, KubeApi
from pool_manager.backends.kubernetes_spec import is_ours

log = logging.getLogger("firepool.kubernetes")

RESYNC_S = 300.0
"""How often the whole list is read again."""
RETRY_S = 1.0
"""How long the watch waits before trying again after the server refused it."""
IDLE_RETRY_S = 0.05
"""... and after no answer came (a watch idle past its window, an unreachable server)."""


class PodWatch:
    """List-then-watch of one namespace's pods with ``selector``, feeding the loop."""

    def __init__(
        self,
        api: KubeApi,
        selector: str,
        loop: asyncio.AbstractEventLoop,
        on_list: Callable[[list[dict[str, Any]], float], None],
        on_event: Callable[[str, dict[str, Any]], None],
        resync_s: float = RESYNC_S,
    ) -> None:
        self.api = api
        self.selector = selector
        self.loop = loop
        self.on_list = on_list
        self.on_event = on_event
        self.resync_s = resync_s
        self.lists = 0
        """Lists read so far (the first and every resync)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.run, name="firepool-pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end: it does at its next event, or when its watch call ends
        (``resync_s`` at most). It is a daemon thread: nothing waits for it."""
        self._stop.set()

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        if self.loop.is_closed():
            self._stop.set()
            return
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop closed meanwhile
            self._stop.set()

    def _list(self) -> str | None:
        started = time.monotonic()
        pods, version = self.api.list("pods", self.selector)
        self.lists += 1
        self._post(self.on_list, [p for p in pods if is_ours(p)], started)
        return version

    def run(self) -> None:
        version: str | None = None
        listed = False
        next_resync = 0.0
        while not self._stop.is_set():
            try:
                if not listed or time.monotonic() >= next_resync:
                    version = self._list()
                    listed = True
                    next_resync = time.monotonic() + self.resync_s
                window = max(1, int(next_resync - time.monotonic()))
                for event in self.api.watch("pods", self.selector, version, window):
                    kind, pod = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if pod.get("code") == 410:  # the version is gone: list again
                            listed = False
                            break
                        raise ApiException(status=pod.get("code", 0), reason=pod.get("message"))
                    seen = (pod.get("metadata") or {}).get("resourceVersion")
                    if seen:
                        version = seen
                    if kind in ("ADDED", "MODIFIED", "DELETED") and is_ours(pod):
                        self._post(self.on_event, kind, pod)
                    if self._stop.is_set() or time.monotonic() >= next_resync:
                        break
            except ApiException as exc:
                if self._stop.is_set():
                    return
                if exc.status != 0:  # 0: no answer (a watch idle past its window, a cut)
                    log.warning("watching pods failed (%s %s); listing again", exc.status,
                                exc.reason)  # fmt: skip
                self._stop.wait(RETRY_S if exc.status else IDLE_RETRY_S)
                listed = False
