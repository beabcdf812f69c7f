"""One broker per state directory and per job store.

Two brokers on one ``FIREPOOL_HOME`` would each rebuild the pool from the same pod records,
hand one caller's used pods to another (owner holds live in each broker's memory), and
scale past the ceiling together; two brokers with their own homes on one MySQL store would
each re-queue the other's running jobs at start and run them again. So a broker
holds, for as long as it runs:

* an exclusive ``flock`` on ``<home>/broker.lock`` (released by the kernel when the process
  dies, however it dies), which also names the holder's pid for the refusal;
* one on the job store: for SQLite a ``flock`` beside the database file; for MySQL the named
  lock ``GET_LOCK('firepool-broker:<schema>', 0)`` on a connection of its own (the server
  releases it when that connection ends: a killed broker's lock goes with its socket).

A second broker is refused with ``Conflict`` naming what is in use, before it touches a pod
or a job. ``acquire`` is idempotent; ``release`` frees both. Not thread-safe: one owner.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from broker.store.engine import backend_of, sqlite_file
from functions.errors import Conflict

LOCK_NAME_MAX = 64
"""MySQL's limit on a named lock's length."""


class _FileLock(NamedTuple):
    fd: int
    path: Path
    note_pid: bool
    """The home's lock file holds its broker's pid; the SQLite store is locked as it is."""
    what: str
    """What the lock guards, as a refusal names it (``the state directory …``)."""


class BrokerLocks:
    """The home's and the store's locks of one broker (see the module docstring)."""

    def __init__(self, home: Path, store_url: str) -> None:
        self.home = home
        self.store_url = store_url
        self._files: list[_FileLock] = []
        self._engine: Engine | None = None
        self._conn: Connection | None = None
        self._lock_name = ""
        self._on_server = False

    @property
    def held(self) -> bool:
        return bool(self._files)

    def acquire(self) -> None:
        """Take both locks, or raise ``Conflict`` holding neither."""
        if self.held:
            return
        try:
            self._lock_file(self.home / "broker.lock", f"the state directory {self.home}")
            url = make_url(self.store_url)
            if backend_of(url) == "sqlite":
                db = sqlite_file(self.store_url)
                self._lock_file(db, f"the job store {db}", note_pid=False)
            else:
                self._on_server = True
                self._lock_server(self.store_url)
        except BaseException:
            self.release()
            raise

    def acquire_home(self) -> None:
        """Take only the home's lock, or raise ``Conflict``: what ``firepool down`` holds for
        a moment to learn whether a broker serves the home (not the store's, which a broker
        of another home may hold on a shared store, and which on MySQL needs the server)."""
        if not self.held:
            self._lock_file(self.home / "broker.lock", f"the state directory {self.home}")

    def check(self) -> str | None:
        """Make sure every lock is still this broker's (blocking; ``Broker`` calls it every
        ``Settings.lock_check_s``, 30 s): a lock file whose path was removed or replaced is taken
        again at its path, and a MySQL lock whose connection ended (``wait_timeout``, a server
        restart, a dropped link: the server frees the lock silently) is taken again on a new one;
        the checks also keep that connection from idling out. None if all are held again, else what
        another broker now holds."""
        for i, lock in enumerate(list(self._files)):
            held = os.fstat(lock.fd)
            try:
                now = os.stat(lock.path)
                same = (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
            except FileNotFoundError:
                same = False
            if not same:
                try:
                    self._lock_file(lock.path, lock.what, lock.note_pid)
                except Conflict as exc:
                    return exc.message
                os.close(lock.fd)
                self._files[i] = self._files.pop()  # the new lock, in the old one's place
        if self._on_server and not self._server_lock_held():
            try:
                self._lock_server(self.store_url)
            except Conflict as exc:
                return exc.message
        return None

    def _server_lock_held(self) -> bool:
        try:
            if self._conn is None:
                return False
            query = text("SELECT IS_USED_LOCK(:name) = CONNECTION_ID()")
            held = self._conn.execute(query, {"name": self._lock_name}).scalar()
            self._conn.commit()
            return held == 1
        except Exception:  # the connection is gone: so is the lock
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
            if self._engine is not None:
                self._engine.dispose()
            self._conn = self._engine = None
            return False

    def release(self) -> None:
        for lock in self._files:
            os.close(lock.fd)  # closing the descriptor drops its flock
        self._files.clear()
        if self._conn is not None:
            self._conn.close()  # the server drops the connection's named locks
            self._conn = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _lock_file(self, path: Path, what: str, note_pid: bool = True) -> None:
        """``flock`` ``path`` (created if missing). ``note_pid``: write this pid into it (the
        home's lock file); the SQLite store is locked as its own file, which catches every
        spelling of it (symlinks, hard links, URI forms), and SQLite's own locks are POSIX
        record locks, independent of ``flock``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = "unknown"
            if note_pid:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or holder
            os.close(fd)
            raise Conflict(
                f"{what} is in use by another broker (pid {holder}); stop it first, or give "
                "this one its own FIREPOOL_HOME and job store"
            ) from None
        if note_pid:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._files.append(_FileLock(fd, path, note_pid, what))

    def _lock_server(self, url: str) -> None:
        if self._engine is not None:  # a connection that failed before: start afresh
            self._engine.dispose()
        self._engine = create_engine(url, poolclass=NullPool)
        self._conn = self._engine.connect()
        # The schema the connection is in, not the URL's text: ``/?database=x`` names the
        # same schema as ``/x`` and would otherwise take another lock.
        schema = str(self._conn.execute(text("SELECT DATABASE()")).scalar() or "")
        name = f"firepool-broker:{schema}"
        if len(name) > LOCK_NAME_MAX:
            name = "firepool-broker:" + hashlib.sha256(schema.encode()).hexdigest()[:40]
        self._lock_name = name
        got = self._conn.execute(text("SELECT GET_LOCK(:name, 0)"), {"name": name}).scalar()
        self._conn.commit()
        if got != 1:
            raise Conflict(
                f"the job store {schema!r} is in use by another broker (its named lock "
                f"{name!r} is held); stop it first, or give this one its own store"
            )
