"""The wire codec with literal frames: messages out, specific replies for bad input."""

from __future__ import annotations

import msgspec
import pytest

from engram.nip01 import sign_event
from relay import wire

SK = bytes.fromhex("00" * 31 + "01")


def reply(frame: bytes) -> list:
    with pytest.raises(wire.WireError) as exc:
        wire.decode(frame)
    return msgspec.json.decode(exc.value.reply)


def test_req_keeps_every_filter():
    msg = wire.decode(b'["REQ","s",{"kinds":[1]},{"authors":[]},{}]')
    assert isinstance(msg, wire.ReqMsg)
    assert msg.sub_id == "s"
    assert [bytes(f) for f in msg.filters] == [b'{"kinds":[1]}', b'{"authors":[]}', b"{}"]


def test_event_round_trip_and_raw_id():
    ev = sign_event(SK, 1, 1, [["t", "x"]], "hé 😀", bytes(32))
    msg = wire.decode(b'["EVENT",' + msgspec.json.encode(ev) + b"]")
    assert isinstance(msg, wire.EventMsg)
    assert msg.event == ev
    raw = wire.encode_event(ev)
    assert wire.raw_id(raw) == ev.id
    assert wire.event_frame(wire.sub_prefix("s"), raw) == b'["EVENT","s",' + raw + b"]"


def test_close_and_auth():
    assert wire.decode(b'["CLOSE","abc"]') == wire.CloseMsg("abc")
    ev = sign_event(SK, 1, 22242, [], "", bytes(32))
    assert wire.decode(b'["AUTH",' + msgspec.json.encode(ev) + b"]") == wire.AuthMsg(ev)


@pytest.mark.parametrize(
    ("frame", "expect"),
    [
        (b"not json", ["NOTICE", "invalid: message is not valid JSON"]),
        (b"{}", ["NOTICE", "invalid: message must be a JSON array"]),
        (b"[]", ["NOTICE", "invalid: empty message"]),
        (b"[1]", ["NOTICE", "invalid: message type must be a string"]),
        (b'["NOPE"]', ["NOTICE", "invalid: unknown message type 'NOPE'"]),
        (b'["REQ"]', ["NOTICE", "invalid: REQ needs a subscription id"]),
        (b'["REQ",5,{}]', ["NOTICE", "invalid: REQ subscription id must be a string"]),
        (b'["REQ","",{}]', ["CLOSED", "", "invalid: subscription id must not be empty"]),
        (b'["CLOSE"]', ["NOTICE", "invalid: CLOSE takes exactly one subscription id"]),
        (b'["EVENT"]', ["NOTICE", "invalid: EVENT takes exactly one event"]),
        (b'["EVENT",[1,2]]', None),
    ],
)
def test_bad_frames_get_specific_replies(frame, expect):
    got = reply(frame)
    if expect is None:
        assert got[0] == "NOTICE" and got[1].startswith("invalid: malformed event")
    else:
        assert got == expect


def test_malformed_event_with_readable_id_gets_ok_false():
    eid = "ab" * 32
    got = reply(b'["EVENT",{"id":"' + eid.encode() + b'","kind":"x"}]')
    assert got[:3] == ["OK", eid, False]
    assert got[3].startswith("invalid: malformed event")


def test_lone_surrogate_and_bad_utf8_are_refused():
    assert reply(b'["EVENT",{"content":"\\ud800"}]')[0] == "NOTICE"
    assert reply(b'["REQ","\xff",{}]')[0] == "NOTICE"


def test_reason_prefixes():
    assert wire.Reason.INVALID("x") == "invalid: x"
    assert wire.Reason.AUTH_REQUIRED("y") == "auth-required: y"
    assert wire.Reason.RATE_LIMITED("z") == "rate-limited: z"
