"""Errors of the pure protocol core: one subclass per spec rule, so callers can tell them apart.

Every class derives from `EngramError` and `ValueError`. No message ever carries a secret
key or a plaintext body: errors end up in logs and CLI output.
"""

from __future__ import annotations


class EngramError(Exception):
    """Base of every error raised by the `engram` package."""


class KeyFormatError(EngramError, ValueError):
    """A key string is neither 64-hex nor the right NIP-19 form (never echoes secrets)."""


# --- NIP-44 v2 --------------------------------------------------------------------------


class Nip44Error(EngramError, ValueError):
    """NIP-44 v2 refused its input; the subclass names the failed check."""


class InvalidSecretKeyError(Nip44Error):
    """The secret key is not a 32-byte scalar in [1, n-1]."""


class InvalidPublicKeyError(Nip44Error):
    """The public key is not 64 lower-case hex, or its x has no point on secp256k1."""


class InvalidConversationKeyError(Nip44Error):
    """A conversation key must be exactly 32 bytes."""


class InvalidNonceError(Nip44Error):
    """A NIP-44 nonce must be exactly 32 bytes."""


class PlaintextLengthError(Nip44Error):
    """Plaintext must be 1..65,535 UTF-8 bytes (message too short or too long)."""


class UnknownVersionError(Nip44Error):
    """The payload is not NIP-44 version 2 (`#` prefix or a version byte other than 2)."""


class InvalidPayloadLengthError(Nip44Error):
    """Payload (132..87,472 chars) or decoded data (99..65,603 bytes) out of range."""


class InvalidBase64Error(Nip44Error):
    """The payload is not standard, padded base64."""


class InvalidMacError(Nip44Error):
    """The HMAC-SHA256 tag does not match: wrong key or tampered payload."""


class InvalidPaddingError(Nip44Error):
    """The decrypted length prefix disagrees with the padded length."""


class InvalidPlaintextError(Nip44Error):
    """The authenticated plaintext is not valid UTF-8."""


# --- NIP-AE: slugs and bodies -----------------------------------------------------------


class InvalidSlugError(EngramError, ValueError):
    """A slug is neither `core` nor a valid `mem/…` path of at most 255 bytes."""


class InvalidBodyError(EngramError, ValueError):
    """A body is not a JSON object of the right shape (or has duplicate member names)."""


class BodyTooLargeError(InvalidBodyError):
    """The serialized body exceeds NIP-44's 65,535-byte plaintext limit."""


class ClockConflictError(EngramError, ValueError):
    """The current head is implausibly far in the future (a clock-poisoned head)."""


# --- NIP-AE: validity of one event (spec: *Validity of one event*, rules 1-5) ----------


class InvalidEngramError(EngramError, ValueError):
    """An event failed one of the five validity rules; `rule` says which (1-5)."""

    rule: int = 0


class EnvelopeError(InvalidEngramError):
    """Rule 1: kind, author, exactly one `d` and one `p` (64 lower hex), `p == owner`."""

    rule = 1


class SignatureError(InvalidEngramError):
    """Rule 2: the NIP-01 id or the BIP-340 signature does not verify."""

    rule = 2


class DecryptError(InvalidEngramError):
    """Rule 3: content does not decrypt under K_c to a JSON object without duplicates."""

    rule = 3


class SlugMismatchError(InvalidEngramError):
    """Rule 4: the body's slug is invalid or does not re-derive to the event's `d`."""

    rule = 4


class BodyShapeError(InvalidEngramError):
    """Rule 5: the body's members do not match its slug's type (memory or core)."""

    rule = 5


# --- NIP-OA: owner attestation ----------------------------------------------------------


class AttestationError(EngramError, ValueError):
    """An `auth` tag (NIP-OA) is not a valid owner attestation."""


class AttestationFormatError(AttestationError):
    """Not exactly one `["auth", owner, conditions, sig]` tag with lower-case hex."""


class ConditionsError(AttestationError):
    """The conditions string breaks the clause grammar (canonical decimals, `&`)."""


class SelfAttestationError(AttestationError):
    """The owner key equals the agent key."""


class AttestationSignatureError(AttestationError):
    """The owner's BIP-340 signature over the attestation preimage does not verify."""


class ConditionsNotMetError(AttestationError):
    """The event's kind or created_at falls outside what the conditions allow."""
