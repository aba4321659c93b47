"""The history extension of NIP-AE (docs/NIP-AE-HISTORY.md): every version of a memory,
who asserted it, how sure, and when its fact holds.

A NIP-AE head (kind 30174) is replaced on the relay by the next write, so each write by
the agent also publishes a **revision** (kind 4174, a regular event: relays keep every
one), and the owner writes **verdicts** (kind 4175, signed by the owner alone):
confirmations, denials and corrections. All three carry the same body: the NIP-AE body
(`slug`, and `value` or `profile`; null means no value) plus the members of `Meta`.
A head written by the extension carries the same members and `rev`, the id of the
revision it copies, so a NIP-AE reader sees the same value as before and an extension
reader learns the version from the head alone.

A version is named by its event id: the revision's (agent), the verdict's (owner), or,
for a head written without the extension, the head's own.

Pure: created_at, nonces and aux are arguments.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import msgspec

from engram import nip44
from engram.body import BODY_MAX_BYTES, Body, body_text
from engram.envelope import (
    KIND_ENGRAM,
    KIND_REVISION,
    KIND_VERDICT,
    MEMORY_KINDS,
    open_engram,
    open_event,
)
from engram.errors import BodyShapeError, BodyTooLargeError, EngramError, InvalidBodyError
from engram.kinds import KIND_DELETION
from engram.nip01 import Event, is_hex, sign_event
from engram.slug import CORE_SLUG, d_tag, validate_slug

__all__ = [
    "AGENT",
    "AGENT_TRUST",
    "DEFAULT_TRUST",
    "KIND_REVISION",
    "KIND_VERDICT",
    "MEMORY_KINDS",
    "OWNER",
    "TRUST_STATES",
    "Meta",
    "Version",
    "build_head",
    "build_version",
    "encode_version_body",
    "head_version",
    "parse_meta",
    "sha256_text",
    "validate_version",
]

AGENT, OWNER = "agent", "owner"
# guess: the agent inferred it; stated: the user said so; confirmed, denied: owner verdicts.
TRUST_STATES = ("guess", "stated", "confirmed", "denied")
AGENT_TRUST = ("guess", "stated")
DEFAULT_TRUST = "guess"  # an agent's write that says nothing is its own inference
CONFIRMED, DENIED = "confirmed", "denied"
TEXT_MAX = 1024  # characters of `source` and `reason`
_INT64 = 2**63
# Members in the order they are written (after `slug` and `value`/`profile`).
MEMBERS = (
    "trust",
    "source",
    "valid_from",
    "valid_until",
    "reason",
    "rejected",
    "forget",
    "prev",
    "prev_sha256",
    "rev",
)


def sha256_text(text: str | None) -> str | None:
    """sha256 (hex) of a value's UTF-8 bytes; None for no value."""
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


class Meta(msgspec.Struct, frozen=True):
    """The extension's body members; defaults mean "absent".

    trust: one of TRUST_STATES. source: where the fact came from (a session, a tool, a
    URL). valid_from/valid_until: unix seconds, the half-open window [from, until) in
    which the fact holds in the world (either alone is allowed). reason: why a value was
    removed or denied. rejected: sha256 of values a tombstone or denial rejects (never
    the values). forget: a history barrier (every older version is forgotten). prev,
    prev_sha256: the predecessor version's id and value hash (the hash chain). rev: in a
    head only, the revision it copies.
    """

    trust: str | None = None
    source: str | None = None
    valid_from: int | None = None
    valid_until: int | None = None
    reason: str | None = None
    rejected: tuple[str, ...] = ()
    forget: bool = False
    prev: str | None = None
    prev_sha256: str | None = None
    rev: str | None = None


class Version(NamedTuple):
    """One version of one slug: a revision, a verdict, or a head read as a version.

    `text` is the value (core: the profile); None for a removal, denial or forget.
    `head` marks a kind-30174 event; `plain` a head without the extension's `rev` (written
    by a NIP-AE-only client, or over the extension's history).
    """

    event: Event
    slug: str
    text: str | None
    role: str
    meta: Meta
    head: bool = False
    plain: bool = False

    @property
    def id(self) -> str:
        """The version's name: a head copy is named by the revision it copies."""
        return self.meta.rev if self.head and self.meta.rev else self.event.id

    @property
    def created_at(self) -> int:
        return self.event.created_at

    @property
    def author(self) -> str:
        return self.event.pubkey

    @property
    def value_sha256(self) -> str | None:
        return sha256_text(self.text)


