"""The web view's HTTP side, without sockets: which request gets which bytes.

Routes (GET only; anything else is 405, nothing changes state): ``/`` the page,
``/app.js`` and ``/app.css`` its script and style (served here, so the page works
offline), ``/api/view`` the view document (:mod:`lowtide.service.web.view`).

Who may look: with a shared secret, only a browser that shows the token derived from
it (:func:`lowtide.service.auth.web_token`): once as ``/?token=T`` (the login link
``lowtide serve`` prints), which answers with a cookie and a redirect that drops the
token from the address bar, or as ``Authorization: Bearer T`` (scripts). Without a
secret the server is loopback only (``ServerConfig`` refuses other binds), and a
request must name a loopback host: a web page elsewhere that rebinds its own DNS name
to 127.0.0.1 cannot read the view through the visitor's browser.
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs, urlsplit

from lowtide.service.auth import is_loopback, web_token
from lowtide.service.net import HttpReply, HttpRequest
from lowtide.service.web.page import APP_CSS, APP_JS, PAGE_HTML
from lowtide.service.web.view import WebView

COOKIE = "lowtide_web"
#: The page loads only its own script, style and data, may not be framed, and sends
#: no referrer (a login link's token must not leak to another site).
SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
ASSETS = {
    "/": ("text/html; charset=utf-8", PAGE_HTML.encode()),
    "/app.js": ("text/javascript; charset=utf-8", APP_JS.encode()),
    "/app.css": ("text/css; charset=utf-8", APP_CSS.encode()),
}
LOGIN_HELP = (
    b"lowtide web view: open the login link `lowtide serve` printed "
    b"(http://HOST:PORT/?token=...), or send the header Authorization: Bearer TOKEN\n"
)


def is_loopback_host(host_header: str) -> bool:
    """Whether a Host header (``name``, ``name:port``, ``[v6]:port``) is loopback."""
    host = host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header
    host = host.partition("]")[0].lstrip("[") if host.startswith("[") else host
    return is_loopback(host.lower())


def cookie_value(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


class WebApp:
    """Answers the web view's requests from ``view``; ``secret`` None means
    loopback only and no login."""

    def __init__(self, view: WebView, secret: bytes | None) -> None:
        self.view = view
        self._token = None if secret is None else web_token(secret)

    @property
    def token(self) -> str | None:
        return self._token

    def respond(self, request: HttpRequest) -> HttpReply:
        if request.method != "GET":
            return self._reply(405, b"read-only: GET only\n", extra=(("Allow", "GET"),))
        parts = urlsplit(request.target)
        if self._token is None:
            if not is_loopback_host(request.headers.get("host", "localhost")):
                return self._reply(403, b"this view answers loopback host names only\n")
        else:
            given = parse_qs(parts.query).get("token", [""])[0]
            if given and self._valid(given):
                return self._login(parts.path or "/")
            if not self._authorized(request):
                return self._reply(
                    401, LOGIN_HELP, extra=(("WWW-Authenticate", 'Bearer realm="lowtide"'),)
                )
        return self._route(parts.path)

    def _route(self, path: str) -> HttpReply:
        if path == "/api/view":
            return self._reply(200, self.view.body, "application/json")
        if path in ASSETS:
            content_type, body = ASSETS[path]
            return self._reply(200, body, content_type)
        return self._reply(404, b"not found: the view is at /\n")

    def _login(self, path: str) -> HttpReply:
        cookie = f"{COOKIE}={self._token}; Path=/; HttpOnly; SameSite=Strict"
        return self._reply(303, b"", extra=(("Location", path), ("Set-Cookie", cookie)))

    def _authorized(self, request: HttpRequest) -> bool:
        bearer = request.headers.get("authorization", "")
        if bearer.startswith("Bearer ") and self._valid(bearer[len("Bearer "):].strip()):
            return True
        given = cookie_value(request.headers.get("cookie", ""), COOKIE)
        return given is not None and self._valid(given)

    def _valid(self, given: str) -> bool:
        assert self._token is not None
        return hmac.compare_digest(given.encode(), self._token.encode())

    @staticmethod
    def _reply(
        status: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        extra: tuple[tuple[str, str], ...] = (),
    ) -> HttpReply:
        return HttpReply(status, body, content_type, SECURITY_HEADERS + extra)
