"""NIP-77 frames in relay.wire: decoded to messages, or answered NEG-ERR / NOTICE."""

from __future__ import annotations

import msgspec
import pytest

from relay import wire


def test_decodes_the_three_client_verbs() -> None:
    opened = wire.decode('["NEG-OPEN","s",{"kinds":[1]},"6100"]')
    assert isinstance(opened, wire.NegOpenMsg)
    assert (opened.sub_id, bytes(opened.filter), opened.message) == ("s", b'{"kinds":[1]}', b"a\0")
    msg = wire.decode('["NEG-MSG","s","61"]')
    assert isinstance(msg, wire.NegMsg) and msg.message == b"a"
    assert wire.decode('["NEG-CLOSE","s"]') == wire.NegCloseMsg("s")


@pytest.mark.parametrize(
    ("frame", "reply"),
    [
        ('["NEG-OPEN","s",{}]', ["NEG-ERR", "s", "invalid: NEG-OPEN takes 3 values"]),
        ('["NEG-OPEN","s",{},"61",32]', ["NEG-ERR", "s", "invalid: NEG-OPEN takes 3 values"]),
        (
            '["NEG-MSG","s","6g"]',
            ["NEG-ERR", "s", "invalid: negentropy message must be a hex string"],
        ),
        (
            '["NEG-MSG","s",97]',
            ["NEG-ERR", "s", "invalid: negentropy message must be a hex string"],
        ),
        ('["NEG-CLOSE","s","x"]', ["NEG-ERR", "s", "invalid: NEG-CLOSE takes 1 value"]),
        ('["NEG-MSG","","61"]', ["NEG-ERR", "", "invalid: subscription id must not be empty"]),
        ('["NEG-MSG"]', ["NOTICE", "invalid: NEG-MSG needs a subscription id"]),
        ('["NEG-MSG",1,"61"]', ["NOTICE", "invalid: NEG-MSG subscription id must be a string"]),
    ],
)
def test_bad_frames_are_answered(frame: str, reply: list) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.decode(frame)
    assert msgspec.json.decode(err.value.reply) == reply


def test_relay_frames() -> None:
    assert wire.neg_msg("s", b"a\x01") == b'["NEG-MSG","s","6101"]'
    assert wire.neg_err("s", "blocked: too big") == b'["NEG-ERR","s","blocked: too big"]'
