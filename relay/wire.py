"""Wire codec (NIP-01): frames in, typed messages out; relay messages encoded to bytes.

Sans-I/O: no asyncio, no sockets. Frames are decoded as `list[msgspec.Raw]` and
dispatched by hand: a tagged array-like Struct would silently drop extra REQ filters.
The commonest frames (a REQ or COUNT of one to four filters without tags, a CLOSE) are
first decoded by one strict typed call (`_fast`): what it accepts is exactly what the
hand dispatch accepts, and anything it refuses is decoded the hand way, for the reply.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

import msgspec

from engram.nip01 import Event, is_hex

_frame = msgspec.json.Decoder(list[msgspec.Raw])
_str = msgspec.json.Decoder(str)
_event = msgspec.json.Decoder(Event)
_obj = msgspec.json.Decoder(dict[str, Any])
encode = msgspec.json.Encoder().encode


class Reason(enum.StrEnum):
    """NIP-01 machine-readable prefixes: the only way reasons are built."""

    INVALID = "invalid"
    RESTRICTED = "restricted"
    AUTH_REQUIRED = "auth-required"
    RATE_LIMITED = "rate-limited"
    BLOCKED = "blocked"
    DUPLICATE = "duplicate"
    POW = "pow"
    ERROR = "error"
    CLOSED = "closed"  # NIP-77: a negentropy session the relay ended

    def __call__(self, text: str) -> str:
        return f"{self.value}: {text}"


class WireError(ValueError):
    """A frame that cannot be dispatched; `reply` is the frame to send back."""

    def __init__(self, reply: bytes) -> None:
        super().__init__(reply.decode("utf-8", "replace"))
        self.reply = reply


class EventMsg(msgspec.Struct):
    event: Event


class ReqMsg(msgspec.Struct):
    sub_id: str
    filters: list[msgspec.Raw]


class CountMsg(msgspec.Struct):
    sub_id: str
    filters: list[msgspec.Raw]


class CloseMsg(msgspec.Struct):
    sub_id: str


_MAX_INT = 2**63 - 1
_Kind = Annotated[int, msgspec.Meta(ge=0, le=65535)]
_Count = Annotated[int, msgspec.Meta(ge=0, le=_MAX_INT)]


class PlainFilter(msgspec.Struct, forbid_unknown_fields=True):
    """A filter without tags as `_fast` decodes a whole REQ in one call (the commonest
    REQs; relay.filters.parse_filter walks a decoded dict in Python, twice the time):
    each field typed as parse_filter requires it (an absent field is None, but null is
    refused, as are a bool or a float for an integer and kinds outside 0..65535; an
    unknown field, "#x" included, is refused). What the types do not say (hex, the
    tenant's sizes, the search rules) relay.filters.from_plain checks. Anything refused
    takes the hand way, which gives the error: this path only ever accepts what
    parse_filter accepts, as parse_filter would have parsed it."""

    ids: list[str] = None  # type: ignore[assignment]
    authors: list[str] = None  # type: ignore[assignment]
    kinds: list[_Kind] = None  # type: ignore[assignment]
    since: _Count = None  # type: ignore[assignment]
    until: _Count = None  # type: ignore[assignment]
    limit: _Count = None  # type: ignore[assignment]
    search: str = None  # type: ignore[assignment]


class PlainFilters(list[PlainFilter]):
    """A REQ's or COUNT's filters as the fast path decoded them (in ReqMsg.filters, in
    place of the raw ones), with the frame: relay.reads parses it the hand way
    (`raw_filters`) when one of them must be refused, for parse_filter's error."""

    __slots__ = ("frame",)
    frame: bytes | str


# A REQ or COUNT of one to four filters; a further filter or a null fails (the defaults
# are not in the types) and takes the hand way.
class _Req(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    verb: str
    sub_id: str
    f0: PlainFilter
    f1: PlainFilter = None  # type: ignore[assignment]
    f2: PlainFilter = None  # type: ignore[assignment]
    f3: PlainFilter = None  # type: ignore[assignment]


class _Close(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    verb: str
    sub_id: str


_req = msgspec.json.Decoder(_Req)
_close = msgspec.json.Decoder(_Close)


class AuthMsg(msgspec.Struct):
    event: Event


class NegOpenMsg(msgspec.Struct):
    """NIP-77 `["NEG-OPEN", <sub>, <filter>, <hex message>]`."""

    sub_id: str
    filter: msgspec.Raw
    message: bytes


class NegMsg(msgspec.Struct):
    sub_id: str
    message: bytes


class NegCloseMsg(msgspec.Struct):
    sub_id: str


Message = EventMsg | ReqMsg | CountMsg | CloseMsg | AuthMsg | NegOpenMsg | NegMsg | NegCloseMsg


def _id_of(raw: msgspec.Raw) -> str | None:
    """The event id from a malformed event object, when it can be read, to answer OK."""
    try:
        eid = _obj.decode(raw).get("id")
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    return eid if isinstance(eid, str) and is_hex(eid, 64) else None


def _decode_event(raw: msgspec.Raw, verb: str) -> Event:
    try:
        return _event.decode(raw)
    except msgspec.ValidationError as exc:
        why = Reason.INVALID(f"malformed event: {exc}")
    except (msgspec.DecodeError, RecursionError):
        why = Reason.INVALID("event is not valid JSON")
    eid = _id_of(raw)
    if eid is not None:
        raise WireError(ok(eid, False, why))
    raise WireError(notice(f"{why} in {verb}"))


def _sub_id(raw: msgspec.Raw, verb: str, neg: bool = False) -> str:
    try:
        sub_id = _str.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError(notice(Reason.INVALID(f"{verb} subscription id must be a string"))) from exc
    if not sub_id:
        why = Reason.INVALID("subscription id must not be empty")
        raise WireError(neg_err(sub_id, why) if neg else closed(sub_id, why))
    return sub_id


def decode(frame: bytes | str) -> Message:
    """Decode one client frame. Raises WireError carrying the reply for bad frames."""
    if type(frame) is str and '"#' not in frame:  # a filter with tags: the hand way
        msg = _fast(frame)
        if msg is not None:
            return msg
    return _decode(frame)


_REQ_OR_COUNT = ('["REQ",', '["COUNT",')


def _fast(frame: str) -> Message | None:
    """A compact REQ, COUNT or CLOSE in one strict call (see the module), else None.
    `decode` does not try it for a frame with a `"#` anywhere (a filter with tags, as
    the engram head fetch's #p and #d): the hand way takes it with no failed attempt."""
    try:
        if frame.startswith(_REQ_OR_COUNT):
            r = _req.decode(frame)
            if r.verb not in ("REQ", "COUNT") or not r.sub_id:
                return None
            filters = PlainFilters((r.f0,))
            filters.frame = frame
            if r.f1 is not None:
                for f in (r.f1, r.f2, r.f3):
                    if f is None:
                        break
                    filters.append(f)
            return (ReqMsg if r.verb == "REQ" else CountMsg)(r.sub_id, filters)  # type: ignore[arg-type]
        if frame.startswith('["CLOSE",'):
            c = _close.decode(frame)
            return CloseMsg(c.sub_id) if c.verb == "CLOSE" and c.sub_id else None
    except msgspec.DecodeError:
        return None
    return None


def raw_filters(frame: bytes | str) -> list[msgspec.Raw]:
    """The raw filters of a REQ or COUNT frame that the fast path decoded (`PlainFilters`)."""
    msg = _decode(frame)
    assert isinstance(msg, ReqMsg | CountMsg)
    return msg.filters


def _decode(frame: bytes | str) -> Message:
    """`decode`, by hand."""
    try:
        items = _frame.decode(frame)
    except msgspec.ValidationError as exc:
        raise WireError(notice(Reason.INVALID("message must be a JSON array"))) from exc
    except msgspec.DecodeError as exc:
        raise WireError(notice(Reason.INVALID("message is not valid JSON"))) from exc
    except RecursionError as exc:  # msgspec recurses per nesting level
        raise WireError(notice(Reason.INVALID("message is nested too deeply"))) from exc
    if not items:
        raise WireError(notice(Reason.INVALID("empty message")))
    try:
        verb = _str.decode(items[0])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError(notice(Reason.INVALID("message type must be a string"))) from exc
    if verb == "EVENT":
        if len(items) != 2:
            raise WireError(notice(Reason.INVALID("EVENT takes exactly one event")))
        return EventMsg(_decode_event(items[1], verb))
    if verb in ("REQ", "COUNT"):
        if len(items) < 2:
            raise WireError(notice(Reason.INVALID(f"{verb} needs a subscription id")))
        sub_id = _sub_id(items[1], verb)
        return (ReqMsg if verb == "REQ" else CountMsg)(sub_id, list(items[2:]))
    if verb == "CLOSE":
        if len(items) != 2:
            raise WireError(notice(Reason.INVALID("CLOSE takes exactly one subscription id")))
        return CloseMsg(_sub_id(items[1], verb))
    if verb == "AUTH":
        if len(items) != 2:
            raise WireError(notice(Reason.INVALID("AUTH takes exactly one event")))
        return AuthMsg(_decode_event(items[1], verb))
    if verb in _NEG_ARITY:
        return _decode_negentropy(verb, items)
    raise WireError(notice(Reason.INVALID(f"unknown message type {verb[:16]!r}")))


_NEG_ARITY = {"NEG-OPEN": 4, "NEG-MSG": 3, "NEG-CLOSE": 2}


def _decode_negentropy(verb: str, items: list[msgspec.Raw]) -> Message:
    """NIP-77 frames; once the subscription id is known, errors answer with NEG-ERR."""
    if len(items) < 2:
        raise WireError(notice(Reason.INVALID(f"{verb} needs a subscription id")))
    sub_id = _sub_id(items[1], verb, neg=True)
    if len(items) != _NEG_ARITY[verb]:
        n = _NEG_ARITY[verb] - 1
        why = Reason.INVALID(f"{verb} takes {n} value{'s' if n > 1 else ''}")
        raise WireError(neg_err(sub_id, why))
    if verb == "NEG-CLOSE":
        return NegCloseMsg(sub_id)
    try:
        hex_msg = _str.decode(items[-1])
        message = bytes.fromhex(hex_msg)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise WireError(
            neg_err(sub_id, Reason.INVALID("negentropy message must be a hex string"))
        ) from exc
    if verb == "NEG-MSG":
        return NegMsg(sub_id, message)
    return NegOpenMsg(sub_id, items[2], message)


def encode_event(event: Event) -> bytes:
    """The compact JSON of an event, the form stored and served."""
    return encode(event)


def decode_stored(raw: bytes) -> Event:
    """An event the relay stored itself (already validated); ValueError if it is not one."""
    try:
        return _event.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(str(exc)) from exc


def ok(event_id: str, accepted: bool, message: str = "") -> bytes:
    return encode(["OK", event_id, accepted, message])


def notice(message: str) -> bytes:
    return encode(["NOTICE", message])


def closed(sub_id: str, message: str) -> bytes:
    return encode(["CLOSED", sub_id, message])


def neg_msg(sub_id: str, message: bytes) -> bytes:
    return encode(["NEG-MSG", sub_id, message.hex()])


def neg_err(sub_id: str, reason: str) -> bytes:
    return encode(["NEG-ERR", sub_id, reason])


def eose(sub_id: str) -> bytes:
    return encode(["EOSE", sub_id])


def auth_challenge(challenge: str) -> bytes:
    return encode(["AUTH", challenge])


def count(sub_id: str, n: int) -> bytes:
    return encode(["COUNT", sub_id, {"count": n}])


def event_frame(sub_prefix: bytes, raw_event: bytes) -> bytes:
    """`["EVENT",<sub>,<event>]` from a pre-encoded `["EVENT",<sub>,` prefix: no re-encoding."""
    return sub_prefix + raw_event + b"]"


class _Author(msgspec.Struct):
    pubkey: str
    kind: int


_author = msgspec.json.Decoder(_Author)


def raw_author(raw: bytes) -> tuple[str, int]:
    """The author and kind of a stored event's raw JSON; ValueError if it has none."""
    try:
        head = _author.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(str(exc)) from exc
    return head.pubkey, head.kind


def raw_id(raw: bytes) -> str:
    """The id of an event encoded by `encode_event` (its first member, at a fixed offset)."""
    if raw[:7] != b'{"id":"':
        raise ValueError("not an event encoded by encode_event")
    return raw[7:71].decode()


def sub_prefix(sub_id: str) -> bytes:
    return b'["EVENT",' + encode(sub_id) + b","
