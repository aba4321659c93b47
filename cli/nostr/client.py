"""A small Nostr relay client for the CLI: NIP-01 REQ/EVENT, NIP-42 AUTH, NIP-11.

Transport only: it moves events, it never decrypts them. Every failure becomes one of
two exceptions so the CLI can map it to an exit code: `RelayError` (network, TLS, a
relay refusal: exit 2) or `AuthError` (NIP-42 refused, a read gated: exit 3). Timeouts
are the caller's: it wraps the whole exchange in `asyncio.timeout`.

Authentication is answered when the relay asks (one policy for REQ, EVENT and NEG-OPEN:
`answer_auth_required`): a relay that sends a NIP-42 challenge
(on connect, or with an `auth-required:` refusal) gets a signed AUTH and the request
is sent again; a relay that never challenges (nostr-sdk's LocalRelay) is simply used.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import ssl
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import websockets
from websockets.asyncio.client import ClientConnection, connect

from cli.nostr.errors import AuthError, RelayError
from engram.nip01 import Event
from engram.nip42 import auth_event

# An engram body is at most 65,535 bytes; its base64 NIP-44 payload plus the event fits in 1 MiB.
MAX_FRAME = 1 << 20
# NIP-01 prefixes of a refusal for who the client is, not for what it sent: the one place
# the client library tells them apart (AuthError rather than RelayError; AUTH may help).
AUTH_REQUIRED = "auth-required:"
GATED = (AUTH_REQUIRED, "restricted:")
OPEN_TIMEOUT = 30.0  # seconds for the TCP, TLS and websocket handshakes


__all__ = [
    "AuthError",
    "RelayClient",
    "RelayError",
    "connect_relay",
    "fetch_nip11",
    "limitation",
    "max_limit_of",
    "open_relay",
]


def _describe(exc: BaseException) -> str:
    """One line naming a transport failure; TLS verification failures are called out."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS certificate verification failed: {cause.verify_message or cause}"
        if isinstance(cause, ssl.SSLError):
            return f"TLS error: {cause}"
        cause = cause.__cause__ or cause.__context__
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def http_url(relay_url: str) -> str:
    """ws(s)://host/path -> http(s)://host/path, where NIP-11 is served."""
    parts = urlsplit(relay_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme)
    if scheme is None:
        raise ValueError(f"relay URL must start with ws:// or wss://: {relay_url!r}")
    return urlunsplit((scheme, parts.netloc, parts.path or "/", parts.query, ""))


