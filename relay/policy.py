"""Authorization: NIP-42 AUTH, write policy (NIP-70 included), the private read gate and
REQ limit clamping.

Checks return None to accept or a reason carrying its NIP-01 prefix. The private read
gate (engrams, spec "Relay-side rules: Reads", and each tenant's private kinds: direct
messages, gift wraps) is decided here, on the rule of `engram.readers`, and runs before
any search handling; the store applies the same rule to rows (relay.store.sqlread) and the
fan-out to live events (`readers`).
"""

from __future__ import annotations

from engram.errors import AttestationError
from engram.nip01 import Event, verify_event
from engram.nip62 import names_relay
from engram.nip70 import is_protected
from engram.nipoa import AUTH_TAG, Clause, clauses_allow, event_attestation, verify_auth_tag
from engram.readers import asks_only_own, parties
from engram.urls import RelayUrl, parse_relay_url
from relay import moderation
from relay.config import KIND_AUTH, KIND_ENGRAM, Limits
from relay.filters import Filter
from relay.identity import ordered
from relay.tenants import Tenant
from relay.wire import Reason


def _tag(event: Event, name: str) -> str | None:
    for tag in event.tags:
        if len(tag) >= 2 and tag[0] == name:
            return tag[1]
    return None


def check_auth_event(
    event: Event, challenge: str, urls: frozenset[RelayUrl], now: int, window: int
) -> str | None:
    """NIP-42: kind 22242, our challenge, a relay tag naming one of the tenant's URLs
    (relay.identity), recent, signed. An AUTH made for another relay or tenant (a relay
    in the middle forwarding our challenge to its own victims) names another URL."""
    if event.kind != KIND_AUTH:
        return Reason.INVALID("AUTH event must be kind 22242")
    if _tag(event, "challenge") != challenge:
        return Reason.AUTH_REQUIRED("AUTH challenge does not match this connection's")
    relay = _tag(event, "relay")
    if relay is None:
        return Reason.AUTH_REQUIRED("AUTH event has no relay tag")
    if parse_relay_url(relay) not in urls:
        known = ordered(urls)
        return Reason.AUTH_REQUIRED(
            f"AUTH relay tag names another relay: this one is {', '.join(known[:3])}"
            + (" …" if len(known) > 3 else "")
        )
    if abs(event.created_at - now) > window:
        return Reason.AUTH_REQUIRED(f"AUTH created_at is more than {window} seconds off")
    if not verify_event(event):
        return Reason.INVALID("AUTH event id or signature is invalid")
    return None


def admit_agent(event: Event, tenant: Tenant) -> tuple[tuple[Clause, ...] | None, str | None]:
    """NIP-OA at AUTH: (clauses, None) admits the agent; (None, None) means no `auth` tag;
    (None, reason) refuses the AUTH. Time clauses are checked here against the AUTH
    event's created_at; `kind=` clauses later, against each event the agent publishes."""
    tags = [t for t in event.tags if t and t[0] == AUTH_TAG]
    if not tags:
        return None, None
    if len(tags) > 1:
        return None, Reason.INVALID("more than one owner attestation (auth) tag")
    try:
        att = verify_auth_tag(tags[0], event.pubkey)
    except AttestationError as exc:
        return None, Reason.INVALID(f"owner attestation: {exc}")
    time_clauses = tuple(c for c in att.clauses if c.name != "kind=")
    if not clauses_allow(time_clauses, event.kind, event.created_at):
        return None, Reason.RESTRICTED("owner attestation has expired or is not yet valid")
    if tenant.members_only and not tenant.is_member(att.owner):
        return None, Reason.RESTRICTED("the attesting owner is not a member of this relay")
    return att.clauses, None


def _attested_by_member(event: Event, tenant: Tenant) -> bool:
    """An `auth` tag on the event itself, from a member owner, covering this event."""
    try:
        att = event_attestation(event, check_event=False)
    except AttestationError:
        return False
    return att is not None and tenant.is_member(att.owner)


def check_write(
    event: Event,
    authed: str | None,
    admitted: tuple[Clause, ...] | None,
    tenant: Tenant,
) -> str | None:
    """Who may publish: anyone (`open`), or members and agents their owners admitted;
    a protected event (NIP-70) only its author, AUTHed as such."""
    if tenant.limits.auth_required and authed is None:
        return Reason.AUTH_REQUIRED("this relay requires AUTH before publishing")
    if authed != event.pubkey and is_protected(event.tags):
        if authed is None:
            return Reason.AUTH_REQUIRED(
                "this event is protected (NIP-70): only its author may publish it; AUTH first"
            )
        return Reason.RESTRICTED("this event is protected (NIP-70): only its author may publish it")
    if not tenant.members_only or tenant.is_member(event.pubkey):
        return None
    if admitted is not None and event.pubkey == authed:
        kind_clauses = tuple(c for c in admitted if c.name == "kind=")
        if clauses_allow(kind_clauses, event.kind, event.created_at):
            return None
        return Reason.RESTRICTED(f"the owner attestation does not cover kind {event.kind}")
    if _attested_by_member(event, tenant):
        return None
    if authed is None:
        return Reason.AUTH_REQUIRED(
            "only members and agents admitted by a member may publish here: AUTH first"
        )
    return Reason.RESTRICTED("only members and agents admitted by a member may publish here")


def check_moderated(event: Event, tenant: Tenant) -> str | None:
    """The tenant's moderation: NIP-86 bans and kinds (relay.moderation)."""
    return moderation.check_event(event, tenant.moderation)


def check_vanish(event: Event, urls: frozenset[RelayUrl]) -> str | None:
    """NIP-62: a request to vanish is taken only when it names this relay (one of its
    `urls`, relay.identity) or ALL_RELAYS; the store then applies it (relay.store.sqlwrite)."""
    if names_relay(event, urls):
        return None
    return Reason.INVALID("this request to vanish (NIP-62) does not name this relay")


def _private_named(f: Filter, private: frozenset[int]) -> list[int]:
    return sorted(private.intersection(f.kinds)) if f.kinds is not None else []


def check_read(f: Filter, authed: str | None, tenant: Tenant) -> str | None:
    """The private read gate, then the relay-wide auth requirement.

    A filter naming a private kind must ask for the viewer's own events only (its authors,
    or its `#p`, all the viewer): NIP-42 AUTH first. Filters naming no private kind are
    not refused; the store and the fan-out then leave out what the viewer may not read.
    """
    named = _private_named(f, tenant.private_kinds)
    if named and not asks_only_own(f.authors, f.tags.get("p"), authed):
        what = (
            "engrams (kind 30174) are"
            if named == [KIND_ENGRAM]
            else f"events of kind {', '.join(map(str, named))} are"
        )
        if authed is None:
            return Reason.AUTH_REQUIRED(
                f"{what} readable only by their author or recipient: AUTH first"
            )
        return Reason.RESTRICTED(f"{what} readable only by their author or recipient")
    if tenant.limits.auth_required and authed is None:
        return Reason.AUTH_REQUIRED("this relay requires AUTH before reading")
    return None


def clamp_limit(f: Filter, limits: Limits) -> Filter:
    """A REQ limit above max_limit is clamped (not refused); none means default_limit."""
    if f.limit is None:
        f.limit = limits.default_limit
    elif f.limit > limits.max_limit:
        f.limit = limits.max_limit
    return f


def readers(event: Event, private: frozenset[int]) -> frozenset[str] | None:
    """Live fan-out half of the gate: None if anyone may see the event, else the only
    pubkeys that may (its author and its recipient). Computed once per published event."""
    return parties(event.pubkey, event.tags) if event.kind in private else None
