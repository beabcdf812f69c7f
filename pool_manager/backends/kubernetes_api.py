"""The few Kubernetes API calls the kubernetes backend makes, as plain JSON over the official
client's ``ApiClient`` (its configuration loading, credentials, TLS and connection pool).

Objects go out and come back as dicts: the backend builds pods as JSON
(``kubernetes_spec``) and reads a few fields back, so the client's typed models would only
cost time (a list of 2,000 pods parses several times faster as JSON).

Blocking: call from a worker thread (``asyncio.to_thread``) or the watch's own thread. An
``ApiClient`` is safe to share between threads (urllib3's pool is).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from functions.errors import InvalidRequest

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT_S = 30.0

__all__ = ["ApiException", "KubeApi", "connect"]


def connect(kubeconfig: Path | None) -> client.ApiClient:
    """An API client from ``kubeconfig``, or from the pod's service account when None.
    ``InvalidRequest`` naming the variable when neither can be read (a broker outside a
    cluster with no kubeconfig, a missing or malformed file)."""
    configuration = client.Configuration()
    try:
        if kubeconfig is None:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(config_file=str(kubeconfig),
                                    client_configuration=configuration)  # fmt: skip
    except (config.ConfigException, OSError, ValueError) as exc:
        where = f"the kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster configuration"
        raise InvalidRequest(
            f"the kubernetes backend cannot read {where}: {exc} (set FIREPOOL_K8S_KUBECONFIG "
            "to a kubeconfig outside a cluster)",
            field="FIREPOOL_K8S_KUBECONFIG",
        ) from None
    return client.ApiClient(configuration)


def _failure(status: int, data: bytes) -> ApiException:
    try:
        body = json.loads(data)
        reason = f"{body.get('reason', '')}: {body.get('message', '')}"
    except (ValueError, AttributeError):
        reason = data[:200].decode("utf-8", "replace")
    return ApiException(status=status, reason=reason)


class KubeApi:
    """Pods and Secrets of one namespace. Every failure is an ``ApiException`` (``status`` 0
    when no answer came: the server could not be reached)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace

    def path(self, kind: str, name: str | None = None) -> str:
        base = f"/api/v1/namespaces/{self.namespace}/{kind}"
        return base if name is None else f"{base}/{name}"

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] = REQUEST_TIMEOUT_S,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        try:
            method, url, headers, body, _ = self.api.param_serialize(
                method, path, query_params=params, header_params=headers, body=body,
                auth_settings=["BearerToken"],
            )  # fmt: skip
            return self.api.call_api(method, url, headers, body, _request_timeout=timeout)
        except ApiException:
            raise
        except Exception as exc:  # urllib3: refused, reset, timed out
            raise ApiException(status=0, reason=f"{type(exc).__name__}: {exc}") from exc

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One call; its JSON answer."""
        response = self._send(method, path, **kwargs)
        data = response.read()
        if not 200 <= response.status < 300:
            raise _failure(response.status, data)
        answer: dict[str, Any] = json.loads(data) if data else {}
        return answer

    def create(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", self.path(kind), body=body)

    def merge_patch(self, kind: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch: ``None`` removes a key, other keys are kept."""
        return self.request("PATCH", self.path(kind, name), body=body, content_type=MERGE_PATCH)

    def delete(self, kind: str, name: str, grace_s: int | None = None) -> bool:
        """False when it was gone already."""
        try:
            self.request("DELETE", self.path(kind, name),
                         query={"gracePeriodSeconds": grace_s})  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def list(self, kind: str, selector: str) -> tuple[list[dict[str, Any]], str | None]:
        """Every object of ``kind`` matching the label ``selector``, and the list's
        resourceVersion (where a watch takes over)."""
        answer = self.request("GET", self.path(kind), query={"labelSelector": selector})
        version = (answer.get("metadata") or {}).get("resourceVersion") or None
        return list(answer.get("items") or ()), version

    def watch(
        self, kind: str, selector: str, version: str | None, timeout_s: int
    ) -> Iterator[dict[str, Any]]:
        """The events of a watch from ``version`` with bookmarks, each ``{type, object}``,
        until the server ends it (``timeout_s``) or no byte came for ``timeout_s`` + 10 s
        (``ApiException`` status 0). Close the iterator to end it early."""
        query = {"labelSelector": selector, "watch": "true", "allowWatchBookmarks": "true",
                 "resourceVersion": version, "timeoutSeconds": timeout_s}  # fmt: skip
        response = self._send("GET", self.path(kind), query=query, timeout=(10, timeout_s + 10))
        raw = response.response
        try:
            if not 200 <= response.status < 300:
                raise _failure(response.status, response.read())
            try:
                for line in iter_resp_lines(raw):
                    if line.strip():
                        yield json.loads(line)
            except (OSError, ValueError) as exc:  # timed out or cut: the caller watches anew
                raise ApiException(status=0, reason=f"watch ended: {exc!r}") from exc
            except Exception as exc:  # urllib3's ReadTimeoutError, ProtocolError
                raise ApiException(status=0, reason=f"watch ended: {exc!r}") from exc
        finally:
            raw.release_conn()
            raw.close()
