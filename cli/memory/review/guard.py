"""The review app's door: who may get a page at all, and the headers every answer carries.

Closed by default. A request carries one of two credentials: the server's random token
as the first path segment (`/t/TOKEN/…`, the URL `engram review` prints: in the path so
that plain HTTP clients and GET forms carry it too), or the session cookie that a
one-time launch link set. Every request must also name the server itself in `Host` (no
DNS rebinding), and, when the browser says where it comes from, come from the page's own
origin (`Origin`, `Sec-Fetch-Site`). Anything else is a 403 with a one-line reason and
nothing of the memory.

Launch links (`/launch/CODE`): a browser started with a URL shows that URL to every
account on the machine (`ps`, /proc/PID/cmdline) for as long as it runs, so the link that
leaves the process (`--open`, or one clicked in a terminal) never carries the token. Its
code works once, within `LAUNCH_TTL` seconds: it answers with an HttpOnly, SameSite=Strict
cookie holding the token (host-only: 127.0.0.1, Path=/) and a redirect to the page,
served at the root (`/`, `/m/SLUG`, …) for a browser that holds the cookie. A used or
expired code is refused; the cookie's name carries the port, so two servers' cookies
never overwrite each other.

`Origin: null`: the Fetch standard makes Chromium send `null` on a same-page form post
when the page's referrer policy is `no-referrer`. The pages here say `same-origin`
instead, so the browser names the real origin on their own posts, and `null` (what a
sandboxed frame, a `data:` or `file:` page sends) is refused like any foreign origin.

Actions are POSTs that also need a CSRF field: an HMAC of the action's path under a
secret of the server's life, so a token of one form does not authorize another.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# No script at all, nothing from elsewhere, no framing; styles from the app's own file.
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"referrer-policy", b"same-origin"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
ALLOWED_FETCH_SITES = {"same-origin", "none"}  # `none`: typed, opened from a terminal
FORM_CAP = 1 << 20  # a value is at most 65,535 bytes; URL-encoded it is at most ~3x that
LAUNCH_TTL = 60.0  # seconds a launch link works (once)
LAUNCH_KEEP = 16  # launch codes waiting for their use, and spent ones remembered (bounds)
LAUNCH_PREFIX = "/launch/"


def new_token() -> str:
    """A fresh token for one server's life: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


