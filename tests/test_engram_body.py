"""Bodies (spec: *Bodies*): byte-exact encoding, strict parsing, the 65,535-byte cap."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import (
    BODY_MAX_BYTES,
    BodyTooLargeError,
    Core,
    InvalidBodyError,
    InvalidSlugError,
    Memory,
    Tombstone,
    body_text,
    encode_body,
    parse_body,
)
from engram.body import parse_object


def test_encoding_is_slug_first_without_whitespace() -> None:
    assert encode_body(Memory(slug="mem/x", value="a b")) == b'{"slug":"mem/x","value":"a b"}'
    assert encode_body(Tombstone(slug="mem/x")) == b'{"slug":"mem/x","value":null}'
    assert encode_body(Core(profile="me")) == b'{"slug":"core","profile":"me"}'


def test_encoding_escapes_like_json_dumps() -> None:
    text = 'é 😀 \u2028 \x00\x1f\x7f " \\ / \n\t'
    expected = json.dumps(
        {"slug": "mem/x", "value": text}, separators=(",", ":"), ensure_ascii=False
    )
    assert encode_body(Memory(slug="mem/x", value=text)) == expected.encode()


def test_body_types() -> None:
    assert parse_body('{"slug":"mem/x","value":"v"}') == Memory(slug="mem/x", value="v")
    assert parse_body('{"slug":"mem/x","value":null}') == Tombstone(slug="mem/x")
    assert parse_body('{"slug":"core","profile":""}') == Core(profile="")
    assert Core(profile="p").slug == "core"
    assert body_text(Memory(slug="mem/x", value="v")) == "v"
    assert body_text(Core(profile="p")) == "p"
    assert body_text(Tombstone(slug="mem/x")) is None


def test_unknown_members_are_ignored() -> None:
    raw = '{"future":{"nested":[1,2,{"a":null}]},"value":"v","slug":"mem/x","n":1.5,"b":true}'
    assert parse_body(raw) == Memory(slug="mem/x", value="v")
    assert parse_body('{"slug":"core","profile":"p","value":"ignored"}') == Core(profile="p")
    assert parse_body('{"slug":"mem/x","value":"v","list":["slug","slug"]}') is not None


def test_accepts_bytes_and_escaped_surrogate_pairs() -> None:
    assert parse_body(b'{"slug":"mem/x","value":"hi \\ud83d\\ude00"}') == Memory(
        slug="mem/x", value="hi 😀"
    )


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('{"slug":"mem/x","slug":"mem/y","value":"v"}', "duplicate slug"),
        ('{"slug":"mem/x","value":"v","value":"w"}', "duplicate value"),
        ('{"slug":"mem/x","value":"v","x":{"k":1,"k":2}}', "duplicate at depth"),
        ('{"slug":"mem/x","value":"v","x":[{"k":1,"k":1}]}', "duplicate inside an array"),
        ('{"slug":"mem/x","value":"\\ud800"}', "lone high surrogate"),
        ('{"slug":"mem/x","value":"\\udc00x"}', "lone low surrogate"),
        ('{"slug":"mem/x","value":"v","\\ud800":1}', "lone surrogate in a key"),
        ('{"slug":"mem/x","value":"v","n":NaN}', "NaN"),
        ('{"slug":"mem/x","value":"v","n":Infinity}', "Infinity"),
        ('{"slug":"mem/x","value":"v","n":-Infinity}', "-Infinity"),
        ('{"slug":"mem/x","value":"v"}x', "trailing data"),
        ('{"slug":"mem/x","value":"v"}{}', "second document"),
        ('["slug","mem/x"]', "array"),
        ('"mem/x"', "string"),
        ("null", "null"),
        ("", "empty"),
        ("{'slug':'mem/x'}", "not JSON"),
        ('{"slug":"mem/x","value":"v",}', "trailing comma"),
        ('{"value":"v"}', "missing slug"),
        ('{"slug":1,"value":"v"}', "slug not a string"),
        ('{"slug":"mem/x"}', "memory missing value"),
        ('{"slug":"mem/x","value":1}', "value not a string"),
        ('{"slug":"mem/x","value":["v"]}', "value an array"),
        ('{"slug":"mem/x","value":false}', "value a bool"),
        ('{"slug":"core"}', "core missing profile"),
        ('{"slug":"core","profile":null}', "core has no tombstone"),
        ('{"slug":"core","value":"v"}', "core with value only"),
        ('{"slug":"core","profile":5}', "profile not a string"),
        ("[" * 100_000 + "]" * 100_000, "absurd nesting"),
    ],
)
def test_parse_rejects(raw: str, why: str) -> None:
    with pytest.raises(InvalidBodyError):
        parse_body(raw)


def test_parse_rejects_invalid_utf8_and_raw_surrogates() -> None:
    with pytest.raises(InvalidBodyError):
        parse_body(b'{"slug":"mem/x","value":"\xff"}')
    with pytest.raises(InvalidBodyError):
        parse_body('{"slug":"mem/x","value":"\ud800"}')


@pytest.mark.parametrize("slug", ["MEM/x", "mem/", "mem/x.y", "notes", "core/x"])
def test_parse_rejects_invalid_slug(slug: str) -> None:
    with pytest.raises(InvalidSlugError):
        parse_body(json.dumps({"slug": slug, "value": "v"}))


def test_parse_object_is_only_the_json_layer() -> None:
    assert parse_object('{"slug":"nonsense"}') == {"slug": "nonsense"}
    with pytest.raises(InvalidBodyError, match="duplicate"):
        parse_object('{"a":1,"a":1}')


def test_encode_refuses_invalid_bodies() -> None:
    with pytest.raises(InvalidSlugError):
        encode_body(Memory(slug="mem/X", value="v"))
    with pytest.raises(InvalidBodyError):
        encode_body(Memory(slug="core", value="v"))
    with pytest.raises(InvalidBodyError):
        encode_body(Tombstone(slug="core"))
    with pytest.raises(InvalidBodyError):
        encode_body(Memory(slug="mem/x", value="\ud800"))


def test_size_limit_is_on_the_serialized_body() -> None:
    overhead = len(encode_body(Memory(slug="mem/x", value="")))
    at_limit = Memory(slug="mem/x", value="a" * (BODY_MAX_BYTES - overhead))
    assert len(encode_body(at_limit)) == BODY_MAX_BYTES == 65_535
    with pytest.raises(BodyTooLargeError):
        encode_body(Memory(slug="mem/x", value="a" * (BODY_MAX_BYTES - overhead + 1)))
    # escapes count: 1 character that serializes to 6 bytes
    with pytest.raises(BodyTooLargeError):
        encode_body(Memory(slug="mem/x", value="\x01" * (BODY_MAX_BYTES // 6 + 1)))
    # multi-byte UTF-8 counts in bytes
    with pytest.raises(BodyTooLargeError):
        encode_body(Core(profile="é" * (BODY_MAX_BYTES // 2)))


SLUGS = (
    st.lists(st.from_regex(r"[a-z0-9][a-z0-9_-]{0,63}", fullmatch=True), min_size=1, max_size=4)
    .map(lambda segments: "mem/" + "/".join(segments))
    .filter(lambda slug: len(slug) <= 255)
)
TEXT = st.text(max_size=300)
BODIES = st.one_of(
    st.builds(Memory, slug=SLUGS, value=TEXT),
    st.builds(Tombstone, slug=SLUGS),
    st.builds(Core, profile=TEXT),
)


@settings(max_examples=300)
@given(BODIES)
def test_parse_encode_round_trip(body: Memory | Tombstone | Core) -> None:
    assert parse_body(encode_body(body)) == body


@given(BODIES)
def test_encoding_is_canonical_json(body: Memory | Tombstone | Core) -> None:
    data = encode_body(body)
    obj = json.loads(data)
    assert next(iter(obj)) == "slug"
    assert json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() == data
