"""Stateless event checks, cheapest first: shape and limits, kind rules, id, signature.

Each check returns None to accept or a reason that already carries its NIP-01 prefix.
The BIP-340 verification runs last, so a flood of junk costs little CPU.
"""

from __future__ import annotations

from engram import validate_engram_envelope
from engram.kinds import KIND_MAX
from engram.nip01 import Event, id_matches, is_hex, signature_valid_hex
from relay.config import KIND_AUTH, MEMORY_KINDS, Limits
from relay.wire import Reason


def check_shape(event: Event, limits: Limits, now: int) -> str | None:
    """Hex fields, sizes, tag and created_at bounds: all O(size) and cheap."""
    if not is_hex(event.id, 64):
        return Reason.INVALID("id must be 64 lower-case hex characters")
    if not is_hex(event.pubkey, 64):
        return Reason.INVALID("pubkey must be 64 lower-case hex characters")
    if not is_hex(event.sig, 128):
        return Reason.INVALID("sig must be 128 lower-case hex characters")
    if not 0 <= event.kind <= KIND_MAX:
        return Reason.INVALID(f"kind must be between 0 and {KIND_MAX}")
    if event.created_at < 0:
        return Reason.INVALID("created_at must not be negative")
    if event.created_at > now + limits.created_at_upper_limit:
        return Reason.INVALID(
            f"created_at is more than {limits.created_at_upper_limit} seconds in the future"
        )
    if limits.created_at_lower_limit and event.created_at < now - limits.created_at_lower_limit:
        return Reason.INVALID(
            f"created_at is more than {limits.created_at_lower_limit} seconds in the past"
        )
    if len(event.tags) > limits.max_event_tags:
        return Reason.INVALID(f"too many tags (max {limits.max_event_tags})")
    if len(event.content) > limits.max_content_length:
        return Reason.INVALID(f"content too long (max {limits.max_content_length} characters)")
    for tag in event.tags:
        if not tag:
            return Reason.INVALID("empty tag")
    return None


def expiration_of(tags: list[list[str]]) -> int | None:
    """NIP-40: the first `expiration` tag (unix seconds), None when absent or malformed."""
    for tag in tags:
        if len(tag) >= 2 and tag[0] == "expiration":
            value = tag[1]
            return int(value) if value.isascii() and value.isdigit() and len(value) <= 18 else None
    return None


def check_expiration(event: Event, now: int) -> str | None:
    expires = expiration_of(event.tags)
    if expires is not None and expires <= now:
        return Reason.INVALID(f"event expired at {expires} (NIP-40)")
    return None


def pow_difficulty(event_id: str) -> int:
    """NIP-13: the number of leading zero bits of the id."""
    bits = 0
    for ch in event_id:
        nibble = int(ch, 16)
        if nibble:
            return bits + 4 - nibble.bit_length()
        bits += 4
    return bits


def check_pow(event: Event, minimum: int) -> str | None:
    if minimum and pow_difficulty(event.id) < minimum:
        return Reason.POW(f"difficulty {pow_difficulty(event.id)} is less than {minimum} (NIP-13)")
    return None


def check_kind(event: Event) -> str | None:
    """Per-kind rules: AUTH events travel only in AUTH; engrams (and their revisions and
    owner verdicts) must look like engrams."""
    if event.kind == KIND_AUTH:
        return Reason.INVALID("kind 22242 AUTH events are sent with AUTH, not EVENT")
    if event.kind in MEMORY_KINDS:
        return validate_engram_envelope(event)
    return None


def check_id(event: Event) -> str | None:
    if not id_matches(event):
        return Reason.INVALID("event id does not match the hash of its content")
    return None


def check_signature(event: Event) -> str | None:
    """After check_shape (hex fields already checked)."""
    if not signature_valid_hex(event):
        return INVALID_SIGNATURE
    return None


def check_unsigned(event: Event, limits: Limits, now: int) -> str | None:
    """Everything but the signature, in cost order."""
    return (
        check_shape(event, limits, now)
        or check_expiration(event, now)
        or check_kind(event)
        or check_pow(event, limits.min_pow_difficulty)
        or check_id(event)
    )


def check_event(event: Event, limits: Limits, now: int) -> str | None:
    """The whole stateless validity of an event, in cost order."""
    return check_unsigned(event, limits, now) or check_signature(event)


INVALID_SIGNATURE = Reason.INVALID("signature verification failed")