# --- bodies -----------------------------------------------------------------------------


def _check_text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > TEXT_MAX:
        raise InvalidBodyError(f"'{name}' must be a string of at most {TEXT_MAX} characters")
    return value


def _check_time(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT64 <= value < _INT64:
        raise InvalidBodyError(f"'{name}' must be an integer (unix seconds)")
    return value


def _check_hex(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not is_hex(value, 64):
        raise InvalidBodyError(f"'{name}' must be 64 lower-case hex characters")
    return value


def parse_meta(obj: dict[str, Any], role: str, text: str | None) -> Meta:
    """The extension members of a decrypted body, checked for `role`; InvalidBodyError.

    The agent writes only `guess` or `stated`; an owner's value is `confirmed`, an owner's
    null is `denied` (or a forget). Unknown members are ignored.
    """
    trust = obj.get("trust")
    if trust is not None and trust not in TRUST_STATES:
        raise InvalidBodyError(f"'trust' must be one of {', '.join(TRUST_STATES)}")
    forget = obj.get("forget", False)
    if not isinstance(forget, bool) or (forget and text is not None):
        raise InvalidBodyError("'forget' must be a boolean, true only without a value")
    if role == AGENT and trust is not None and trust not in AGENT_TRUST:
        raise InvalidBodyError("only the owner's verdicts may be 'confirmed' or 'denied'")
    if role == OWNER:
        wanted = CONFIRMED if text is not None else DENIED
        if trust != wanted and not (forget and trust is None):
            what = "value" if text is not None else "removal"
            raise InvalidBodyError(f"an owner's {what} is '{wanted}'")
    rejected = obj.get("rejected", [])
    if not isinstance(rejected, list) or not all(
        isinstance(h, str) and is_hex(h, 64) for h in rejected
    ):
        raise InvalidBodyError("'rejected' must be a list of sha256 hex strings")
    valid_from = _check_time("valid_from", obj.get("valid_from"))
    valid_until = _check_time("valid_until", obj.get("valid_until"))
    if valid_from is not None and valid_until is not None and valid_from >= valid_until:
        raise InvalidBodyError("'valid_from' must be before 'valid_until'")
    return Meta(
        trust=trust,
        source=_check_text("source", obj.get("source")),
        valid_from=valid_from,
        valid_until=valid_until,
        reason=_check_text("reason", obj.get("reason")),
        rejected=tuple(rejected),
        forget=forget,
        prev=_check_hex("prev", obj.get("prev")),
        prev_sha256=_check_hex("prev_sha256", obj.get("prev_sha256")),
        rev=_check_hex("rev", obj.get("rev")),
    )


def encode_version_body(slug: str, text: str | None, meta: Meta) -> bytes:
    """`{"slug":…,"value"|"profile":…, <members in MEMBERS order>}` without whitespace;
    absent members are left out. Raises if over 65,535 bytes or not UTF-8."""
    obj: dict[str, Any] = {"slug": validate_slug(slug)}
    obj["profile" if slug == CORE_SLUG else "value"] = text
    for name in MEMBERS:
        value = getattr(meta, name)
        if value is None or value is False or value == ():
            continue
        obj[name] = list(value) if name == "rejected" else value
    try:
        data = msgspec.json.encode(obj)
    except UnicodeEncodeError as exc:
        raise InvalidBodyError("body text contains a lone surrogate (not UTF-8)") from exc
    if len(data) > BODY_MAX_BYTES:
        raise BodyTooLargeError(f"serialized body is {len(data)} bytes, more than {BODY_MAX_BYTES}")
    return data


def _text_of(obj: dict[str, Any], slug: str) -> str | None:
    name = "profile" if slug == CORE_SLUG else "value"
    if name not in obj:
        raise InvalidBodyError(f"body needs '{name}'")
    text = obj[name]
    if text is not None and not isinstance(text, str):
        raise InvalidBodyError(f"'{name}' must be a string or null")
    return text


# --- events -----------------------------------------------------------------------------


def _sealed(
    seckey: bytes,
    peer: str,
    kind: int,
    slug: str,
    body: bytes,
    created_at: int,
    nonce: bytes,
    aux: bytes,
) -> Event:
    k_c = nip44.conversation_key(seckey, peer)
    content = nip44.encrypt(body.decode("utf-8"), k_c, nonce)
    return sign_event(
        seckey, created_at, kind, [["d", d_tag(k_c, slug)], ["p", peer]], content, aux
    )


def _checked_body(slug: str, text: str | None, meta: Meta, role: str) -> bytes:
    """The serialized body, refused when its own readers would reject it."""
    if slug == CORE_SLUG and text is None and role == AGENT:
        raise InvalidBodyError("core has no removal; write an empty profile instead")
    body = encode_version_body(slug, text, meta)
    parse_meta(msgspec.json.decode(body), role, text)  # the same check every reader makes
    return body


def build_version(
    seckey: bytes,
    peer_pubkey: str,
    role: str,
    slug: str,
    text: str | None,
    meta: Meta,
    created_at: int,
    nonce: bytes,
    aux: bytes,
) -> Event:
    """A revision (role agent: the agent's key, `p` the owner) or a verdict (role owner:
    the owner's key, `p` the agent). Refuses a body its own readers would reject."""
    if meta.rev is not None:
        raise InvalidBodyError("'rev' belongs to heads only")
    body = _checked_body(slug, text, meta, role)
    kind = KIND_REVISION if role == AGENT else KIND_VERDICT
    return _sealed(seckey, peer_pubkey, kind, slug, body, created_at, nonce, aux)


def build_head(
    agent_seckey: bytes,
    owner_pubkey: str,
    slug: str,
    text: str | None,
    meta: Meta,
    created_at: int,
    nonce: bytes,
    aux: bytes,
) -> Event:
    """The NIP-AE head (kind 30174) of an agent's version: its body plus `rev`."""
    if meta.rev is None:
        raise InvalidBodyError("a versioned head names its revision ('rev')")
    body = _checked_body(slug, text, meta, AGENT)
    return _sealed(agent_seckey, owner_pubkey, KIND_ENGRAM, slug, body, created_at, nonce, aux)


def head_version(event: Event, body: Body, obj: dict[str, Any]) -> Version:
    """A valid NIP-AE head as a version. Members that fail the extension's checks make it
    a plain head (NIP-AE ignores them; so does this reader), never an invalid one."""
    text = body_text(body)
    slug = body.slug
    try:
        meta = parse_meta(obj, AGENT, text)
    except EngramError:
        meta = Meta()
    return Version(event, slug, text, AGENT, meta, head=True, plain=meta.rev is None)


def validate_version(
    event: Event, agent_pubkey: str, owner_pubkey: str, conversation_key: bytes
) -> Version:
    """Any event of the memory (MEMORY_KINDS) as a version, or an InvalidEngramError.

    NIP-AE's five rules, with the author and `p` of each kind: a revision is the agent's
    and names the owner; a verdict is the owner's and names the agent.
    """
    if event.kind == KIND_ENGRAM:
        body, obj = open_engram(event, agent_pubkey, owner_pubkey, conversation_key)
        return head_version(event, body, obj)
    if event.kind == KIND_VERDICT:
        role, author, recipient = OWNER, owner_pubkey, agent_pubkey
    else:  # KIND_REVISION, and any other kind fails rule 1 here
        role, author, recipient = AGENT, agent_pubkey, owner_pubkey
    kind = event.kind if event.kind in MEMORY_KINDS else KIND_REVISION
    obj, slug = open_event(event, author, recipient, conversation_key, kind)
    try:
        text = _text_of(obj, slug)
        if slug == CORE_SLUG and text is None and role == AGENT:
            raise InvalidBodyError("core has no removal")
        meta = msgspec.structs.replace(parse_meta(obj, role, text), rev=None)
    except EngramError:
        raise BodyShapeError("body members do not match a version's shape") from None
    return Version(event, slug, text, role, meta)


DELETION_IDS_MAX = 500  # `e` tags per deletion request (relays bound tags per event)


def build_deletions(
    seckey: bytes, events: list[Event], created_at: int, aux: list[bytes]
) -> list[Event]:
    """NIP-09 deletion requests for `events` (all signed by `seckey`'s key), by `e` tag
    only, with their kinds as `k` tags: an `a` tag would also delete the address's newer
    versions (the forget itself). `aux`: one fresh 32-byte string per request. The
    requests are public: a relay and its readers learn these ids were deleted, not what
    they held."""
    out: list[Event] = []
    chunks = [events[i : i + DELETION_IDS_MAX] for i in range(0, len(events), DELETION_IDS_MAX)]
    for chunk, fresh in zip(chunks, aux, strict=False):
        kinds = sorted({e.kind for e in chunk})
        tags = [["e", e.id] for e in chunk] + [["k", str(k)] for k in kinds]
        out.append(sign_event(seckey, created_at, KIND_DELETION, tags, "", fresh))
    return out
