"""Engram operations over a relay connection: read a head, list heads, write safely.

The protocol rules come from `engram` (validation, head selection, created_at); this
module adds the I/O around them and the clock and randomness the pure core refuses to own.
Every event from the relay is validated here, client-side: the relay cannot decrypt.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from cli.client import RelayClient
from cli.errors import ConflictError
from cli.identity import Identity, InputError
from engram import (
    FUTURE_SKEW_MAX,
    KIND_ENGRAM,
    Body,
    ClockConflictError,
    Head,
    Lookup,
    body_text,
    build_event,
    d_tag,
    heads_by_slug,
    lookup_head,
    monotonic_created_at,
)
from engram.nip01 import Event


def live_text(lookup: Lookup) -> str | None:
    """The head's `value` or `profile`; None when absent, tombstoned or all invalid."""
    return body_text(lookup.head.body) if lookup.head else None


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def memory_filter(ident: Identity, **extra: Any) -> dict[str, Any]:
    """The (agent, owner) memory; `authors` or `#p` names us, which the read gate needs."""
    return {"kinds": [KIND_ENGRAM], "authors": [ident.agent], "#p": [ident.owner], **extra}


async def read_head(client: RelayClient, ident: Identity, slug: str) -> Lookup:
    """Every stored version of `slug` (relays may keep old ones), validated; the head wins."""
    d = d_tag(ident.conversation_key, slug)
    events = await client.query(memory_filter(ident, **{"#d": [d]}))
    return lookup_head(events, ident.agent, ident.owner, ident.conversation_key, slug)


async def list_heads(
    client: RelayClient, ident: Identity, limit: int | None
) -> tuple[dict[str, Head], int]:
    """The head of every slug (core and tombstones included) and the raw event count."""
    events = await client.query(memory_filter(ident, **({"limit": limit} if limit else {})))
    heads = heads_by_slug(events, ident.agent, ident.owner, ident.conversation_key)
    return heads, len(events)


async def write(client: RelayClient, ident: Identity, body: Body, base: Lookup) -> Event:
    """Publish `body` on top of `base` (the head the caller read), then confirm it is the head.

    spec *Writing*: created_at = max(now, head + 1); a clock-poisoned head is a conflict;
    fresh random NIP-44 nonce and BIP-340 aux; after the OK, re-read and report a
    conflict (never retry silently) if the new event is not the head.
    """
    if ident.as_owner:
        raise InputError("writes are agent-only: the owner key can read but not write")
    prior = base.head.event.created_at if base.head else None
    try:
        # The issue bounds the head itself (T - now > 600 is poisoned); max_skew bounds T + 1.
        created_at = monotonic_created_at(int(time.time()), prior, max_skew=FUTURE_SKEW_MAX + 1)
    except ClockConflictError as exc:
        raise ConflictError(f"{body.slug}: {exc} (clock-poisoned head)") from None
    event = build_event(ident.seckey, ident.owner, body, created_at, os.urandom(32), os.urandom(32))
    message = await client.publish(event)
    if message.startswith("duplicate:"):
        raise ConflictError(f"{body.slug}: the relay kept another version (concurrent write)")
    after = await read_head(client, ident, body.slug)
    if after.head is None or after.head.event.id != event.id:
        raise ConflictError(f"{body.slug}: another write replaced this one (concurrent write)")
    return event
