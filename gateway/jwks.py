"""Tokens signed by keys published at a JWKS URL (RS256 or ES256): the cluster's
service-account issuer, or a company's OIDC provider.

The key set is fetched and parsed by PyJWT's ``PyJWKClient`` (with ``timeout_s`` per request)
and kept for ``cache_s``. Fetches are bounded, so that no token can make the broker hammer
the endpoint:

- a token whose ``kid`` the cached set lacks makes one refetch at most every ``refresh_s``
  (a rotated key is found within that; forged tokens with made-up ids are refused 401
  without a fetch in between);
- a fetch that fails (the endpoint down or slow, an answer that is no key set) refuses every
  token that needed it with ``Unavailable`` (503, ``Retry-After``), never accepts it, and
  the endpoint is not asked again for ``refresh_s``: a down endpoint is asked once per
  interval, not once per request.

A key is used only for the algorithm it is for (an RSA key for RS256, a P-256 key for ES256,
or the key's own ``alg``), so a token cannot pick how its signature is checked.

Concurrency: ``verify`` is thread-safe and blocks on the network when it fetches (at most
``timeout_s``): call it off the event loop. One lock serialises fetches, so requests that
arrive during a fetch wait for its answer instead of sending their own.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from jwt import PyJWK, PyJWKClient, PyJWKSet
from jwt.exceptions import PyJWKClientError, PyJWKSetError

from functions.errors import Unauthorized, Unavailable

__all__ = ["JWKS_ALGORITHMS", "JwksPolicy", "JwksVerifier"]

JWKS_ALGORITHMS = ("RS256", "ES256")
"""The algorithms a token verified against the key set may use."""


@dataclass(frozen=True, slots=True)
class JwksPolicy:
    """Where the keys are and what a token signed by one of them must say."""

    url: str
    issuer: str
    """The token's ``iss`` must be exactly this."""
    audience: str
    """The token's ``aud`` must be (or contain) this."""
    timeout_s: float = 5.0
    """Longest one fetch of the key set may take."""
    cache_s: float = 300.0
    """How long a fetched key set is used before it is fetched again."""
    refresh_s: float = 30.0
    """Least time between two fetches made for an unknown ``kid`` or after a failed fetch."""
    ca_file: Path | None = None
    """CA bundle for an https URL (the API server's own CA in a cluster); None: the system's."""
    token_file: Path | None = None
    """A file whose text is sent as ``Authorization: Bearer`` with each fetch, read again
    each time (the broker's own service-account token, which the kubelet rotates: the API
    server serves its JWKS to service accounts); None: no credentials are sent."""


def _matching(keys: PyJWKSet, kid: str) -> PyJWK | None:
    for key in keys.keys:
        if key.key_id == kid and key.public_key_use in ("sig", None):
            return key
    return None


class JwksVerifier:
    """Checks tokens against the keys published at ``policy.url`` (see the module's rules)."""

    def __init__(self, policy: JwksPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        context = None
        if policy.ca_file is not None:
            context = ssl.create_default_context(cafile=str(policy.ca_file))
        self._policy = policy
        self._client = PyJWKClient(
            policy.url,
            cache_jwk_set=True,
            lifespan=policy.cache_s,
            timeout=policy.timeout_s,
            ssl_context=context,
        )
        self._clock = clock
        self._lock = threading.Lock()
        self._fetched_at: float | None = None  # under _lock: the last fetch, failed or not
        self._failed = False  # under _lock: whether that fetch failed

    def verify(self, token: str, header: dict[str, Any]) -> dict[str, Any]:
        """The claims of ``token`` (whose unverified ``header`` names an algorithm of
        ``JWKS_ALGORITHMS``) once its signature, ``exp``, ``iss`` and ``aud`` are checked.
        ``Unauthorized`` for a token that is not good, ``Unavailable`` when the key set it
        needs could not be fetched."""
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise Unauthorized("token names no key id (kid): cannot pick its key from the JWKS")
        key = self._key(kid)
        algorithm = header.get("alg")
        if key.algorithm_name != algorithm or algorithm not in JWKS_ALGORITHMS:
            raise Unauthorized(
                f"token algorithm {algorithm!r} does not match its key {kid!r}, "
                f"which is for {key.algorithm_name}"
            )
        policy = self._policy
        try:
            return jwt.decode(
                token,
                key.key,
                algorithms=[algorithm],
                audience=policy.audience,
                issuer=policy.issuer,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.InvalidIssuerError:
            raise Unauthorized(
                f"token of another issuer: this broker accepts {policy.issuer!r}"
            ) from None
        except jwt.InvalidAudienceError:
            raise Unauthorized(
                f"token for another audience: this broker is {policy.audience!r}"
            ) from None
        except jwt.ExpiredSignatureError:
            raise Unauthorized("token expired: ask its issuer for a new one") from None
        except jwt.InvalidSignatureError:
            raise Unauthorized(f"bad token signature: not signed by the JWKS key {kid!r}") from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthorized(f"token lacks the {exc.claim!r} claim") from None
        except jwt.ImmatureSignatureError:
            raise Unauthorized("token not yet valid") from None
        except jwt.PyJWTError:
            raise Unauthorized("invalid token") from None

    def _key(self, kid: str) -> PyJWK:
        """The signing key ``kid`` names, from the cached set or one bounded fetch."""
        with self._lock:
            cached = self._client.jwk_set_cache.get() if self._client.jwk_set_cache else None
            key = None if cached is None else _matching(cached, kid)
            if key is not None:
                return key
            now = self._clock()
            wait = (
                0.0 if self._fetched_at is None else self._fetched_at + self._policy.refresh_s - now
            )
            if wait > 0 and self._failed:
                raise Unavailable(
                    f"the JWKS at {self._policy.url} could not be fetched; "
                    f"asked again in {wait:.0f} s",
                    retry_after_s=wait,
                )
            if wait > 0 and cached is not None:
                raise Unauthorized(f"unknown key id {kid!r}: not in the JWKS")
            self._fetched_at = now
            try:
                if self._policy.token_file is not None:
                    credential = self._policy.token_file.read_text().strip()
                    self._client.headers = {"Authorization": f"Bearer {credential}"}
                keys = self._client.get_jwk_set(refresh=True)
            except (PyJWKClientError, PyJWKSetError, ValueError, OSError) as exc:
                # PyJWKClientError covers connection errors, timeouts and HTTP errors;
                # PyJWKSetError and ValueError an answer that is no key set; OSError a
                # token file that cannot be read.
                self._failed = True
                raise Unavailable(
                    f"the JWKS at {self._policy.url} could not be fetched ({exc})",
                    retry_after_s=self._policy.refresh_s,
                ) from None
            self._failed = False
        key = _matching(keys, kid)
        if key is None:
            raise Unauthorized(f"unknown key id {kid!r}: not in the JWKS")
        return key
