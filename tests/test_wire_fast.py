"""The fast path of REQ, COUNT and CLOSE (relay.wire `_fast`, relay.filters.PlainFilter):
whatever a frame is, it ends as the hand-decoded path ends it (the same filters, or the
same reply refusing it)."""

from __future__ import annotations

import msgspec
import pytest

from relay import wire
from relay.config import Limits
from relay.filters import Filter
from relay.reads import Reads

A = "ab" * 32
B = "0c" * 32

FRAMES = [
    f'["REQ","s",{{"authors":["{A}"],"limit":10}}]',
    f'["REQ","s",{{"authors":["{A}","{B}"],"kinds":[1,30174],"since":5,"until":9}}]',
    f'["REQ","s",{{"ids":["{A}"]}},{{"kinds":[0]}},{{}},{{"limit":0}}]',
    f'["COUNT","c",{{"authors":["{A}"]}}]',
    '["REQ","s",{"search":"hello world","kinds":[1]}]',
    '["REQ","s",{"limit":5,"limit":10}]',  # duplicate key: the last one
    '["REQ","s",{"limit":null,"limit":3}]',
    '["REQ","s",{"limit":3,"limit":null}]',
    '["REQ","s",{"limit":true}]',
    '["REQ","s",{"limit":10.0}]',
    '["REQ","s",{"limit":-1}]',
    '["REQ","s",{"limit":9223372036854775807}]',
    '["REQ","s",{"limit":9223372036854775808}]',
    '["REQ","s",{"kinds":[65535]}]',
    '["REQ","s",{"kinds":[65536]}]',
    '["REQ","s",{"kinds":[1,true]}]',
    '["REQ","s",{"authors":null}]',
    '["REQ","s",{"authors":"x"}]',
    f'["REQ","s",{{"authors":["{A.upper()}"]}}]',
    f'["REQ","s",{{"authors":["{A}\\n"]}}]',
    f'["REQ","s",{{"authors":["{A[:63]}\\n"]}}]',
    '["REQ","s",{"authors":[1]}]',
    '["REQ","s",{"search":"a\\u0000b"}]',
    '["REQ","s",{"search":' + msgspec.json.encode("w " * 200).decode() + "}]",
    '["REQ","s",{"search":5}]',
    '["REQ","s",{"tags":{}}]',
    '["REQ","s",{"#e":["x"]}]',
    f'["REQ","s",{{"kinds":[30174],"authors":["{A}"],"#p":["{A}"],"#d":["x"]}}]',
    '["REQ","s",{"search":"a \\"#b"}]',
    '["REQ","s",{"unknown":1}]',
    '["REQ","s",{}, null]',
    '["REQ","s",{},{},{},{},{}]',
    '["REQ","s"]',
    '["REQ",""]',
    '["REQ","",{}]',
    '["REQ",5,{}]',
    '["REQ","s",[]]',
    '["REQ","s",{}] x',
    '["REQ","s",{}',
    '["REQ","' + "x" * 100 + '",{}]',
    '["REQ","s",{"authors":[' + ",".join(f'"{A}"' for _ in range(600)) + "]}]",
    '["CLOSE","s"]',
    '["CLOSE",""]',
    '["CLOSE","s","t"]',
    '["CLOSE",5]',
    '["CLOSE"]',
]


def outcome(decode, frame: str, lim: Limits) -> object:
    """What a frame ends as: the reply refusing it, the CLOSE, or the parsed filters."""
    try:
        msg = decode(frame)
    except wire.WireError as exc:
        return ("reply", exc.reply)
    if isinstance(msg, wire.ReqMsg | wire.CountMsg):
        return (type(msg).__name__, msg.sub_id, Reads.parse_filters(msg.sub_id, msg.filters, lim))
    return msg


@pytest.mark.parametrize("frame", FRAMES)
def test_fast_path_ends_as_the_hand_decoded_path(frame: str) -> None:
    lim = Limits(max_filter_values=500, max_subid_length=64)
    assert outcome(wire.decode, frame, lim) == outcome(wire._decode, frame, lim)


def test_fast_path_takes_the_common_frames() -> None:
    msg = wire.decode(f'["REQ","s",{{"authors":["{A}"],"limit":10}}]')
    assert isinstance(msg, wire.ReqMsg) and type(msg.filters) is wire.PlainFilters
    assert Reads.parse_filters("s", msg.filters, Limits()) == [Filter(authors=[A], limit=10)]
    assert wire.decode('["CLOSE","s"]') == wire.CloseMsg("s")
    # a filter with tags goes the hand way
    msg = wire.decode(f'["REQ","s",{{"#p":["{A}"]}}]')
    assert isinstance(msg, wire.ReqMsg) and type(msg.filters) is not wire.PlainFilters


def test_a_refused_fast_filter_gets_the_hand_error() -> None:
    """A filter the types accept but the tenant's sizes refuse: parse_filter's reply."""
    msg = wire.decode(f'["REQ","s",{{"authors":["{A}","{B}","{A}"]}}]')
    assert type(msg.filters) is wire.PlainFilters
    got = Reads.parse_filters("s", msg.filters, Limits(max_filter_values=2))
    assert msgspec.json.decode(got) == ["CLOSED", "s", "invalid: too many authors (max 2)"]
