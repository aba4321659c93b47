"""NIP-62 request to vanish: which relays a kind-62 event asks to forget its author.

Pure. A `relay` tag names a relay URL (compared as NIP-42 AUTH compares them, by scheme,
host, port and path: `engram.urls`) or is the literal `ALL_RELAYS`.
"""

from __future__ import annotations

from engram.nip01 import Event
from engram.urls import RelayUrl, parse_relay_url

KIND_VANISH = 62
KIND_GIFT_WRAP = 1059  # NIP-59: the wraps p-tagging the author go with the author
ALL_RELAYS = "ALL_RELAYS"


def vanish_relays(event: Event) -> list[str]:
    """The values of the request's `relay` tags."""
    return [t[1] for t in event.tags if len(t) >= 2 and t[0] == "relay"]


def names_relay(event: Event, urls: frozenset[RelayUrl]) -> bool:
    """The request is meant for the relay known by `urls` (or for every relay)."""
    return any(r == ALL_RELAYS or parse_relay_url(r) in urls for r in vanish_relays(event))
