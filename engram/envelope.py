"""NIP-AE envelopes (spec: *Envelope*, *Validity of one event*, *Relay-side rules*).

`build_event` writes one engram; `validate_and_decrypt` reads one, applying the five
validity rules in spec order with one error type per rule; `validate_engram_envelope`
is the relay's ingest check, which cannot decrypt and must stay cheap.
Pure: created_at, the NIP-44 nonce and the BIP-340 aux are arguments.
"""

from __future__ import annotations

import base64
from typing import Any

from engram import nip44
from engram.body import Body, body_from_object, encode_body, parse_object, slug_of
from engram.errors import (
    BodyShapeError,
    DecryptError,
    EngramError,
    EnvelopeError,
    InvalidBodyError,
    Nip44Error,
    SignatureError,
    SlugMismatchError,
)
from engram.nip01 import Event, is_hex, sign_event, verify_event
from engram.slug import d_tag

KIND_ENGRAM = 30174
# The history extension (docs/NIP-AE-HISTORY.md, engram.versions): every version of a
# memory as a regular event, so relays keep them all. Revisions are signed by the agent
# and `p`-tag the owner, as heads do; owner verdicts are signed by the owner and `p`-tag
# the agent. Relays treat all three like engrams (private, the envelope check below).
KIND_REVISION = 4174
KIND_VERDICT = 4175
MEMORY_KINDS = frozenset((KIND_ENGRAM, KIND_REVISION, KIND_VERDICT))
ALT_TAG = ["alt", "encrypted agent memory record"]
REASON_PREFIX = "invalid: agent-engram "


def build_event(
    agent_seckey: bytes,
    owner_pubkey: str,
    body: Body,
    created_at: int,
    nonce: bytes,
    aux: bytes,
) -> Event:
    """Encrypt and sign one engram (spec: *Writing* steps 1 and 3).

    The size limit is enforced on the serialized body before anything is encrypted.
    `created_at` should come from `monotonic_created_at`; `nonce` and `aux` must be
    fresh random 32-byte strings in production.

    Raises:
        BodyTooLargeError, InvalidBodyError, InvalidSlugError: the body is unusable.
        Nip44Error: a key, nonce or length is invalid.
    """
    plaintext = encode_body(body).decode("utf-8")
    k_c = nip44.conversation_key(agent_seckey, owner_pubkey)
    tags = [["d", d_tag(k_c, body.slug)], ["p", owner_pubkey]]
    content = nip44.encrypt(plaintext, k_c, nonce)
    return sign_event(agent_seckey, created_at, KIND_ENGRAM, tags, content, aux)


def _single_tag(event: Event, name: str) -> str:
    values = [tag[1] if len(tag) > 1 else "" for tag in event.tags if tag and tag[0] == name]
    if len(values) != 1:
        raise EnvelopeError(f"need exactly one '{name}' tag, found {len(values)}")
    if not is_hex(values[0], 64):
        raise EnvelopeError(f"'{name}' tag must be 64 lower-case hex characters")
    return values[0]


def check_envelope(
    event: Event, agent_pubkey: str, owner_pubkey: str, kind: int = KIND_ENGRAM
) -> str:
    """Rule 1; returns the event's `d` value. `kind` and the two keys generalise it to
    the history extension's kinds (engram.versions), whose author may be the owner."""
    if event.kind != kind:
        raise EnvelopeError(f"kind is {event.kind}, not {kind}")
    if event.pubkey != agent_pubkey:
        raise EnvelopeError("event is not authored by the expected key")
    d = _single_tag(event, "d")
    if _single_tag(event, "p") != owner_pubkey:
        raise EnvelopeError("'p' tag does not name the expected key")
    return d