class Guard:
    """ASGI middleware in front of the review app: credentials, Host, Origin, headers,
    activity.

    `last_request` is the monotonic time of the last request that passed the door (the
    idle timeout counts from it; refused requests do not keep the server alive).
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        host: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.token = token
        self.prefix = f"/t/{token}"
        self.host = host  # "127.0.0.1:PORT": what the printed URL names
        self.origin = f"http://{host}"
        self.cookie = "engram_review_" + host.rsplit(":", 1)[-1]
        self.clock = clock
        self.last_request = clock()
        self._launches: OrderedDict[str, float] = OrderedDict()  # code -> deadline
        self._spent: OrderedDict[str, None] = OrderedDict()

    def launch_link(self) -> str:
        """A fresh one-time link to the page that does not carry the token: it works once,
        within LAUNCH_TTL seconds (at most LAUNCH_KEEP wait at once; the oldest goes)."""
        code = secrets.token_urlsafe(32)
        self._launches[code] = self.clock() + LAUNCH_TTL
        while len(self._launches) > LAUNCH_KEEP:
            self._launches.popitem(last=False)
        return f"{self.origin}{LAUNCH_PREFIX}{code}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        if scope["type"] != "http":  # no websockets here
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path: str = scope["path"]
        why = self.foreign(headers)
        if why is None and path.startswith(LAUNCH_PREFIX):
            why = self.launch(path[len(LAUNCH_PREFIX) :])
            if why is None:
                self.last_request = self.clock()
                cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                await redirect(send_secured, "/", 303, [(b"set-cookie", cookie.encode())])
                return
        root = None
        if why is None:
            root, why = self.credential(path, headers)
        if why is not None or root is None:
            await refuse(send_secured, why or "refused")
            return
        self.last_request = self.clock()
        if path == self.prefix:
            await redirect(send_secured, self.prefix + "/")
            return
        scope = dict(scope, root_path=scope.get("root_path", "") + root)
        await self.app(scope, receive, send_secured)

    def foreign(self, headers: dict[str, str]) -> str | None:
        """Why a request that names another host, origin or site is refused, or None."""
        if headers.get("host") != self.host:
            return "wrong Host header: open the URL that engram review printed"
        origin = headers.get("origin")
        if origin is not None and origin != self.origin:
            return f"requests from another origin ({origin}) are refused"
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ALLOWED_FETCH_SITES:
            return f"requests from another site ({site}) are refused"
        return None

    def launch(self, code: str) -> str | None:
        """Spend the launch code `code`; why it cannot be used, or None."""
        now = self.clock()
        for known, deadline in list(self._launches.items()):  # expired codes go first
            if deadline <= now:
                del self._launches[known]
                self._spend(known)
        given = code.encode()
        found = next((k for k in self._launches if hmac.compare_digest(k.encode(), given)), None)
        if found is not None:
            del self._launches[found]
            self._spend(found)
            return None
        if any(hmac.compare_digest(k.encode(), given) for k in self._spent):
            return (
                "this launch link was used already, or is older than "
                f"{LAUNCH_TTL:g} s: it works once. Open the URL that engram review printed; "
                "if you did not open this link yourself, someone else may have: stop the "
                "server (Ctrl-C)"
            )
        return "this launch link is not known: open the URL that engram review printed"

    def _spend(self, code: str) -> None:
        self._spent[code] = None
        while len(self._spent) > LAUNCH_KEEP:
            self._spent.popitem(last=False)

    def credential(self, path: str, headers: dict[str, str]) -> tuple[str | None, str | None]:
        """(the app's root path, None) for a request with the token in its path or the
        session cookie, else (None, why)."""
        if path.startswith("/t/"):
            segment = path[len("/t/") :].split("/", 1)[0]
            if hmac.compare_digest(segment.encode(), self.token.encode()):
                return self.prefix, None
        elif hmac.compare_digest(self._cookie_of(headers).encode(), self.token.encode()):
            return "", None
        return None, "this page needs the URL (with its token) that engram review printed"

    def _cookie_of(self, headers: dict[str, str]) -> str:
        """The value of this server's cookie in the request's Cookie header, or ""."""
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.cookie:
                return value.strip()
        return ""


async def refuse(send: Send, why: str, status: int = 403) -> None:
    body = f"{status} {why}\n".encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def redirect(
    send: Send, location: str, status: int = 308, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"location", location.encode()),
                (b"content-length", b"0"),
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


class Csrf:
    """Per-action CSRF fields: HMAC-SHA256(server secret, action path), hex."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def token(self, action: str) -> str:
        return hmac.new(self._secret, action.encode(), "sha256").hexdigest()

    def valid(self, action: str, value: str | None) -> bool:
        return value is not None and hmac.compare_digest(self.token(action), value)


class FormError(Exception):
    """A form the app cannot take: the status to answer and why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


async def read_form(request: Request, cap: int = FORM_CAP) -> dict[str, str]:
    """A URL-encoded form of at most `cap` bytes, each field's last value (UTF-8, strict).

    Only `application/x-www-form-urlencoded` (what a plain form sends); the body is read
    in chunks and refused past the cap, before it is all in memory."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise FormError(415, "actions take a plain URL-encoded form")
    size = request.headers.get("content-length")
    if size is not None and (not size.isdigit() or int(size) > cap):
        raise FormError(413, f"the form is larger than {cap:,} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cap:
            raise FormError(413, f"the form is larger than {cap:,} bytes")
    try:
        text = bytes(body).decode("ascii")
        fields = parse_qs(text, keep_blank_values=True, strict_parsing=False, errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormError(400, "the form is not valid URL-encoded UTF-8") from exc
    return {name: values[-1] for name, values in fields.items()}
