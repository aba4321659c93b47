"""NIP-OA owner attestation: the `["auth", owner, conditions, sig]` tag.

An owner vouches for an agent key by signing (BIP-340) sha256 of
`"nostr:agent-auth:" + agent_pubkey_hex + ":" + conditions`. The conditions string is
signed verbatim, so it is validated but never normalized. A valid attestation is evidence,
not authorship: the event stays authored by `event.pubkey`. Pure: aux is an argument.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal, NamedTuple

from coincurve import PrivateKey, PublicKeyXOnly

from engram.errors import (
    AttestationFormatError,
    AttestationSignatureError,
    ConditionsError,
    ConditionsNotMetError,
    SelfAttestationError,
)
from engram.kinds import KIND_MAX
from engram.nip01 import Event, is_hex, pubkey_of, verify_event

AUTH_TAG = "auth"
AUTH_DOMAIN = "nostr:agent-auth:"
CREATED_AT_MAX = 4_294_967_295

ClauseName = Literal["kind=", "created_at<", "created_at>"]
_CLAUSE = re.compile(r"(kind=|created_at<|created_at>)(0|[1-9][0-9]{0,9})")
_LIMITS = {"kind=": KIND_MAX, "created_at<": CREATED_AT_MAX, "created_at>": CREATED_AT_MAX}


class Clause(NamedTuple):
    name: ClauseName
    value: int


class Attestation(NamedTuple):
    """A structurally valid `auth` tag; `clauses` is `conditions` parsed."""

    owner: str
    conditions: str
    sig: str
    clauses: tuple[Clause, ...]


def parse_conditions(conditions: str) -> tuple[Clause, ...]:
    """Empty, or `&`-joined clauses `kind=N`, `created_at<N`, `created_at>N` with canonical
    decimals (no sign, spaces or leading zeros); kind <= 65,535, created_at <= 2**32 - 1."""
    if conditions == "":
        return ()
    clauses: list[Clause] = []
    for part in conditions.split("&"):
        if not part:
            raise ConditionsError("empty clause (leading, trailing or doubled '&')")
        match = _CLAUSE.fullmatch(part)
        if match is None:
            raise ConditionsError(f"unsupported clause or non-canonical number: {part!r}")
        name, value = match.group(1), int(match.group(2))
        if value > _LIMITS[name]:
            raise ConditionsError(f"{name} value {value} is out of range")
        clauses.append(Clause(name, value))  # type: ignore[arg-type]
    return tuple(clauses)


def clauses_allow(clauses: tuple[Clause, ...], kind: int, created_at: int) -> bool:
    """Every clause holds: `kind=` equals, `created_at<`/`>` are strict bounds."""
    for name, value in clauses:
        if name == "kind=" and kind != value:
            return False
        if name == "created_at<" and not created_at < value:
            return False
        if name == "created_at>" and not created_at > value:
            return False
    return True


def check_conditions(conditions: str, kind: int, created_at: int) -> bool:
    """Whether an event of `kind` at `created_at` satisfies `conditions`.

    Raises `ConditionsError` if the string is malformed (that is not a mere "no").
    """
    return clauses_allow(parse_conditions(conditions), kind, created_at)


def attestation_preimage(agent_pubkey: str, conditions: str) -> bytes:
    return (AUTH_DOMAIN + agent_pubkey + ":" + conditions).encode("utf-8")


def attestation_digest(agent_pubkey: str, conditions: str) -> bytes:
    """The 32-byte message the owner signs."""
    return hashlib.sha256(attestation_preimage(agent_pubkey, conditions)).digest()


def sign_attestation(
    owner_seckey: bytes, agent_pubkey: str, conditions: str, aux: bytes
) -> list[str]:
    """Build the `auth` tag for `agent_pubkey`; `aux` is BIP-340's 32-byte randomness."""
    owner = pubkey_of(owner_seckey)
    if owner == agent_pubkey:
        raise SelfAttestationError("owner and agent keys must differ")
    parse_conditions(conditions)
    if len(aux) != 32:
        raise ValueError("BIP-340 aux must be 32 bytes")
    sig = PrivateKey(owner_seckey).sign_schnorr(attestation_digest(agent_pubkey, conditions), aux)
    return [AUTH_TAG, owner, conditions, sig.hex()]


def parse_auth_tag(tag: list[str]) -> Attestation:
    """Structure only: 4 elements, `auth`, lower-case hex owner and sig, conditions
    grammar. No curve or signature check (see `verify_auth_tag`)."""
    if len(tag) != 4:
        raise AttestationFormatError(f"auth tag must have exactly 4 elements, not {len(tag)}")
    label, owner, conditions, sig = tag
    if label != AUTH_TAG:
        raise AttestationFormatError("not an auth tag")
    if not is_hex(owner, 64):
        raise AttestationFormatError("owner pubkey must be 64 lower-case hex characters")
    if not is_hex(sig, 128):
        raise AttestationFormatError("signature must be 128 lower-case hex characters")
    return Attestation(owner, conditions, sig, parse_conditions(conditions))


def verify_auth_tag(tag: list[str], agent_pubkey: str) -> Attestation:
    """Structure, owner != agent, and the owner's signature over the preimage."""
    att = parse_auth_tag(tag)
    if att.owner == agent_pubkey:
        raise SelfAttestationError("owner and agent keys must differ")
    try:
        key = PublicKeyXOnly(bytes.fromhex(att.owner))
        ok = key.verify(bytes.fromhex(att.sig), attestation_digest(agent_pubkey, att.conditions))
    except ValueError as exc:
        raise AttestationFormatError("owner pubkey is not a point on secp256k1") from exc
    if not ok:
        raise AttestationSignatureError("owner signature does not verify")
    return att


def event_attestation(event: Event, *, check_event: bool = True) -> Attestation | None:
    """The event's verified attestation, or None if it carries no `auth` tag.

    More than one `auth` tag means no valid attestation (raises). The event's own id and
    signature are verified first unless the caller already did (`check_event=False`); the
    conditions are checked against the event's kind and created_at.
    """
    tags = [t for t in event.tags if t and t[0] == AUTH_TAG]
    if not tags:
        return None
    if len(tags) > 1:
        raise AttestationFormatError("more than one auth tag")
    if check_event and not verify_event(event):
        raise AttestationSignatureError("the carrying event's id or signature does not verify")
    att = verify_auth_tag(tags[0], event.pubkey)
    if not clauses_allow(att.clauses, event.kind, event.created_at):
        raise ConditionsNotMetError("event kind or created_at is outside the attested conditions")
    return att
