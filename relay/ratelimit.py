"""Abuse limits: token buckets per connection and per (tenant, IP), connection counts.

Pure: the clock is passed in. Every key carries the tenant, so one community's flood never
spends another's allowance.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import msgspec

from relay.wire import Reason


class RateLimits(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Rates are per second; a burst is how many may come at once. 0 turns a limit off.

    Defaults fit a public relay (docs/OPERATING.md "Operating it" gives the reasoning):
    one connection or one address cannot flood a tenant, while agents behind one NAT
    still fit. Loopback clients are exempt unless the relay sits behind a proxy, so local
    tools just work.
    """

    messages_per_second: float = 100.0  # per connection, every message type
    message_burst: int = 500
    events_per_second: float = 20.0  # per connection, EVENT only
    event_burst: int = 100
    ip_messages_per_second: float = 1_000.0  # per (tenant, IP), all its connections
    ip_message_burst: int = 5_000
    ip_events_per_second: float = 200.0
    ip_event_burst: int = 1_000
    connections_per_ip: int = 200
    subscriptions_per_ip: int = 2_000
    search_subscriptions_per_ip: int = 64  # of those, with a NIP-50 `search` (live matching)
    trust_forwarded_for: bool = False  # take the client IP from X-Forwarded-For (proxies)
    # loopback (127.0.0.0/8, ::1) is not limited while trust_forwarded_for is off
    exempt_loopback: bool = True


def is_loopback(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


class Bucket:
    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, float(max(burst, 1))
        self.tokens, self.stamp = self.burst, now

    def take(self, now: float) -> bool:
        if self.rate <= 0:
            return True
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


_UNLIMITED = Bucket(0.0, 1, 0.0)  # rate 0: take() always succeeds, holds no state


@dataclass(slots=True)
class _Address:
    connections: int
    messages: Bucket
    events: Bucket
    sessions: set[object] = field(default_factory=set)


@dataclass(slots=True)
class ConnectionAllowance:
    """One connection's buckets plus its address's shared ones."""

    messages: Bucket
    events: Bucket
    address: _Address
    exempt: bool = False  # loopback: no limits apply


# every exempt connection's allowance: nothing in it changes (no bucket is taken from, no
# session is listed under its address), so one is shared rather than made per connection
_EXEMPT = ConnectionAllowance(
    _UNLIMITED, _UNLIMITED, _Address(0, _UNLIMITED, _UNLIMITED), exempt=True
)


class RateLimiter:
    def __init__(self, limits: RateLimits) -> None:
        self.limits = limits
        self._addresses: dict[tuple[str, str], _Address] = {}

    def exempt(self, ip: str) -> bool:
        """Loopback is the operator's own host, unless a proxy makes every client look
        local (then the forwarded address is the client, and it is limited)."""
        lim = self.limits
        return lim.exempt_loopback and not lim.trust_forwarded_for and is_loopback(ip)

    def connect(self, tenant: str, ip: str, now: float) -> ConnectionAllowance | None:
        """A new connection's allowance, or None when the address has too many."""
        lim = self.limits
        if self.exempt(ip):  # unlimited, never counted
            return _EXEMPT
        key = (tenant, ip)
        addr = self._addresses.get(key)
        if addr is None:
            addr = _Address(
                0,
                Bucket(lim.ip_messages_per_second, lim.ip_message_burst, now),
                Bucket(lim.ip_events_per_second, lim.ip_event_burst, now),
            )
            self._addresses[key] = addr
        if lim.connections_per_ip and addr.connections >= lim.connections_per_ip:
            return None
        addr.connections += 1
        return ConnectionAllowance(
            Bucket(lim.messages_per_second, lim.message_burst, now),
            Bucket(lim.events_per_second, lim.event_burst, now),
            addr,
        )

    def disconnect(self, tenant: str, ip: str, session: object) -> None:
        if self.exempt(ip):
            return
        key = (tenant, ip)
        addr = self._addresses.get(key)
        if addr is None:
            return
        addr.connections -= 1
        addr.sessions.discard(session)
        if addr.connections <= 0:
            del self._addresses[key]

    @staticmethod
    def check_message(allow: ConnectionAllowance, now: float) -> str | None:
        if not allow.messages.take(now):
            return Reason.RATE_LIMITED("too many messages on this connection; slow down")
        if not allow.address.messages.take(now):
            return Reason.RATE_LIMITED("too many messages from your address; slow down")
        return None

    @staticmethod
    def check_event(allow: ConnectionAllowance, now: float) -> str | None:
        if not allow.events.take(now):
            return Reason.RATE_LIMITED("too many events on this connection; slow down")
        if not allow.address.events.take(now):
            return Reason.RATE_LIMITED("too many events from your address; slow down")
        return None

    def check_subscriptions(self, allow: ConnectionAllowance, open_count: int) -> str | None:
        """`open_count`: the address's open subscriptions, counted by the caller."""
        cap = self.limits.subscriptions_per_ip
        if cap and open_count >= cap:
            return Reason.RATE_LIMITED(f"too many subscriptions from your address (max {cap})")
        return None
