"""NIP-86 relay management API: JSON-RPC-like calls over HTTP, authorized by NIP-98.

`POST` to the relay's own URL with `Content-Type: application/nostr+json+rpc` and a body
`{"method": …, "params": […]}`, answered `{"result": …}` or `{"result": null, "error":
…}`. Each call is authorized by a NIP-98 event (engram.nip98) from an operator (settings
`operators`: every tenant) or an admin of the tenant the Host header names; its `u` must
name one of that tenant's configured URLs (relay.identity: never the Host header), and a
token is good for one call (its id is remembered relay-wide until its window passed).
`allowpubkey` acts on members-only tenants: on an open one it is refused, naming the
setting that makes a tenant members-only (docs/OPERATING.md "Moderation"). Moderation
state is the one `engram tenant` reads and writes (relay.store.moderation); a change is
applied to this node at once and to every other node at its next configuration poll.

Framework-free: relay.app passes the request's facts in and sends the answer out.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from engram.errors import KeyFormatError
from engram.nip01 import is_hex, parse_public_key
from engram.nip98 import WINDOW_SECONDS, HttpAuthError, check_http_auth, parse_authorization
from engram.urls import RelayUrl
from relay.moderation import normalize_ip
from relay.store import DEFAULT_TENANT, StoreError
from relay.store import moderation as m
from relay.store import tenants as t
from relay.tenants import Tenant

log = logging.getLogger("engram.nip86")

CONTENT_TYPE = "application/nostr+json+rpc"
MAX_BODY = 65_536  # bytes of one request body; a call is a method and a few parameters
MAX_TEXT = 2_000  # characters of a reason, name, description or icon URL


class Answer(msgspec.Struct, frozen=True):
    """An HTTP status and the JSON body to send."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = msgspec.field(default_factory=dict)


class CallError(Exception):
    """A refused call: HTTP status and the message for the `error` field."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _ok(result: Any) -> Answer:
    return Answer(200, {"result": result})


def _error(status: int, message: str) -> Answer:
    headers = {"WWW-Authenticate": "Nostr"} if status == 401 else {}
    return Answer(status, {"result": None, "error": message}, headers)


class _Request(msgspec.Struct):
    method: str
    params: list[Any] = msgspec.field(default_factory=list)


# --- parameters -------------------------------------------------------------------------


def _param(params: list[Any], i: int, name: str) -> Any:
    if len(params) <= i:
        raise CallError(400, f"missing parameter {i + 1}: {name}")
    return params[i]


def _text(params: list[Any], i: int, name: str, optional: bool = False) -> str:
    if optional and len(params) <= i:
        return ""
    value = _param(params, i, name)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise CallError(400, f"parameter {i + 1} ({name}) must be a string")
    if len(value) > MAX_TEXT:
        raise CallError(400, f"parameter {i + 1} ({name}) is longer than {MAX_TEXT} characters")
    return value


def _pubkey(params: list[Any]) -> str:
    try:
        return parse_public_key(_text(params, 0, "pubkey"))
    except KeyFormatError as exc:
        raise CallError(400, f"parameter 1 (pubkey): {exc}") from exc


def _event_id(params: list[Any]) -> str:
    value = _text(params, 0, "event id").lower()
    if not is_hex(value, 64):
        raise CallError(400, "parameter 1 (event id) must be 64 hex characters")
    return value


def _kind(params: list[Any]) -> int:
    value = _param(params, 0, "kind")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise CallError(400, "parameter 1 (kind) must be an integer from 0 to 65535")
    return value


def _ip(params: list[Any]) -> str:
    value = normalize_ip(_text(params, 0, "ip"))
    if not value:
        raise CallError(400, "parameter 1 (ip) must be an IPv4 or IPv6 address")
    return value


# --- methods ----------------------------------------------------------------------------

Method = Callable[["Call"], Awaitable[Any]]

Admin = Callable[[str, Callable[[Any, Any], Awaitable[Any]]], Awaitable[Any]]


class Call(msgspec.Struct, frozen=True):
    """What a method needs: the tenant key, its params and the store's admin runner."""

    tenant: str
    params: list[Any]
    run: Admin
    members_only: bool = False  # the tenant's write policy (`allowpubkey` needs it)

    async def on(self, action: Callable[[Any, Any], Awaitable[Any]]) -> Any:
        return await self.run(self.tenant, action)


def reasoned(rows: list[tuple[str, str]], key: str) -> list[dict[str, str]]:
    """(value, reason) rows as the list methods answer them: `{key: value, "reason": …}`
    (also what `engram tenant moderation` prints)."""
    return [{key: value, "reason": why} for value, why in rows]


