"""Fire-and-forget tasks that stay referenced until they finish.

asyncio keeps only weak references to tasks, so a task nobody holds can vanish mid-flight;
each shell that starts background work (dispatcher, pod manager) keeps one of these. Used
from the event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for every task, including ones started while waiting."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def stop(self, timeout: float) -> None:
        """Give running tasks ``timeout`` seconds, then cancel what is left."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)
        for task in list(self._tasks):
            task.cancel()
        await self.drain()
