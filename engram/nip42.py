"""NIP-42 client authentication: the AUTH event kind and how a client signs one.

Pure: the time and the Schnorr aux are arguments. The relay checks AUTH events
(`relay.policy`); the CLI signs them (`cli.nostr.client`).
"""

from __future__ import annotations

from engram.nip01 import Event, sign_event

KIND_AUTH = 22242


def auth_event(seckey: bytes, relay_url: str, challenge: str, created_at: int, aux: bytes) -> Event:
    """The signed kind 22242 event answering `challenge` from the relay at `relay_url`."""
    tags = [["relay", relay_url], ["challenge", challenge]]
    return sign_event(seckey, created_at, KIND_AUTH, tags, "", aux)
