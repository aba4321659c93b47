"""The engram protocol core: NIP-01 events, NIP-44 v2 encryption, NIP-AE agent memory.

Pure: no I/O, no asyncio, no clock and no randomness of its own. Time, nonces and
Schnorr aux are arguments; the relay and CLI supply them.
"""

from engram.body import (
    BODY_MAX_BYTES,
    Body,
    Core,
    Memory,
    Tombstone,
    body_text,
    encode_body,
    parse_body,
)
from engram.envelope import (
    KIND_ENGRAM,
    build_event,
    validate_and_decrypt,
    validate_engram_envelope,
)
from engram.errors import (
    BodyShapeError,
    BodyTooLargeError,
    ClockConflictError,
    DecryptError,
    EngramError,
    EnvelopeError,
    InvalidBodyError,
    InvalidEngramError,
    InvalidSlugError,
    Nip44Error,
    SignatureError,
    SlugMismatchError,
)
from engram.head import (
    FUTURE_SKEW_MAX,
    Head,
    ListingEntry,
    Lookup,
    core_profile,
    heads_by_slug,
    listing,
    lookup_head,
    monotonic_created_at,
    select_head,
    valid_heads,
)
from engram.nip01 import Event
from engram.nip44 import conversation_key
from engram.refs import Reachability, extract_refs, reachability
from engram.slug import (
    CORE_SLUG,
    D_TAG_DOMAIN,
    SLUG_MAX_BYTES,
    d_tag,
    is_valid_slug,
    normalize_slug,
    validate_slug,
)

__all__ = [
    "BODY_MAX_BYTES",
    "CORE_SLUG",
    "D_TAG_DOMAIN",
    "FUTURE_SKEW_MAX",
    "KIND_ENGRAM",
    "SLUG_MAX_BYTES",
    "Body",
    "BodyShapeError",
    "BodyTooLargeError",
    "ClockConflictError",
    "Core",
    "DecryptError",
    "EngramError",
    "EnvelopeError",
    "Event",
    "Head",
    "InvalidBodyError",
    "InvalidEngramError",
    "InvalidSlugError",
    "ListingEntry",
    "Lookup",
    "Memory",
    "Nip44Error",
    "Reachability",
    "SignatureError",
    "SlugMismatchError",
    "Tombstone",
    "body_text",
    "build_event",
    "conversation_key",
    "core_profile",
    "d_tag",
    "encode_body",
    "extract_refs",
    "heads_by_slug",
    "is_valid_slug",
    "listing",
    "lookup_head",
    "monotonic_created_at",
    "normalize_slug",
    "parse_body",
    "reachability",
    "select_head",
    "valid_heads",
    "validate_and_decrypt",
    "validate_engram_envelope",
    "validate_slug",
]
