"""NIP-19 bech32 encoding of keys (npub/nsec). Pure; wraps the `bech32` reference code."""

from __future__ import annotations

import bech32

from engram.errors import KeyFormatError


def encode(hrp: str, data: bytes) -> str:
    five = bech32.convertbits(data, 8, 5, True)
    if five is None:  # pragma: no cover - convertbits only fails on out-of-range input
        raise KeyFormatError("cannot bech32-encode these bytes")
    return bech32.bech32_encode(hrp, five)


def decode(s: str) -> tuple[str, bytes]:
    """(hrp, payload bytes); raises KeyFormatError on a bad checksum or padding."""
    hrp, five = bech32.bech32_decode(s)
    if hrp is None or five is None:
        raise KeyFormatError("invalid bech32 string (bad checksum or characters)")
    data = bech32.convertbits(five, 5, 8, False)
    if data is None:
        raise KeyFormatError("invalid bech32 padding")
    return hrp, bytes(data)


def npub(pubkey_hex: str) -> str:
    return encode("npub", bytes.fromhex(pubkey_hex))


def nsec(seckey: bytes) -> str:
    return encode("nsec", seckey)
