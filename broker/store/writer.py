"""The group-commit writer: every store write runs on one thread, over one connection.

Concurrency rule: callers on the event loop enqueue a write (a plain function of a
``WriteContext``) and await a future; only the writer thread touches its connection. The thread
blocks for the first pending write, then takes every write that arrived while the previous
commit was in flight (up to ``max_batch``), runs them in ONE transaction (in order, or through a
``BatchExecutor`` that merges writes which commute), commits once and resolves the waiters with
one ``call_soon_threadsafe`` per event loop. One fsync therefore covers a whole batch, which is
what lets dispatch outrun the disk.

Failure isolation:
- A write may fail *cleanly*: it raises one of ``clean_failures`` (``StaleRevision``,
  ``IllegalTransition``, ``IdempotencyMismatch``...) having changed nothing. Only its waiter sees
  the error; the rest of the batch commits.
- Any other error (a duplicate key, a lost connection, a failed commit) rolls the batch back,
  and every entry of it is retried alone in its own transaction, so a bad entry fails alone.

A waiter that is cancelled does not cancel its write: once enqueued, a write is applied.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(slots=True)
class WriteContext:
    """What a write sees: the writer's connection (inside the batch transaction) and a DBAPI
    cursor on the same connection for precompiled hot-path statements."""

    conn: Connection
    cursor: Any


WriteOp = Callable[[WriteContext], T]

#: ``(True, result)`` or ``(False, clean failure)`` for one write.
Outcome = tuple[bool, Any]

#: Runs a batch's writes inside its transaction and returns one outcome per write, in order.
#: It may reorder or merge writes that commute (see ``batching.py``); it returns clean failures
#: as outcomes and raises anything else (the writer then rolls back and replays entry by entry).
BatchExecutor = Callable[[WriteContext, Sequence[WriteOp[Any]]], list[Outcome]]


def run_sequentially(
    ctx: WriteContext,
    ops: Sequence[WriteOp[Any]],
    clean_failures: tuple[type[BaseException], ...],
) -> list[Outcome]:
    """The plain executor: each write in order, clean failures caught per write."""
    out: list[Outcome] = []
    for op in ops:
        try:
            out.append((True, op(ctx)))
        except clean_failures as exc:
            out.append((False, exc))
    return out


@dataclass(slots=True)
class _Entry(Generic[T]):
    op: WriteOp[T]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[T]


@dataclass(frozen=True, slots=True)
class WriterStats:
    """Counters since the writer started. ``mean_batch`` = writes per committed transaction."""

    batches: int
    writes: int
    max_batch: int
    replayed_batches: int

    @property
    def mean_batch(self) -> float:
        return self.writes / self.batches if self.batches else 0.0


_STOP = object()


def _lost_connection(conn: Connection, exc: Exception) -> bool:
    """Whether ``exc`` means the connection is gone; if so ``conn`` is invalidated, and its
    next use reconnects. Errors from the raw DBAPI cursor are checked here, since SQLAlchemy
    only sees the ones raised through its own ``execute``."""
    if conn.invalidated:
        return True
    dbapi_exc = exc.orig if isinstance(exc, DBAPIError) else exc
    dialect = conn.dialect
    if isinstance(dbapi_exc, dialect.loaded_dbapi.Error) and dialect.is_disconnect(
        dbapi_exc, None, None
    ):
        conn.invalidate(dbapi_exc)
        return True
    return False


def _resolve(items: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in items:
        if future.done():  # the waiter was cancelled; the write happened regardless
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


class GroupCommitWriter:
    """One thread, one connection, one transaction per batch of concurrent writes."""

    def __init__(
        self,
        engine: Engine,
        *,
        clean_failures: tuple[type[BaseException], ...],
        executor: BatchExecutor | None = None,
        max_batch: int = 2048,
        name: str = "firepool-store-writer",
    ) -> None:
        self._engine = engine
        self._execute: BatchExecutor = executor or functools.partial(
            run_sequentially, clean_failures=clean_failures
        )
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._closed = False
        self._batches = 0
        self._writes = 0
        self._max_seen = 0
        self._replays = 0
        self.on_commit: Callable[[int, float], None] | None = None
        """Told ``(writes, seconds)`` of each committed transaction, on the writer thread
        (the broker's metrics; it must not block)."""

    def start(self) -> None:
        """Open the connection on the writer thread; raise what opening it raised."""
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    async def run(self, op: WriteOp[T]) -> T:
        """Enqueue ``op`` and wait until the batch holding it committed (or it failed)."""
        if self._closed:
            raise RuntimeError("the job store is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Entry(op, loop, future))
        return await future

    async def close(self) -> None:
        """Apply every write already enqueued, then stop the thread and close the connection."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        await asyncio.to_thread(self._thread.join)

    def stats(self) -> WriterStats:
        return WriterStats(self._batches, self._writes, self._max_seen, self._replays)

    # -- the writer thread -------------------------------------------------------------------

    def _main(self) -> None:
        try:
            conn = self._engine.connect()
        except BaseException as exc:
            self._start_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            stopping = False
            while not stopping:
                batch: list[_Entry[Any]] = []
                item = self._queue.get()
                while True:
                    if item is _STOP:
                        stopping = True
                    else:
                        batch.append(item)
                    if stopping or len(batch) >= self._max_batch:
                        break
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                if batch:
                    try:
                        outcomes = self._run_batch(conn, batch)
                    except Exception as exc:  # a bug, not a database error: keep serving
                        log.exception("job store writer failed a batch of %d", len(batch))
                        outcomes = [(False, exc)] * len(batch)
                    self._deliver(batch, outcomes)
            self._refuse_stragglers()
        finally:
            conn.close()

    def _refuse_stragglers(self) -> None:
        """Fail writes enqueued after the stop marker (another thread raced ``close``)."""
        late: list[_Entry[Any]] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                late.append(item)
        if late:
            closed = RuntimeError("the job store is closed")
            self._deliver(late, [(False, closed)] * len(late))

    def _run_batch(self, conn: Connection, batch: list[_Entry[Any]]) -> list[Outcome]:
        try:
            try:
                outcomes = self._transaction(conn, batch)
            except Exception as exc:
                if not _lost_connection(conn, exc):
                    raise
                # nothing of the batch committed (unless the COMMIT itself was lost, when the
                # replay answers StaleRevision/Conflict): once more on a fresh connection
                log.warning("job store connection lost (%r); reconnecting", exc)
                outcomes = self._transaction(conn, batch)
        except Exception as exc:
            if len(batch) == 1:
                return [(False, exc)]
            log.info("batch of %d writes failed (%r); retrying each alone", len(batch), exc)
            self._replays += 1
            return [self._run_alone(conn, entry) for entry in batch]
        self._batches += 1
        self._writes += len(batch)
        self._max_seen = max(self._max_seen, len(batch))
        return outcomes

    def _run_alone(self, conn: Connection, entry: _Entry[Any]) -> Outcome:
        try:
            [outcome] = self._transaction(conn, [entry])
        except Exception as exc:
            return (False, exc)
        self._batches += 1
        self._writes += 1
        return outcome

    def _transaction(self, conn: Connection, entries: list[_Entry[Any]]) -> list[Outcome]:
        """Run ``entries`` in one transaction and commit; raise (rolled back) on any error
        that is not a clean failure."""
        start = time.perf_counter()
        with conn.begin():
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                outcomes = self._execute(WriteContext(conn, cursor), [e.op for e in entries])
            finally:
                cursor.close()
        if self.on_commit is not None:
            self.on_commit(len(entries), time.perf_counter() - start)
        return outcomes

    def _deliver(self, batch: list[_Entry[Any]], outcomes: list[Outcome]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
        for entry, (ok, value) in zip(batch, outcomes, strict=True):
            by_loop.setdefault(entry.loop, []).append((entry.future, ok, value))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, items)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                log.warning("dropped %d write results for a closed event loop", len(items))
