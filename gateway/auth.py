"""Bearer-token authentication: the broker's own HS256 JWTs, signed with a key kept in the
state directory, and, when configured, tokens of an outside issuer checked against its JWKS
(``gateway.jwks``: RS256/ES256; the cluster's service-account issuer, a company's OIDC).

The token's header ``alg`` picks the check: HS256 against the broker's key, RS256/ES256
against the JWKS, anything else (``none`` included) is refused, so a token cannot choose to
be checked with a key meant for another algorithm (an HS256 token "signed" with a published
public key fails the broker's key). Validation checks ``exp`` and ``aud`` (and ``iss`` for
JWKS tokens); validated tokens are cached (cachetools) until they expire, so a hit costs a
dict lookup. The caller identity is the broker token's ``sub`` or the outside token's
configured claim, never a body field.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import anyio.to_thread
import jwt
from cachetools import TTLCache

from broker.keys import load_key, load_or_create_key
from broker.settings import Settings
from functions.errors import Forbidden, Unauthorized
from gateway.jwks import JWKS_ALGORITHMS, JwksPolicy, JwksVerifier

__all__ = [
    "ALGORITHMS",
    "Authenticator",
    "OutsideIdentity",
    "Principal",
    "Role",
    "authenticator_for",
    "load_key",
    "load_or_create_key",
]

ALGORITHMS = ["HS256"]


class Role(StrEnum):
    INVOKE = "invoke"
    DEPLOY = "deploy"
    ADMIN = "admin"


_RANK = {Role.INVOKE: 0, Role.DEPLOY: 1, Role.ADMIN: 2}
_ROLE_NAMES = frozenset(role.value for role in Role)


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


@dataclass(frozen=True, slots=True)
class OutsideIdentity:
    """Tokens of an outside issuer: the keys that sign them, and which claims name the caller
    and its role. ``role_claim`` None, or absent from a token: ``default_role``. A string
    claim must be a role; a list (an OIDC ``groups``) gives the highest role it names, else
    ``default_role``."""

    verifier: JwksVerifier
    caller_claim: str = "sub"
    role_claim: str | None = None
    default_role: Role = Role.INVOKE
    caller_prefix: str = ""
    """Put before the claimed caller (``Settings.jwt_caller_prefix``)."""

    def principal(self, claims: dict[str, Any]) -> Principal:
        caller = claims.get(self.caller_claim)
        if not isinstance(caller, str) or not caller:
            raise Unauthorized(f"token's {self.caller_claim!r} claim must be a non-empty string")
        return Principal(
            caller=self.caller_prefix + caller,
            role=self._role(claims),
            expires=float(claims["exp"]),
        )

    def _role(self, claims: dict[str, Any]) -> Role:
        named = None if self.role_claim is None else claims.get(self.role_claim)
        if named is None:
            return self.default_role
        if isinstance(named, str):
            try:
                return Role(named)
            except ValueError:
                raise Unauthorized(f"unknown role {named!r} in {self.role_claim!r}") from None
        if isinstance(named, list):
            roles = [Role(r) for r in named if isinstance(r, str) and r in _ROLE_NAMES]
            return max(roles, key=_RANK.__getitem__, default=self.default_role)
        raise Unauthorized(f"token's {self.role_claim!r} claim must be a role or a list")


def _refusal(exc: jwt.PyJWTError, allowed: list[str]) -> str:
    """Why a token was refused, in the API's words: what is wrong with it (malformed, a bad
    signature, expired, ...), never the decoder's own message, which names its internals
    (base64 padding, header segments, JSON offsets)."""
    if isinstance(exc, jwt.ExpiredSignatureError):
        return "token expired: mint a new one (`firepool token`)"
    if isinstance(exc, jwt.InvalidSignatureError):  # a DecodeError: tested first
        return "bad token signature: not signed by this broker's key"
    if isinstance(exc, jwt.InvalidAlgorithmError):
        return f"token algorithm not allowed (allowed: {', '.join(allowed)})"
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
    """Mints and validates tokens. Thread-safe; the cache has its own lock. ``authenticate``
    may block on a JWKS fetch (``gateway.jwks``); on the event loop use
    ``authenticate_async``, which runs only such checks in a worker thread."""

    def __init__(
        self,
        key: bytes,
        audience: str = "firepool",
        cache_size: int = 4096,
        outside: OutsideIdentity | None = None,
    ) -> None:
        self._key = key
        self._audience = audience
        self._outside = outside
        self._algorithms = ALGORITHMS + (list(JWKS_ALGORITHMS) if outside else [])
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
        """The caller ``header`` (``Bearer <token>``) proves; ``Unauthorized`` if none,
        ``Unavailable`` when its issuer's keys cannot be fetched."""
        token = _bearer(header)
        return self._cached(token) or self._validate(token)

    async def authenticate_async(self, header: str | None) -> Principal:
        """``authenticate`` for the event loop: a cached token or a broker token is checked
        here; an outside token, whose check may fetch keys, in a worker thread."""
        token = _bearer(header)
        cached = self._cached(token)
        if cached is not None:
            return cached
        if self._outside_header(token) is not None:
            return await anyio.to_thread.run_sync(self._validate, token)
        return self._validate(token)

    def _cached(self, token: str) -> Principal | None:
        with self._lock:
            cached = self._cache.get(token)
        return cached if cached is not None and cached.expires > time.time() else None

    def _validate(self, token: str) -> Principal:
        header = self._outside_header(token)
        if self._outside is not None and header is not None:
            principal = self._outside.principal(self._outside.verifier.verify(token, header))
        else:
            principal = self._validate_own(token)
        with self._lock:
            self._cache[token] = principal
        return principal

    def _outside_header(self, token: str) -> dict[str, Any] | None:
        """The token's (unverified) header if it is for the outside issuer: one is configured
        and the header names an algorithm of ``JWKS_ALGORITHMS``. A malformed token is not:
        the broker's own check refuses it as malformed."""
        if self._outside is None:
            return None
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return None
        return header if header.get("alg") in JWKS_ALGORITHMS else None

    def _validate_own(self, token: str) -> Principal:
        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=ALGORITHMS,
                audience=self._audience,
                options={"require": ["exp", "sub", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise Unauthorized(_refusal(exc, self._algorithms)) from None
        try:
            role = Role(claims.get("role", "invoke"))
        except ValueError:
            raise Unauthorized(f"unknown role {claims.get('role')!r}") from None
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub:
            raise Unauthorized("token subject must be a non-empty string")
        return Principal(caller=sub, role=role, expires=float(claims["exp"]))


def _bearer(header: str | None) -> str:
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:  # the scheme is case-insensitive (RFC 7235)
        raise Unauthorized("missing bearer token")
    return token


def authenticator_for(key: bytes, settings: Settings) -> Authenticator:
    """The broker's authenticator: its own tokens, and an outside issuer's when
    ``settings.jwks_url`` is set (``Settings`` has checked its issuer is too)."""
    outside = None
    if settings.jwks_url is not None and settings.jwt_issuer is not None:
        policy = JwksPolicy(
            url=settings.jwks_url,
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience or settings.audience,
            timeout_s=settings.jwks_timeout_s,
            cache_s=settings.jwks_cache_s,
            refresh_s=settings.jwks_refresh_s,
            ca_file=settings.jwks_ca_file,
            token_file=settings.jwks_token_file,
        )
        outside = OutsideIdentity(
            JwksVerifier(policy),
            caller_claim=settings.jwt_caller_claim,
            role_claim=settings.jwt_role_claim,
            default_role=Role(settings.jwt_default_role),
            caller_prefix=settings.jwt_caller_prefix,
        )
    return Authenticator(key, settings.audience, settings.token_cache_size, outside)
