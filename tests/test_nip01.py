"""NIP-01 core: canonical serialization, ids, signatures, key parsing, and interop with
independent Nostr libraries (nostr-sdk, pynostr) in both directions."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import nip19
from engram.errors import KeyFormatError
from engram.nip01 import (
    Event,
    all_hex,
    event_id,
    is_hex,
    parse_public_key,
    parse_secret_key,
    pubkey_of,
    serialize_for_id,
    sign_event,
    verify_event,
)

SECKEY = bytes.fromhex("00" * 31 + "01")
PUBKEY = "79be667ef9dcbbac55a06295ce870b07029bfcdb2dce28d959f2815b16f81798"
AUX = bytes(32)
NASTY = "é 😀 \u2028\u2029 \x00\x01\x1f\x7f \" \\ / \n\r\t\b\f <>&'"


def reference_serialization(pubkey: str, created_at: int, kind: int, tags, content) -> bytes:
    return json.dumps(
        [0, pubkey, created_at, kind, tags, content], separators=(",", ":"), ensure_ascii=False
    ).encode()


def test_serialize_for_id_matches_json_dumps_on_nasty_text() -> None:
    tags = [["t", NASTY], ["p", PUBKEY, "wss://x"]]
    assert serialize_for_id(PUBKEY, 1, 1, tags, NASTY) == reference_serialization(
        PUBKEY, 1, 1, tags, NASTY
    )


@settings(max_examples=300)
@given(
    content=st.text(alphabet=st.characters(max_codepoint=0x7F) | st.sampled_from("é😀\u2028")),
    tags=st.lists(st.lists(st.text(max_size=8), min_size=1, max_size=3), max_size=3),
    created_at=st.integers(0, 2**40),
    kind=st.integers(0, 65535),
)
def test_serialize_for_id_is_canonical(content, tags, created_at, kind) -> None:
    assert serialize_for_id(PUBKEY, created_at, kind, tags, content) == (
        reference_serialization(PUBKEY, created_at, kind, tags, content)
    )


def test_sign_and_verify_round_trip() -> None:
    event = sign_event(SECKEY, 1_700_000_000, 1, [["t", "x"]], NASTY, AUX)
    assert event.pubkey == PUBKEY == pubkey_of(SECKEY)
    assert event.id == event_id(PUBKEY, 1_700_000_000, 1, [["t", "x"]], NASTY)
    assert verify_event(event)


@pytest.mark.parametrize(
    "change",
    [
        {"content": "tampered"},
        {"created_at": 1},
        {"kind": 2},
        {"tags": []},
        {"pubkey": "c6047f9441ed7d6d3045406e95c07cd85c778e4b8cef3ca7abac09b95c709ee5"},
        {"sig": "00" * 64},
        {"sig": "zz" * 64},
        {"id": "AB" * 32},
        {"pubkey": "00" * 32},  # not on the curve
        {"content": "\ud800"},  # unserializable: invalid, not a crash
    ],
)
def test_verify_rejects_any_change(change: dict) -> None:
    event = sign_event(SECKEY, 1_700_000_000, 1, [["t", "x"]], "hello", AUX)
    assert verify_event(event)
    assert not verify_event(msgspec.structs.replace(event, **change))


def test_sign_rejects_bad_aux() -> None:
    with pytest.raises(ValueError):
        sign_event(SECKEY, 1, 1, [], "", b"short")


def test_is_hex() -> None:
    assert is_hex("ab" * 32, 64)
    assert not is_hex("AB" * 32, 64)
    assert not is_hex("ab" * 32 + "\n", 64)
    assert not is_hex("ab" * 31, 64)
    assert not is_hex("gg" * 32, 64)


_HEXISH = st.text(alphabet="0123456789abcdefABx\n", min_size=62, max_size=66)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_HEXISH, st.sampled_from(["ab" * 32, "0f" * 32])), max_size=6))
def test_all_hex_is_is_hex_of_every_value(values: list[str]) -> None:
    """One translation for the whole list says what a call per value says (lengths
    that would add up to the right total, an upper-case or stray character anywhere)."""
    assert all_hex(values, 64) == all(is_hex(v, 64) for v in values)
    assert all_hex(["ab" * 32] * 3, 64) and all_hex([], 64)
    assert not all_hex(["ab" * 31, "ab" * 33], 64)


def test_parse_keys_hex_and_nip19() -> None:
    nsec = nip19.nsec(SECKEY)
    npub = nip19.npub(PUBKEY)
    assert nsec.startswith("nsec1") and npub.startswith("npub1")
    assert parse_secret_key(nsec) == SECKEY
    assert parse_secret_key(SECKEY.hex()) == SECKEY
    assert parse_secret_key(" " + SECKEY.hex().upper() + "\n") == SECKEY
    assert parse_public_key(npub) == PUBKEY
    assert parse_public_key(PUBKEY.upper()) == PUBKEY


@pytest.mark.parametrize(
    "bad",
    ["", "nsec1qqqq", "00" * 32, "ff" * 32, "xyz", "11" * 31, nip19.npub(PUBKEY)],
)
def test_parse_secret_key_rejects_without_echoing(bad: str) -> None:
    with pytest.raises(KeyFormatError) as info:
        parse_secret_key(bad)
    if bad:
        assert bad not in str(info.value)


@pytest.mark.parametrize("bad", ["", "npub1qqqq", "00" * 32, "xyz", nip19.nsec(SECKEY)])
def test_parse_public_key_rejects(bad: str) -> None:
    with pytest.raises(KeyFormatError):
        parse_public_key(bad)


# --- interop ------------------------------------------------------------------------------


def test_engram_event_verifies_in_nostr_sdk() -> None:
    nostr_sdk = pytest.importorskip("nostr_sdk")
    ours = sign_event(SECKEY, 1_700_000_000, 30174, [["d", "ab" * 32], ["p", PUBKEY]], NASTY, AUX)
    theirs = nostr_sdk.Event.from_json(msgspec.json.encode(ours).decode())
    assert theirs.id().to_hex() == ours.id
    assert theirs.verify()
    tampered = msgspec.structs.replace(ours, content="other")
    assert not nostr_sdk.Event.from_json(msgspec.json.encode(tampered).decode()).verify_id()


def test_nostr_sdk_event_verifies_in_engram() -> None:
    nostr_sdk = pytest.importorskip("nostr_sdk")
    keys = nostr_sdk.Keys.parse("00" * 31 + "03")
    builder = (
        nostr_sdk.EventBuilder(nostr_sdk.Kind(1), NASTY)
        .tags([nostr_sdk.Tag.parse(["p", PUBKEY])])
        .custom_created_at(nostr_sdk.Timestamp.from_secs(1_700_000_000))
    )
    signed = builder.finalize(keys)
    event = msgspec.json.decode(signed.as_json(), type=Event)
    assert event.pubkey == pubkey_of(bytes.fromhex("00" * 31 + "03"))
    assert verify_event(event)


def test_engram_event_verifies_in_pynostr() -> None:
    pynostr_event = pytest.importorskip("pynostr.event")
    ours = sign_event(SECKEY, 1_700_000_000, 1, [["t", "x"]], NASTY, AUX)
    theirs = pynostr_event.Event.from_dict(msgspec.to_builtins(ours))  # recomputes the id
    assert theirs.id == ours.id
    assert theirs.verify()


def test_pynostr_event_verifies_in_engram() -> None:
    pynostr_event = pytest.importorskip("pynostr.event")
    theirs = pynostr_event.Event(
        content=NASTY, kind=1, tags=[["t", "x"]], created_at=1_700_000_000, pubkey=PUBKEY
    )
    theirs.sign(SECKEY.hex())
    event = msgspec.convert(theirs.to_dict(), Event)
    assert event.id == theirs.id
    assert verify_event(event)