def _reason(params: list[Any]) -> str:
    """The optional second parameter of a ban, allow or block: its reason."""
    return _text(params, 1, "reason", True)


async def _banpubkey(c: Call) -> bool:
    pk, reason = _pubkey(c.params), _reason(c.params)
    deleted = await c.on(lambda ctl, ev: m.ban_pubkey(ctl, ev, c.tenant, pk, reason))
    log.info("tenant %s: banned pubkey %s (%d events deleted)", c.tenant, pk, deleted)
    return True


async def _unbanpubkey(c: Call) -> bool:
    pk = _pubkey(c.params)
    await c.on(lambda ctl, ev: m.unban_pubkey(ctl, c.tenant, pk))
    return True


async def _listbannedpubkeys(c: Call) -> list[dict[str, str]]:
    rows = await c.on(lambda ctl, ev: m.banned_pubkeys(ctl, c.tenant))
    return reasoned(rows, "pubkey")


async def _allowpubkey(c: Call) -> bool:
    pk = _pubkey(c.params)
    if not c.members_only:
        # Allowing on an open tenant would change nothing anyone can see; turning the
        # tenant members-only as a side effect would lock out every other writer. The
        # write policy is the operator's own, visible decision.
        raise CallError(
            400,
            f"{c.tenant} is open: everyone may publish, so allowing a pubkey changes"
            f" nothing. Make it members-only first (`engram tenant set {c.tenant} --write"
            " members`), then allow its members.",
        )
    await c.on(lambda ctl, ev: m.allow_pubkey(ctl, c.tenant, pk))
    return True


async def _unallowpubkey(c: Call) -> bool:
    pk = _pubkey(c.params)
    await c.on(lambda ctl, ev: t.remove_member(ctl, c.tenant, pk))
    return True


async def _listallowedpubkeys(c: Call) -> list[dict[str, str]]:
    cfg = await c.on(lambda ctl, ev: t.get_tenant(ctl, c.tenant))
    return [{"pubkey": pk} for pk in (cfg.members if cfg else [])]


async def _banevent(c: Call) -> bool:
    eid, reason = _event_id(c.params), _reason(c.params)
    await c.on(lambda ctl, ev: m.ban_event(ctl, ev, c.tenant, eid, reason))
    log.info("tenant %s: banned event %s", c.tenant, eid)
    return True


async def _allowevent(c: Call) -> bool:
    eid, reason = _event_id(c.params), _reason(c.params)
    await c.on(lambda ctl, ev: m.allow_event(ctl, c.tenant, eid, reason))
    return True


def _unmoderate(banned: bool) -> Method:
    async def forget(c: Call) -> bool:
        eid = _event_id(c.params)
        await c.on(lambda ctl, ev: m.unmoderate_event(ctl, c.tenant, eid, banned))
        return True

    return forget


def _list_events(banned: bool) -> Method:
    async def listing(c: Call) -> list[dict[str, str]]:
        rows = await c.on(lambda ctl, ev: m.moderated_events(ctl, c.tenant, banned))
        return reasoned(rows, "id")

    return listing


async def _listeventsneedingmoderation(c: Call) -> list[dict[str, str]]:
    rows = await c.on(lambda ctl, ev: m.events_needing_moderation(ctl, ev, c.tenant))
    return reasoned(rows, "id")


async def _allowkind(c: Call) -> bool:
    kind = _kind(c.params)
    await c.on(lambda ctl, ev: m.set_kind(ctl, c.tenant, kind, True))
    return True


async def _disallowkind(c: Call) -> bool:
    kind = _kind(c.params)
    await c.on(lambda ctl, ev: m.set_kind(ctl, c.tenant, kind, False))
    return True


def _list_kinds(allowed: bool) -> Method:
    async def listing(c: Call) -> list[int]:
        return await c.on(lambda ctl, ev: m.kinds(ctl, c.tenant, allowed))  # type: ignore[no-any-return]

    return listing


async def _blockip(c: Call) -> bool:
    ip, reason = _ip(c.params), _reason(c.params)
    await c.on(lambda ctl, ev: m.block_ip(ctl, c.tenant, ip, reason))
    return True


async def _unblockip(c: Call) -> bool:
    ip = _ip(c.params)
    await c.on(lambda ctl, ev: m.unblock_ip(ctl, c.tenant, ip))
    return True


async def _listblockedips(c: Call) -> list[dict[str, str]]:
    rows = await c.on(lambda ctl, ev: m.blocked_ips(ctl, c.tenant))
    return reasoned(rows, "ip")


