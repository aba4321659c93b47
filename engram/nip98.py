"""NIP-98 HTTP authorization: a signed kind-27235 event in `Authorization: Nostr <base64>`.

Pure: the caller passes what it knows of the request (the relay's own URLs, path,
method, body) and `now`; the answer is the authorized pubkey or an HttpAuthError saying
why not. The event binds one request: its `u` tag names one of this relay's URLs (scheme,
host and port: `engram.urls`; https is wss seen from HTTP) and the request's path and
query under it, `method` the HTTP method, `payload` the SHA-256 of the body, and it is
recent. Whether a token was used before is the caller's to remember (its event id, for
the window).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from urllib.parse import urlsplit

import msgspec

from engram.nip01 import Event, verify_event
from engram.urls import RelayUrl, parse_relay_url

KIND_HTTP_AUTH = 27235
SCHEME = "Nostr"
WINDOW_SECONDS = 60  # created_at must be this close to now (NIP-98 suggests 60 s)
MAX_HEADER = 16_384  # characters of the header value; an auth event is a few hundred


class HttpAuthError(ValueError):
    """The Authorization header does not authorize this request; str() says why."""


def payload_hash(body: bytes) -> str:
    """The `payload` tag value for a request body: SHA-256, lower-case hex."""
    return hashlib.sha256(body).hexdigest()


def parse_authorization(header: str) -> Event:
    """The event carried by an `Authorization: Nostr <base64>` header value."""
    if not header:
        raise HttpAuthError("missing Authorization header (NIP-98)")
    if len(header) > MAX_HEADER:
        raise HttpAuthError("Authorization header too long")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != SCHEME.lower() or not token.strip():
        raise HttpAuthError("Authorization must be `Nostr <base64 event>` (NIP-98)")
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HttpAuthError("Authorization token is not base64") from exc
    try:
        return msgspec.json.decode(raw, type=Event)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise HttpAuthError(f"Authorization token is not a Nostr event: {exc}") from exc


def _tag(event: Event, name: str) -> str | None:
    for tag in event.tags:
        if len(tag) >= 2 and tag[0] == name:
            return tag[1]
    return None


def _same_target(u: str, urls: frozenset[RelayUrl], path: str, query: str) -> bool:
    """`u` is `path`?`query` under one of the relay's URLs (a public URL may carry the
    path a proxy serves the relay under: that path, then the request's)."""
    target = parse_relay_url(u)
    if target is None or urlsplit(u.strip()).query != query:
        return False
    return any(target == base._replace(path=(base.path + path).rstrip("/")) for base in urls)


def check_http_auth(
    event: Event,
    *,
    urls: frozenset[RelayUrl],
    path: str,
    method: str,
    body: bytes,
    now: int,
    query: str = "",
    window: int = WINDOW_SECONDS,
) -> str:
    """The pubkey the event authorizes for this request; HttpAuthError otherwise.

    Cheap checks first, the signature last.
    """
    if event.kind != KIND_HTTP_AUTH:
        raise HttpAuthError(f"authorization event must be kind {KIND_HTTP_AUTH}")
    if abs(event.created_at - now) > window:
        raise HttpAuthError(f"authorization event created_at is more than {window} s off")
    u = _tag(event, "u")
    if u is None:
        raise HttpAuthError("authorization event has no u tag")
    if not _same_target(u, urls, path, query):
        raise HttpAuthError("authorization u tag names another URL")
    if (_tag(event, "method") or "").upper() != method.upper():
        raise HttpAuthError(f"authorization method tag is not {method.upper()}")
    if _tag(event, "payload") != payload_hash(body):
        raise HttpAuthError("authorization payload tag is not the SHA-256 of the body")
    if not verify_event(event):
        raise HttpAuthError("authorization event id or signature is invalid")
    return event.pubkey


def verify_authorization(
    header: str,
    *,
    urls: frozenset[RelayUrl],
    path: str,
    method: str,
    body: bytes,
    now: int,
    query: str = "",
    window: int = WINDOW_SECONDS,
) -> str:
    """`parse_authorization` then `check_http_auth`: the authorized pubkey."""
    return check_http_auth(
        parse_authorization(header),
        urls=urls,
        path=path,
        method=method,
        body=body,
        now=now,
        query=query,
        window=window,
    )
