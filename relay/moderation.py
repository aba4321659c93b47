"""Moderation of one tenant as the relay enforces it: bans, kinds and blocked addresses.

Pure: the store loads the rows (relay.store.moderation), the tenant registry attaches a
`Moderation` to each tenant on every reload, and these checks read it. The same state is
written by the NIP-86 management API (relay.nip86) and by `engram tenant`.
"""

from __future__ import annotations

import ipaddress

import msgspec

from engram.nip01 import Event
from relay.wire import Reason


class Moderation(msgspec.Struct, frozen=True, kw_only=True):
    banned_pubkeys: frozenset[str] = frozenset()
    banned_events: frozenset[str] = frozenset()
    allowed_kinds: frozenset[int] = frozenset()  # non-empty: only these kinds
    disallowed_kinds: frozenset[int] = frozenset()
    blocked_ips: frozenset[str] = frozenset()  # normalized (`normalize_ip`)

    def kind_allowed(self, kind: int) -> bool:
        if kind in self.disallowed_kinds:
            return False
        return not self.allowed_kinds or kind in self.allowed_kinds

    def ip_blocked(self, ip: str) -> bool:
        return bool(self.blocked_ips) and normalize_ip(ip) in self.blocked_ips


NONE = Moderation()


def normalize_ip(ip: str) -> str:
    """The canonical text of an address (IPv4-mapped IPv6 as IPv4); '' if not one."""
    try:
        addr = ipaddress.ip_address(ip.strip())
    except ValueError:
        return ""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def check_event(event: Event, mod: Moderation) -> str | None:
    """Whether this tenant's moderation refuses the event (`blocked: …`), or None."""
    if mod is NONE:
        return None
    if event.pubkey in mod.banned_pubkeys:
        return Reason.BLOCKED("this pubkey is banned from this relay")
    if event.id in mod.banned_events:
        return Reason.BLOCKED("this event is banned from this relay")
    if not mod.kind_allowed(event.kind):
        return Reason.BLOCKED(f"kind {event.kind} is not allowed on this relay")
    return None