def _get_json(url: str, timeout: float) -> Any:
    req = urllib.request.Request(url, headers={"Accept": "application/nostr+json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # default TLS context
        return json.loads(resp.read(MAX_FRAME))


async def fetch_nip11(relay_url: str, timeout: float) -> dict[str, Any]:
    """The relay's NIP-11 information document (a JSON object)."""
    try:
        doc = await asyncio.to_thread(_get_json, http_url(relay_url), timeout)
    except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError is an OSError
        raise RelayError(f"cannot read the relay's NIP-11 document: {_describe(exc)}") from exc
    if not isinstance(doc, dict):
        raise RelayError("the relay's NIP-11 document is not a JSON object")
    return doc


def is_gated(reason: str) -> bool:
    """The relay refused for who the client is (`auth-required:` or `restricted:`)."""
    return reason.startswith(GATED)


def limitation(nip11: dict[str, Any], name: str) -> int | None:
    """NIP-11 `limitation.<name>` if the relay advertises a positive integer, else None
    (absent, malformed or zero: the client then keeps its own default)."""
    limits = nip11.get("limitation")
    value = limits.get(name) if isinstance(limits, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def max_limit_of(nip11: dict[str, Any]) -> int | None:
    """`limitation.max_limit`: the most events the relay returns for one filter."""
    return limitation(nip11, "max_limit")


class RelayClient:
    """One websocket connection; requests run one at a time, as the CLI needs.

    With `seckey`, a NIP-42 challenge is answered before the request it came with is
    used: frames arrive in order, so a challenge sent on connect is seen before the answer
    to the first REQ, which is then asked again once authenticated.
    """

    def __init__(self, ws: ClientConnection, url: str, seckey: bytes | None = None) -> None:
        self._ws = ws
        self.url = url
        self._seckey = seckey
        self._challenge: str | None = None
        self._authenticated = False
        self._sub_counter = 0
        self._oks: dict[str, tuple[bool, str]] = {}

    async def recv(self) -> list[Any]:
        """Next frame as a JSON array; an AUTH challenge is remembered wherever it appears."""
        while True:
            try:
                raw = await self._ws.recv()
            except websockets.ConnectionClosed as exc:
                raise RelayError(f"relay closed the connection: {_describe(exc)}") from exc
            try:
                msg = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                continue  # not JSON: nothing a Nostr client can act on
            if not isinstance(msg, list) or not msg or not isinstance(msg[0], str):
                continue
            if msg[0] == "AUTH" and len(msg) >= 2 and isinstance(msg[1], str):
                self._challenge = msg[1]
            return msg

    async def send(self, msg: list[Any]) -> None:
        """One frame (a JSON array): what the request methods, and `engram sync`'s NIP-77
        exchange, are made of."""
        try:
            await self._ws.send(msgspec.json.encode(msg).decode())
        except websockets.ConnectionClosed as exc:
            raise RelayError(f"relay closed the connection: {_describe(exc)}") from exc

    async def close(self) -> None:
        await self._ws.close()

    def _should_auth(self) -> bool:
        return self._seckey is not None and self._challenge is not None and not self._authenticated

    async def authenticate(self, seckey: bytes | None = None) -> None:
        """Answer the relay's NIP-42 challenge with a signed kind 22242 event."""
        seckey = seckey if seckey is not None else self._seckey
        if seckey is None:
            raise AuthError("the relay asks for authentication and no key is held")
        self._seckey = seckey
        while self._challenge is None:  # relays send it on connect (NIP-42)
            await self.recv()
        challenge = self._challenge
        event = auth_event(seckey, self.url, challenge, int(time.time()), os.urandom(32))
        await self.send(["AUTH", event])
        accepted, message = await self._wait_ok(event.id)
        if not accepted:
            raise AuthError(f"relay refused AUTH: {message or 'no reason given'}")
        self._authenticated = True

    async def _wait_ok(self, event_id: str) -> tuple[bool, str]:
        while event_id not in self._oks:
            msg = await self.recv()
            if msg[0] == "OK" and len(msg) >= 3 and isinstance(msg[1], str):
                self._oks[msg[1]] = (bool(msg[2]), str(msg[3]) if len(msg) > 3 else "")
        return self._oks.pop(event_id)

    async def _query_once(self, filters: list[dict[str, Any]]) -> tuple[list[Event], str | None]:
        self._sub_counter += 1
        sub_id = f"engram-{self._sub_counter}"
        await self.send(["REQ", sub_id, *filters])
        events: list[Event] = []
        while True:
            msg = await self.recv()
            if msg[0] == "AUTH" and self._should_auth():
                # Challenged mid-request: this answer would be the unauthenticated one.
                await self.send(["CLOSE", sub_id])
                return events, None
            if len(msg) < 2 or msg[1] != sub_id:
                if msg[0] == "OK" and len(msg) >= 3 and isinstance(msg[1], str):
                    self._oks[msg[1]] = (bool(msg[2]), str(msg[3]) if len(msg) > 3 else "")
                continue
            if msg[0] == "EVENT" and len(msg) >= 3:
                try:
                    events.append(msgspec.convert(msg[2], Event))
                except msgspec.ValidationError:
                    continue
            elif msg[0] == "EOSE":
                await self.send(["CLOSE", sub_id])
                return events, None
            elif msg[0] == "CLOSED":
                return events, str(msg[2]) if len(msg) > 2 else ""

    async def answer_auth_required(self, reason: str) -> bool:
        """The one AUTH policy for a refusal: an `auth-required:` answer (to a REQ, an EVENT
        or a NEG-OPEN) is met with AUTH once, when a key is held. True: ask again."""
        if not reason.startswith(AUTH_REQUIRED) or self._seckey is None:
            return False
        if self._authenticated:
            return False  # authenticated and still refused: AUTH cannot help
        await self.authenticate()
        return True

    async def query(self, nostr_filter: dict[str, Any] | list[dict[str, Any]]) -> list[Event]:
        """Stored events matching a filter (or any of a list of filters, in one REQ), up to
        EOSE. Malformed events are dropped."""
        filters = nostr_filter if isinstance(nostr_filter, list) else [nostr_filter]
        if self._should_auth():
            await self.authenticate()
        while True:
            events, closed = await self._query_once(filters)
            if self._should_auth():  # challenged mid-request: ask again, authenticated
                await self.authenticate()
                continue
            if closed is None:
                return events
            if await self.answer_auth_required(closed):
                continue
            if is_gated(closed):
                raise AuthError(f"relay refused the read: {closed}")
            raise RelayError(f"relay closed the subscription: {closed or 'no reason'}")

    async def publish(self, event: Event) -> str:
        """Send an event; returns the OK message. A refusal raises RelayError/AuthError."""
        return (await self.publish_many([event]))[event.id]

    async def publish_many(self, events: list[Event], window: int = 256) -> dict[str, str]:
        """Send events, up to `window` awaiting their OK at once; id -> OK message.

        The first refusal raises (RelayError or AuthError); `try_publish_many` collects them.
        """
        results = await self.try_publish_many(events, window)
        out: dict[str, str] = {}
        for event in events:
            accepted, message = results[event.id]
            if not accepted:
                if is_gated(message):
                    raise AuthError(f"relay refused the event: {message}")
                raise RelayError(f"relay refused the event: {message or 'no reason given'}")
            out[event.id] = message
        return out

    async def try_publish_many(
        self, events: list[Event], window: int = 256
    ) -> dict[str, tuple[bool, str]]:
        """Send events pipelined; id -> (accepted, message). Asked to authenticate, it does
        so once and sends the refused events again."""
        if self._should_auth():
            await self.authenticate()
        results = await self._pipeline(events, window)
        retry = [e for e in events if results[e.id][1].startswith(AUTH_REQUIRED)]
        if retry and await self.answer_auth_required(results[retry[0].id][1]):
            results.update(await self._pipeline(retry, window))
        return results

    async def _pipeline(self, events: list[Event], window: int) -> dict[str, tuple[bool, str]]:
        results: dict[str, tuple[bool, str]] = {}
        pending: list[str] = []
        for event in events:
            await self.send(["EVENT", event])
            pending.append(event.id)
            if len(pending) >= window:
                oldest = pending.pop(0)
                results[oldest] = await self._wait_ok(oldest)
        for event_id in pending:
            results[event_id] = await self._wait_ok(event_id)
        return results


async def connect_relay(
    url: str, seckey: bytes | None = None, open_timeout: float = OPEN_TIMEOUT
) -> RelayClient:
    """Connect (TLS verified with the default context for wss://); the caller closes it.

    The TCP, TLS and websocket handshakes together get `open_timeout` seconds: a relay
    that accepts the connection and then says nothing is a RelayError naming it."""
    try:
        ws = await connect(url, max_size=MAX_FRAME, open_timeout=open_timeout, close_timeout=2)
    except TimeoutError as exc:
        raise RelayError(
            f"cannot connect to {url}: timed out: no websocket handshake within"
            f" {open_timeout:.3g} s"
        ) from exc
    except (OSError, websockets.InvalidHandshake, websockets.InvalidURI, ssl.SSLError) as exc:
        raise RelayError(f"cannot connect to {url}: {_describe(exc)}") from exc
    return RelayClient(ws, url, seckey)


@asynccontextmanager
async def open_relay(
    url: str, seckey: bytes | None = None, open_timeout: float = OPEN_TIMEOUT
) -> AsyncIterator[RelayClient]:
    """Connect (TLS verified with the default context for wss://) and close on exit.

    Callers bound the rest of the exchange with `asyncio.timeout`.
    """
    client = await connect_relay(url, seckey, open_timeout)
    try:
        yield client
    finally:
        await client.close()