def open_event(
    event: Event, author: str, recipient: str, conversation_key: bytes, kind: int = KIND_ENGRAM
) -> tuple[dict[str, Any], str]:
    """Rules 1-4 for any kind of this family: envelope, signature (before decrypting),
    strict JSON, slug re-deriving to `d`. Returns the decrypted object and its slug."""
    d = check_envelope(event, author, recipient, kind)
    if not verify_event(event):
        raise SignatureError("event id or signature does not verify")
    try:
        obj = parse_object(nip44.decrypt(event.content, conversation_key))
    except Nip44Error as exc:
        raise DecryptError(f"content does not decrypt: {exc}") from exc
    except InvalidBodyError:
        raise DecryptError("plaintext is not a strict JSON object") from None
    try:
        slug = slug_of(obj)
    except EngramError:
        raise SlugMismatchError("body has no valid slug") from None
    if d_tag(conversation_key, slug) != d:
        raise SlugMismatchError("body slug does not re-derive to the event's 'd' tag")
    return obj, slug


def open_engram(
    event: Event, agent_pubkey: str, owner_pubkey: str, conversation_key: bytes
) -> tuple[Body, dict[str, Any]]:
    """`validate_and_decrypt`, also returning the decrypted object (whose members beyond
    NIP-AE's are the history extension's, engram.versions)."""
    obj, _ = open_event(event, agent_pubkey, owner_pubkey, conversation_key)
    try:
        return body_from_object(obj), obj
    except EngramError:
        raise BodyShapeError("body members do not match its slug's type") from None


def validate_and_decrypt(
    event: Event, agent_pubkey: str, owner_pubkey: str, conversation_key: bytes
) -> Body:
    """The five validity rules, in order (spec: *Validity of one event*).

    The signature is checked before anything is decrypted. Messages never include the
    plaintext or the slug, and content-derived causes are not chained.

    Raises:
        EnvelopeError (1), SignatureError (2), DecryptError (3), SlugMismatchError (4),
        BodyShapeError (5); all subclasses of `InvalidEngramError` with a `rule` attribute.
    """
    return open_engram(event, agent_pubkey, owner_pubkey, conversation_key)[0]


# --- relay side -------------------------------------------------------------------------

_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _tag_reason(event: Event) -> str | None:
    counts = {"d": 0, "p": 0}
    for tag in event.tags:
        if tag and tag[0] in counts:
            name = tag[0]
            counts[name] += 1
            if counts[name] > 1:
                return f"{REASON_PREFIX}event has more than one '{name}' tag"
            if len(tag) < 2 or not is_hex(tag[1], 64):
                return f"{REASON_PREFIX}'{name}' tag must be 64 lower-case hex characters"
    for name, count in counts.items():
        if count == 0:
            return f"{REASON_PREFIX}event has no '{name}' tag"
    return None


def _content_reason(content: str) -> str | None:
    if not content:
        return f"{REASON_PREFIX}content is empty"
    if len(content) % 4:
        return f"{REASON_PREFIX}content length is not a multiple of 4 (not padded base64)"
    body = content.rstrip("=")
    padding = len(content) - len(body)
    if padding > 2:
        return f"{REASON_PREFIX}content has more than two '=' padding characters"
    # bytes.translate deleting the alphabet: ~3x faster than a regex on an 87 KB payload.
    if not body.isascii() or body.encode("ascii").translate(None, _B64_ALPHABET):
        return f"{REASON_PREFIX}content is not standard base64"
    if len(content) * 3 // 4 - padding < nip44.DATA_MIN_BYTES:
        return f"{REASON_PREFIX}content decodes to fewer than {nip44.DATA_MIN_BYTES} bytes"
    if base64.b64decode(content[:4])[0] != nip44.VERSION:
        return f"{REASON_PREFIX}content is not a NIP-44 version 2 payload"
    return None


def validate_engram_envelope(event: Event) -> str | None:
    """Relay ingest rule for kind 30174 and the history kinds (MEMORY_KINDS): None if
    acceptable, else the `OK false` reason.

    The relay cannot decrypt, so it checks only the tag shape and that `content` looks like
    a NIP-44 v2 payload (lengths and a 4-character decode; no full base64 decode).
    Other kinds are not its business and pass (None).
    """
    if event.kind not in MEMORY_KINDS:
        return None
    return _tag_reason(event) or _content_reason(event.content)