def _change(column: str, what: str) -> Callable[[Call], Awaitable[bool]]:
    async def change(c: Call) -> bool:
        value = _text(c.params, 0, what)
        await c.on(lambda ctl, ev: t.update_tenant(ctl, c.tenant, **{column: value}))
        return True

    return change


# name -> (handler, needs a tenant row: members and NIP-11 fields are stored with one)
METHODS: dict[str, tuple[Method, bool]] = {
    "banpubkey": (_banpubkey, False),
    "unbanpubkey": (_unbanpubkey, False),
    "listbannedpubkeys": (_listbannedpubkeys, False),
    "allowpubkey": (_allowpubkey, True),
    "unallowpubkey": (_unallowpubkey, True),
    "listallowedpubkeys": (_listallowedpubkeys, True),
    "banevent": (_banevent, False),
    "unbanevent": (_unmoderate(True), False),
    "allowevent": (_allowevent, False),
    "unallowevent": (_unmoderate(False), False),
    "listbannedevents": (_list_events(True), False),
    "listallowedevents": (_list_events(False), False),
    "listeventsneedingmoderation": (_listeventsneedingmoderation, False),
    "allowkind": (_allowkind, False),
    "disallowkind": (_disallowkind, False),
    "listallowedkinds": (_list_kinds(True), False),
    "listdisallowedkinds": (_list_kinds(False), False),
    "blockip": (_blockip, False),
    "unblockip": (_unblockip, False),
    "listblockedips": (_listblockedips, False),
    "changerelayname": (_change("name", "name"), True),
    "changerelaydescription": (_change("description", "description"), True),
    "changerelayicon": (_change("icon", "icon URL"), True),
}
READ_ONLY = frozenset(n for n in METHODS if n.startswith("list"))


def supported_methods(tenant: Tenant) -> list[str]:
    """Methods that act on this tenant: the built-in tenant of a relay without tenants
    has no row to hold members or NIP-11 fields (settings hold those)."""
    has_row = tenant.key != DEFAULT_TENANT
    return ["supportedmethods", *(n for n, (_, row) in METHODS.items() if has_row or not row)]


# --- the call ---------------------------------------------------------------------------


async def handle(
    *,
    tenant: Tenant,
    operators: frozenset[str],
    urls: frozenset[RelayUrl],
    path: str,
    query: str,
    content_type: str,
    authorization: str,
    body: bytes,
    now: int,
    run: Admin,
    refresh: Callable[[], Awaitable[None]],
) -> Answer:
    """One management call, from the request's facts to the answer. Nothing is changed
    unless the caller is authorized and the call is well-formed. `urls`: the tenant's own
    (relay.identity.tenant_urls)."""
    if content_type.split(";")[0].strip().lower() != CONTENT_TYPE:
        return _error(415, f"Content-Type must be {CONTENT_TYPE}")
    if len(body) > MAX_BODY:
        return _error(413, f"request body larger than {MAX_BODY} bytes")
    try:
        token = parse_authorization(authorization)
        caller = check_http_auth(
            token, urls=urls, path=path, query=query, method="POST", body=body, now=now
        )
    except HttpAuthError as exc:
        return _error(401, f"unauthorized: {exc}")
    if caller not in operators and caller not in tenant.admins:
        return _error(401, "unauthorized: this pubkey does not administer this relay")
    expires = token.created_at + WINDOW_SECONDS
    try:
        fresh = await run(tenant.key, lambda ctl, ev: m.use_token(ctl, token.id, expires, now))
    except StoreError as exc:
        return _error(500, str(exc))
    if not fresh:
        return _error(401, "unauthorized: this authorization (NIP-98) was already used")
    try:
        request = msgspec.json.decode(body, type=_Request)
    except msgspec.ValidationError as exc:
        return _error(400, f"invalid request: {exc}")
    except msgspec.DecodeError as exc:
        return _error(400, f"invalid request: body is not JSON: {exc}")
    supported = supported_methods(tenant)
    if request.method not in supported:
        return _error(400, f"unsupported method: {request.method!r}")
    if request.method == "supportedmethods":
        return _ok(supported)
    handler, _ = METHODS[request.method]
    try:
        result = await handler(Call(tenant.key, request.params, run, tenant.members_only))
    except CallError as exc:
        return _error(exc.status, str(exc))
    except StoreError as exc:
        return _error(500, str(exc))
    if request.method not in READ_ONLY:
        log.info("tenant %s: %s by %s", tenant.key, request.method, caller)
        try:
            await refresh()  # this node applies it now; others at their next poll
        except (StoreError, ValueError) as exc:
            log.warning("tenant reload after %s failed: %s", request.method, exc)
    return _ok(result)
