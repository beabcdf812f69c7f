"""The sync client's function and job handles (``Client.function(name)``, ``Job``).

A ``FunctionHandle`` sends nothing until called. Each call makes one Idempotency-Key and
sends its request again with that key after a connection error or a capacity refusal
(``functions.client.retrying``): however often it is sent, it is one job. ``map`` runs its
calls on ``concurrency`` threads sharing the client's connection pool (httpx's client is
thread-safe) and yields in input order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from functions.client.errors import job_output
from functions.client.wire import TERMINAL, check_key, job_request, new_key, segment

if TYPE_CHECKING:
    from functions.sdk import Client


class Job:
    """A submitted job: ``id`` and the calls that follow it. Reads are retried like calls."""

    def __init__(self, client: Client, job_id: str) -> None:
        self._client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def record(self) -> dict[str, Any]:
        """The job's whole record (state, attempts, acquisition path, timings)."""
        return self._client._retried("GET", f"/v1/jobs/{segment(self.id)}", "state")

    def status(self) -> str:
        """``QUEUED``, ``RUNNING``, ``SUCCEEDED``, ``FAILED`` or ``CANCELLED``."""
        return str(self.record()["state"])

    def result(self, timeout: float | None = None) -> Any:
        """The output once the job ends, or its typed error (``functions.client.errors``);
        ``JobNotFinished`` after ``timeout`` seconds (None: until it ends)."""
        return job_output(self.record_when_done(timeout))

    def record_when_done(self, timeout: float | None = None) -> dict[str, Any]:
        """The record once the job has ended (``JobNotFinished`` after ``timeout`` s)."""
        return self._client._wait(self.id, timeout, 0.05, lambda _: self.record())

    def cancel(self) -> dict[str, Any]:
        """Cancel it (a no-op for an ended job); its record afterwards."""
        return self._client._retried("DELETE", f"/v1/jobs/{segment(self.id)}", "state")

    def logs(self, follow: bool = False) -> Iterator[bytes]:
        """Its log's bytes as they arrive; ``follow``: until the job ends."""
        return self._client.iter_logs(self.id, follow=follow)


class FunctionHandle:
    """Calls of one function by name (its latest version at each call)."""

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = name
        self._invoke_path = f"/v1/functions/{segment(name)}:invoke"
        self._submit_path = f"/v1/functions/{segment(name)}/jobs"

    def __repr__(self) -> str:
        return f"FunctionHandle({self.name!r})"

    def _post(
        self, path: str, expect: str, input: Any, key: str | None, fields: dict[str, Any]
    ) -> Any:
        """POST a call with its Idempotency-Key (``key``, or a new one), retried as the
        client's policy says; ``expect``: the key the answer must carry."""
        headers = {"Idempotency-Key": check_key(key) if key is not None else new_key()}
        content = job_request(input, **fields)
        return self._client._retried("POST", path, expect, content=content, headers=headers)

    def invoke(
        self,
        input: Any = None,
        *,
        tag: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        timeout_s: float | None = None,
        single_use: bool | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """Run the function on ``input`` and return its output, or raise the job's typed
        error (``FunctionError``, ``JobTimeout``, ``PodLost``...). ``tag``: the lease tag (a
        session's calls reuse its warm pod). ``single_use``: run on a fresh pod of its own,
        retired after it. ``idempotency_key``: a key of your own (one is made per call
        otherwise)."""
        record = self.invoke_record(
            input, tag=tag, queue=queue, priority=priority, timeout_s=timeout_s,
            single_use=single_use, idempotency_key=idempotency_key,
        )  # fmt: skip
        return job_output(record)

    def invoke_record(
        self,
        input: Any = None,
        *,
        tag: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        timeout_s: float | None = None,
        single_use: bool | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """``invoke``'s job record instead of its output (acquisition path, timings)."""
        fields = {"lease_tag": tag, "queue": queue, "priority": priority,
                  "timeout_s": timeout_s, "single_use": single_use}  # fmt: skip
        # 200: the ended job's record ("state"); 202: {"job_id", "state"}: both have state.
        answer = self._post(self._invoke_path, "state", input, idempotency_key, fields)
        if answer["state"] not in TERMINAL:  # 202: still running past the gateway's wait
            return Job(self._client, str(answer["job_id"])).record_when_done()
        return answer

    def submit(
        self,
        input: Any = None,
        *,
        tag: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        timeout_s: float | None = None,
        single_use: bool | None = None,
        idempotency_key: str | None = None,
    ) -> Job:
        """Queue a call and return its ``Job`` at once."""
        fields = {"lease_tag": tag, "queue": queue, "priority": priority,
                  "timeout_s": timeout_s, "single_use": single_use}  # fmt: skip
        answer = self._post(self._submit_path, "job_id", input, idempotency_key, fields)
        return Job(self._client, str(answer["job_id"]))

    def map(
        self,
        inputs: Iterable[Any],
        *,
        tag: str | None = None,
        concurrency: int = 8,
        return_exceptions: bool = False,
        queue: str | None = None,
        timeout_s: float | None = None,
    ) -> Iterator[Any]:
        """``invoke`` on each input, ``concurrency`` at once, yielding outputs in input
        order. A failed call raises its error at its place (the calls not yet yielded are
        cancelled if still waiting to start); ``return_exceptions``: yield it instead and
        go on."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        with ThreadPoolExecutor(concurrency, thread_name_prefix=f"map-{self.name}") as pool:
            pending: deque[Future[Any]] = deque()
            try:
                for item in inputs:
                    pending.append(
                        pool.submit(self.invoke, item, tag=tag, queue=queue, timeout_s=timeout_s)
                    )
                    if len(pending) >= 2 * concurrency:
                        yield _outcome(pending.popleft(), return_exceptions)
                while pending:
                    yield _outcome(pending.popleft(), return_exceptions)
            finally:
                for future in pending:
                    future.cancel()


def _outcome(future: Future[Any], return_exceptions: bool) -> Any:
    if not return_exceptions:
        return future.result()
    try:
        return future.result()
    except Exception as exc:
        return exc
