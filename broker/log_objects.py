"""Job logs kept in the object store when packages are (``FIREPOOL_PACKAGE_STORE=s3``).

``ObjectLogArchive`` is a ``LogArchive`` whose finished logs live in the bucket as
``<prefix>logs/<job id>.log``: an attempt's log is gathered in the local file as before
(``write``, chunk by chunk from the agent), then ``seal`` puts the whole file in the bucket
and removes the local copy. ``read`` answers from the local file while there is one (an
attempt being archived, or one whose seal failed), else with a ranged GET of the object, so a
reader sees the same bytes at the same offsets wherever they are. A later attempt's log
(``write`` at offset 0) starts a new local file, and its seal replaces the object.

Concurrency: called from worker threads (``asyncio.to_thread``), like ``LogArchive``; one
archiving task per job at a time (``PodRecycler``), so a seal never races a write of the same
job. Store faults: a failed seal keeps the local file (logged; reads still work), a failed
read raises ``StoreUnavailable``, a delete goes to a background thread (it never blocks the
event loop that calls it) and a failed one is logged.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from broker.lifecycle import READ_CHUNK, LogArchive
from functions.stores import PackageStore, S3PackageStore
from functions.stores.s3 import error_code, store_error

log = logging.getLogger("firepool.lifecycle")

_NO_BYTES = frozenset({"InvalidRange", "416", "NoSuchKey", "404"})
"""A ranged GET's answer for a log that is not there, or an offset at or past its end."""


class ObjectLogArchive(LogArchive):
    """Logs under ``root`` until sealed, then in ``store``'s bucket."""

    def __init__(self, root: Path, store: S3PackageStore) -> None:
        super().__init__(root)
        self.store = store
        self.client: Any = store.client
        self.bucket = store.bucket
        self._deletes = ThreadPoolExecutor(1, thread_name_prefix="log-deletes")

    @property
    def folder(self) -> str:
        """The key prefix of every archived log."""
        return f"{self.store.config.prefix}logs/"

    def key(self, job_id: str) -> str:
        return f"{self.folder}{job_id}.log"

    def seal(self, job_id: str) -> None:
        """Put the job's gathered log in the bucket and drop the local file; on a store
        fault the local file stays (and is served)."""
        path = self.path(job_id)
        try:
            with path.open("rb") as body:
                self.client.put_object(Bucket=self.bucket, Key=self.key(job_id), Body=body)
        except FileNotFoundError:
            return
        except (ClientError, BotoCoreError) as exc:
            why = store_error(exc, "a PUT")
            log.warning("job %s: its log stays on local disk: %s", job_id, why)
            return
        path.unlink(missing_ok=True)

    def job_ids(self) -> list[str]:
        """The jobs whose logs are kept: local files (an attempt being archived, or one whose
        seal failed) and the bucket's ``logs/`` objects, listed a page of 1,000 keys per
        request. Blocks; ``StoreUnavailable`` when the bucket cannot be listed (the storage
        sweep then tries again next time)."""
        ids = set(super().job_ids())
        folder = self.folder
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=folder
        )
        try:
            for page in pages:
                for item in page.get("Contents", ()):
                    name = item["Key"][len(folder) :]
                    if name.endswith(".log") and "/" not in name:
                        ids.add(name.removesuffix(".log"))
        except (ClientError, BotoCoreError) as exc:
            raise store_error(exc, "a LIST of archived logs") from exc
        return sorted(ids)

    def read(self, job_id: str, offset: int = 0, limit: int = READ_CHUNK) -> bytes:
        try:  # the local file first: a seal puts the object before it removes the file
            with self.path(job_id).open("rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            pass
        doing = f"a GET of job {job_id}'s log"
        try:
            span = f"bytes={offset}-{offset + limit - 1}"
            answer = self.client.get_object(Bucket=self.bucket, Key=self.key(job_id), Range=span)
            with answer["Body"] as body:
                return bytes(body.read())
        except ClientError as exc:
            if error_code(exc) in _NO_BYTES:
                return b""
            raise store_error(exc, doing) from exc
        except BotoCoreError as exc:
            raise store_error(exc, doing) from exc

    def delete(self, job_id: str) -> None:
        """Forget the job's log: its local file now, its object in the background (callers
        such as the retention sweep run on the event loop; a store that is down must not
        stall it). A failed delete is logged; the object is then left to the bucket's own
        lifecycle rules (README, "Packages in S3")."""
        super().delete(job_id)
        self._deletes.submit(self._delete_object, job_id)

    def _delete_object(self, job_id: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key(job_id))
        except (ClientError, BotoCoreError) as exc:
            log.warning("job %s: its archived log was not deleted: %s", job_id, exc)

    def flush(self) -> None:
        """Wait for the deletes submitted so far (tests, shutdown)."""
        self._deletes.submit(lambda: None).result()


def open_log_archive(root: Path, packages: PackageStore) -> LogArchive:
    """Where finished attempts' logs are kept: the bucket of an s3 package store, else
    files under ``root``."""
    if isinstance(packages, S3PackageStore):
        return ObjectLogArchive(root, packages)
    return LogArchive(root)
