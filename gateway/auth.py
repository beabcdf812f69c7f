"""Bearer-token authentication: HS256 JWTs signed with a key kept in the state directory.

Validation checks the algorithm allowlist, ``exp``, ``aud`` and ``sub``; validated tokens are
cached (cachetools) until they expire, so a hit costs a dict lookup. The caller identity is the
token's ``sub``, never a body field.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import StrEnum

import jwt
from cachetools import TTLCache

from broker.keys import load_key, load_or_create_key
from functions.errors import Forbidden, Unauthorized

__all__ = ["ALGORITHMS", "Authenticator", "Principal", "Role", "load_key", "load_or_create_key"]

ALGORITHMS = ["HS256"]


class Role(StrEnum):
    INVOKE = "invoke"
    DEPLOY = "deploy"
    ADMIN = "admin"


_RANK = {Role.INVOKE: 0, Role.DEPLOY: 1, Role.ADMIN: 2}


@dataclass(frozen=True, slots=True)
class Principal:
    caller: str
    role: Role
    expires: float

    def require(self, role: Role) -> None:
        if _RANK[self.role] < _RANK[role]:
            raise Forbidden(f"this route needs the {role} role; the token has {self.role}")

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


def _refusal(exc: jwt.PyJWTError) -> str:
    """Why a token was refused, in the API's words: what is wrong with it (malformed, a bad
    signature, expired, ...), never the decoder's own message, which names its internals
    (base64 padding, header segments, JSON offsets)."""
    if isinstance(exc, jwt.ExpiredSignatureError):
        return "token expired: mint a new one (`firepool token`)"
    if isinstance(exc, jwt.InvalidSignatureError):  # a DecodeError: tested first
        return "bad token signature: not signed by this broker's key"
    if isinstance(exc, jwt.InvalidAlgorithmError):
        return f"token algorithm not allowed (allowed: {', '.join(ALGORITHMS)})"
    if isinstance(exc, jwt.DecodeError):
        return "malformed token: not a JSON Web Token"
    if isinstance(exc, jwt.InvalidAudienceError):
        return "token for another audience: not minted for this broker"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"token lacks the {exc.claim!r} claim"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "token not yet valid"
    if isinstance(exc, jwt.exceptions.InvalidSubjectError):
        return "token subject must be a non-empty string"
    return "invalid token"


class Authenticator:
    """Mints and validates tokens. Thread-safe; the cache has its own lock."""

    def __init__(self, key: bytes, audience: str = "firepool", cache_size: int = 4096) -> None:
        self._key = key
        self._audience = audience
        self._cache: TTLCache[str, Principal] = TTLCache(maxsize=cache_size, ttl=300)
        self._lock = threading.Lock()

    def mint(self, caller: str, role: Role = Role.INVOKE, ttl_s: int = 86400) -> str:
        now = int(time.time())
        claims = {
            "sub": caller,
            "role": str(role),
            "aud": self._audience,
            "iat": now,
            "exp": now + ttl_s,
        }
        return jwt.encode(claims, self._key, algorithm="HS256")

    def authenticate(self, header: str | None) -> Principal:
        scheme, _, token = (header or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:  # the scheme is case-insensitive (RFC 7235)
            raise Unauthorized("missing bearer token")
        now = time.time()
        with self._lock:
            cached = self._cache.get(token)
        if cached is not None and cached.expires > now:
            return cached
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=ALGORITHMS,
                audience=self._audience,
                options={"require": ["exp", "sub", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise Unauthorized(_refusal(exc)) from None
        try:
            role = Role(claims.get("role", "invoke"))
        except ValueError:
            raise Unauthorized(f"unknown role {claims.get('role')!r}") from None
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub:
            raise Unauthorized("token subject must be a non-empty string")
        principal = Principal(caller=sub, role=role, expires=float(claims["exp"]))
        with self._lock:
            self._cache[token] = principal
        return principal
