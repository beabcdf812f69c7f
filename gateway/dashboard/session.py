"""Who may see the dashboard: an admin token, from the login cookie or a bearer header.

The login form takes a token (``firepool token --role admin``), checks it with the API's own
``Authenticator`` and sets it as an ``HttpOnly``, ``SameSite=Strict`` cookie scoped to
``/dashboard`` that lives no longer than the token. A token without the admin role is refused
with 403 at login and on every page.

CSRF: every page is a read (GET); the only writes are the login and logout forms, which are
refused (403) when the browser says they came from another site (``Origin`` not this host,
or ``Sec-Fetch-Site`` ``cross-site``/``same-site``). A cross-site request never carries the
cookie anyway (``SameSite=Strict``), and no page can be framed (``SECURITY_HEADERS``).
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import Response

from functions.errors import Forbidden, InvalidRequest, TooLarge
from gateway.auth import Authenticator, Principal, Role

COOKIE = "firepool_dashboard"
COOKIE_PATH = "/dashboard"
MAX_SESSION_S = 8 * 3600
"""The longest a login lasts (less when the token expires sooner)."""
MAX_FORM_BYTES = 16 * 1024
"""Largest login form accepted: a token is well under 1 KiB."""
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
"""On every dashboard answer: scripts and styles from this server only, no framing, no
caching of pages that show other callers' jobs, no URL of a page (job ids) sent to another
site. (``no-referrer`` would make Chromium send ``Origin: null`` with the login form.)"""


async def dashboard_admin(request: Request) -> Principal:
    """The admin behind ``request``: its login cookie, else its ``Authorization`` header.
    ``Unauthorized`` without a valid token, ``Forbidden`` for a token without the admin
    role."""
    auth: Authenticator = request.app.state.auth
    token = request.cookies.get(COOKIE)
    header = f"Bearer {token}" if token else request.headers.get("authorization")
    principal = await auth.authenticate_async(header)
    principal.require(Role.ADMIN)
    return principal


def check_same_origin(request: Request) -> None:
    """``Forbidden`` for a form posted from another site (see the module's CSRF rule)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise Forbidden(f"a dashboard form must be sent from the dashboard (sent {site})")
    origin = request.headers.get("origin")
    if origin is not None:
        host = request.headers.get("host", "")
        if origin not in (f"http://{host}", f"https://{host}"):
            raise Forbidden("a dashboard form must be sent from the dashboard's own origin")


async def login_token(request: Request) -> str:
    """The ``token`` field of the urlencoded login form. ``TooLarge`` past
    ``MAX_FORM_BYTES``; ``InvalidRequest`` without exactly one non-empty token."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise TooLarge(f"the login form is over {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode(), strict_parsing=False, max_num_fields=8)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("the login form is not urlencoded text", field="token") from None
    tokens = [t.strip() for t in fields.get("token", [])]
    if len(tokens) != 1 or not tokens[0]:
        raise InvalidRequest("paste one token into the form", field="token")
    return tokens[0]


async def admin_of_token(request: Request, token: str) -> Principal:
    """The admin ``token`` names (``Unauthorized``/``Forbidden`` as ``dashboard_admin``)."""
    auth: Authenticator = request.app.state.auth
    principal = await auth.authenticate_async(f"Bearer {token}")
    principal.require(Role.ADMIN)
    return principal


def set_session(response: Response, request: Request, token: str, principal: Principal) -> None:
    """Put ``token`` in the login cookie, for as long as it and ``MAX_SESSION_S`` allow."""
    lasts = max(1, min(MAX_SESSION_S, int(principal.expires - time.time())))
    response.set_cookie(
        COOKIE,
        token,
        max_age=lasts,
        path=COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def end_session(response: Response) -> None:
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
