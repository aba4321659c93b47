"""Authorization: NIP-42 AUTH, write policy, the engram read gate and REQ limit clamping.

Checks return None to accept or a reason carrying its NIP-01 prefix. The engram read gate
(spec "Relay-side rules: Reads") lives only here and runs before any search handling.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from engram.nip01 import Event, verify_event
from relay.config import KIND_AUTH, KIND_ENGRAM, Limits
from relay.filters import Filter
from relay.wire import Reason


def _tag(event: Event, name: str) -> str | None:
    for tag in event.tags:
        if len(tag) >= 2 and tag[0] == name:
            return tag[1]
    return None


def host_of(url: str) -> str:
    """Lower-cased host name of a URL or Host header, port stripped."""
    if "//" not in url:
        url = "//" + url
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def check_auth_event(event: Event, challenge: str, host: str, now: int, window: int) -> str | None:
    """NIP-42: kind 22242, our challenge, a relay tag naming this host, recent, signed."""
    if event.kind != KIND_AUTH:
        return Reason.INVALID("AUTH event must be kind 22242")
    if _tag(event, "challenge") != challenge:
        return Reason.AUTH_REQUIRED("AUTH challenge does not match this connection's")
    relay = _tag(event, "relay")
    if relay is None:
        return Reason.AUTH_REQUIRED("AUTH event has no relay tag")
    if host_of(relay) != host_of(host):
        return Reason.AUTH_REQUIRED("AUTH relay tag names another relay")
    if abs(event.created_at - now) > window:
        return Reason.AUTH_REQUIRED(f"AUTH created_at is more than {window} seconds off")
    if not verify_event(event):
        return Reason.INVALID("AUTH event id or signature is invalid")
    return None


def check_write(authed: str | None, limits: Limits) -> str | None:
    if limits.auth_required and authed is None:
        return Reason.AUTH_REQUIRED("this relay requires AUTH before publishing")
    return None


def check_read(f: Filter, authed: str | None, limits: Limits) -> str | None:
    """The engram read gate, then the relay-wide auth requirement."""
    if f.names_kind(KIND_ENGRAM):
        own_authors = bool(f.authors) and all(a == authed for a in f.authors or ())
        p = f.tags.get("p")
        own_p = bool(p) and all(v == authed for v in p or ())
        if not (own_authors or own_p):
            if authed is None:
                return Reason.AUTH_REQUIRED(
                    "engrams (kind 30174) are readable only by their author or owner: AUTH first"
                )
            return Reason.RESTRICTED(
                "engrams (kind 30174) are readable only by their author or owner"
            )
    if limits.auth_required and authed is None:
        return Reason.AUTH_REQUIRED("this relay requires AUTH before reading")
    return None


def clamp_limit(f: Filter, limits: Limits) -> Filter:
    """A REQ limit above max_limit is clamped (not refused); none means default_limit."""
    if f.limit is None:
        f.limit = limits.default_limit
    elif f.limit > limits.max_limit:
        f.limit = limits.max_limit
    return f


def may_see(event: Event, authed: str | None) -> bool:
    """Live fan-out half of the gate: an engram reaches only its author or its `p`."""
    if event.kind != KIND_ENGRAM:
        return True
    return authed is not None and (authed == event.pubkey or _tag(event, "p") == authed)
