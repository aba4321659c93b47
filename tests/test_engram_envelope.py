"""Envelopes: build_event, the five validity rules in order (spec: *Validity of one event*),
and the relay-side ingest check (spec: *Relay-side rules*)."""

from __future__ import annotations

import json

import msgspec
import pytest

from engram import (
    KIND_ENGRAM,
    BodyShapeError,
    BodyTooLargeError,
    Core,
    DecryptError,
    EnvelopeError,
    Event,
    InvalidEngramError,
    InvalidSlugError,
    Memory,
    SignatureError,
    SlugMismatchError,
    Tombstone,
    build_event,
    conversation_key,
    d_tag,
    envelope,
    nip44,
    validate_and_decrypt,
    validate_engram_envelope,
)
from engram.nip01 import pubkey_of, sign_event

SEC_A = bytes.fromhex("00" * 31 + "01")
SEC_O = bytes.fromhex("00" * 31 + "02")
SEC_X = bytes.fromhex("00" * 31 + "03")
AGENT, OWNER, OTHER = pubkey_of(SEC_A), pubkey_of(SEC_O), pubkey_of(SEC_X)
K_C = conversation_key(SEC_A, OWNER)
NONCE = bytes(range(32))
AUX = bytes(32)
BODY = Memory(slug="mem/example", value="hello")
D = d_tag(K_C, "mem/example")


def engram(
    plaintext: str = '{"slug":"mem/example","value":"hello"}',
    *,
    tags: list[list[str]] | None = None,
    kind: int = KIND_ENGRAM,
    seckey: bytes = SEC_A,
    key: bytes = K_C,
    content: str | None = None,
) -> Event:
    """A signed event with arbitrary plaintext, tags and kind (for rule-by-rule tests)."""
    if content is None:
        content = nip44.encrypt(plaintext, key, NONCE)
    tags = [["d", D], ["p", OWNER]] if tags is None else tags
    return sign_event(seckey, 1_700_000_000, kind, tags, content, AUX)


def rule_of(event: Event) -> int:
    try:
        validate_and_decrypt(event, AGENT, OWNER, K_C)
    except InvalidEngramError as exc:
        return exc.rule
    return 0


# --- build_event -------------------------------------------------------------------------


def test_build_event_shape() -> None:
    event = build_event(SEC_A, OWNER, BODY, 1_700_000_000, NONCE, AUX)
    assert event.kind == 30174 and event.pubkey == AGENT
    assert event.tags == [["d", D], ["p", OWNER]]
    assert "example" not in json.dumps(event.tags)  # the slug never appears in a tag
    assert validate_and_decrypt(event, AGENT, OWNER, K_C) == BODY
    # the owner side derives the same key and reads the same body
    assert validate_and_decrypt(event, AGENT, OWNER, conversation_key(SEC_O, AGENT)) == BODY


@pytest.mark.parametrize("body", [Tombstone(slug="mem/example"), Core(profile="me")])
def test_build_event_other_bodies(body: Tombstone | Core) -> None:
    event = build_event(SEC_A, OWNER, body, 5, NONCE, AUX)
    assert validate_and_decrypt(event, AGENT, OWNER, K_C) == body


def test_build_event_refuses_oversized_body_before_encrypting(monkeypatch) -> None:
    def no_encrypt(*args: object) -> str:
        raise AssertionError("encrypt must not be called for an oversized body")

    monkeypatch.setattr(nip44, "encrypt", no_encrypt)
    huge = Memory(slug="mem/example", value="a" * 65_535)
    with pytest.raises(BodyTooLargeError):
        build_event(SEC_A, OWNER, huge, 1, NONCE, AUX)


def test_build_event_refuses_invalid_slug_and_keys() -> None:
    with pytest.raises(InvalidSlugError):
        build_event(SEC_A, OWNER, Memory(slug="mem/Bad", value="v"), 1, NONCE, AUX)
    with pytest.raises(nip44.InvalidPublicKeyError):
        build_event(SEC_A, "00" * 31 + "05", BODY, 1, NONCE, AUX)


# --- validate_and_decrypt: one error type per rule ---------------------------------------


def test_positive_control() -> None:
    assert rule_of(engram()) == 0


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (engram(kind=1), "wrong kind"),
        (engram(kind=30175), "neighbouring kind"),
        (engram(seckey=SEC_X), "another author"),
        (engram(tags=[["p", OWNER]]), "missing d"),
        (engram(tags=[["d", D], ["d", D], ["p", OWNER]]), "two d tags"),
        (engram(tags=[["d", D]]), "missing p"),
        (engram(tags=[["d", D], ["p", OWNER], ["p", OWNER]]), "two p tags"),
        (engram(tags=[["d", D], ["p", OTHER]]), "p names someone else"),
        (engram(tags=[["d", D.upper()], ["p", OWNER]]), "upper-case d"),
        (engram(tags=[["d", D], ["p", OWNER.upper()]]), "upper-case p"),
        (engram(tags=[["d"], ["p", OWNER]]), "d without a value"),
        (engram(tags=[["d", D[:-1]], ["p", OWNER]]), "short d"),
    ],
)
def test_rule_1_envelope(event: Event, why: str) -> None:
    with pytest.raises(EnvelopeError):
        validate_and_decrypt(event, AGENT, OWNER, K_C)


def test_rule_1_allows_alt_and_extra_tags() -> None:
    tags = [["alt", "encrypted agent memory record"], ["d", D], ["p", OWNER], ["t", "x"], []]
    assert rule_of(engram(tags=tags)) == 0


def test_rule_2_signature() -> None:
    good = engram()
    assert rule_of(msgspec.structs.replace(good, content=engram("{}").content)) == 2
    assert rule_of(msgspec.structs.replace(good, sig=engram(kind=KIND_ENGRAM).sig[::-1])) == 2
    assert rule_of(msgspec.structs.replace(good, created_at=good.created_at + 1)) == 2
    assert rule_of(msgspec.structs.replace(good, id="00" * 32)) == 2


def test_rule_2_runs_before_decryption(monkeypatch) -> None:
    forged = msgspec.structs.replace(engram(), content="not even base64")
    calls: list[str] = []
    monkeypatch.setattr(nip44, "decrypt", lambda *a: calls.append("decrypt") or "")
    with pytest.raises(SignatureError):
        validate_and_decrypt(forged, AGENT, OWNER, K_C)
    assert calls == []


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (engram(key=bytes(32)), "encrypted under another key"),
        (engram(content="Ag" + "A" * 130), "well-formed but wrong MAC"),
        (engram(content="hello"), "not a NIP-44 payload"),
        (engram("not json"), "not JSON"),
        (engram('["slug","mem/example"]'), "array"),
        (engram('{"slug":"mem/example","value":"a","value":"b"}'), "duplicate member"),
        (engram('{"slug":"mem/example","value":"a","x":{"k":1,"k":2}}'), "nested duplicate"),
        (engram('{"slug":"mem/example","value":"a","n":NaN}'), "NaN"),
        (engram('{"slug":"mem/example","value":"\\ud800"}'), "lone surrogate"),
        (engram('{"slug":"mem/example","value":"a"} x'), "trailing data"),
    ],
)
def test_rule_3_decrypt_and_parse(event: Event, why: str) -> None:
    with pytest.raises(DecryptError):
        validate_and_decrypt(event, AGENT, OWNER, K_C)


@pytest.mark.parametrize(
    ("plaintext", "why"),
    [
        ('{"value":"a"}', "no slug"),
        ('{"slug":7,"value":"a"}', "slug not a string"),
        ('{"slug":"mem/Example","value":"a"}', "invalid slug"),
        ('{"slug":"mem/other","value":"a"}', "valid slug, other d"),
        ('{"slug":"core","profile":"a"}', "core under mem/example's d"),
    ],
)
def test_rule_4_slug(plaintext: str, why: str) -> None:
    with pytest.raises(SlugMismatchError):
        validate_and_decrypt(engram(plaintext), AGENT, OWNER, K_C)


@pytest.mark.parametrize(
    ("slug", "plaintext"),
    [
        ("mem/example", '{"slug":"mem/example"}'),
        ("mem/example", '{"slug":"mem/example","value":1}'),
        ("mem/example", '{"slug":"mem/example","profile":"a"}'),
        ("core", '{"slug":"core","value":"a"}'),
        ("core", '{"slug":"core","profile":null}'),
        ("core", '{"slug":"core","profile":["a"]}'),
    ],
)
def test_rule_5_shape(slug: str, plaintext: str) -> None:
    event = engram(plaintext, tags=[["d", d_tag(K_C, slug)], ["p", OWNER]])
    with pytest.raises(BodyShapeError):
        validate_and_decrypt(event, AGENT, OWNER, K_C)


def test_rules_are_checked_in_order() -> None:
    # Breaks rules 1 and 2 (and 3): rule 1 is reported.
    both = msgspec.structs.replace(engram(kind=1), sig="00" * 64)
    assert rule_of(both) == 1
    # Breaks rules 2 and 3: rule 2 is reported.
    assert rule_of(msgspec.structs.replace(engram(key=bytes(32)), sig="00" * 64)) == 2
    # Breaks rules 4 and 5: rule 4 is reported.
    assert rule_of(engram('{"slug":"mem/other","value":1}')) == 4


def test_errors_do_not_leak_plaintext() -> None:
    secret = "my-secret-value"
    event = engram(f'{{"slug":"mem/example","value":"{secret}","value":"x"}}')
    with pytest.raises(DecryptError) as info:
        validate_and_decrypt(event, AGENT, OWNER, K_C)
    assert secret not in str(info.value) and info.value.__cause__ is None
    event = engram('{"slug":"mem/secret-name","value":"x"}')
    with pytest.raises(SlugMismatchError) as info:
        validate_and_decrypt(event, AGENT, OWNER, K_C)
    assert "secret-name" not in str(info.value)


# --- relay side ---------------------------------------------------------------------------

VALID_MIN = "Ag" + "A" * 130


def relay_event(content: str = VALID_MIN, tags: list[list[str]] | None = None) -> Event:
    """Unsigned-looking event: the relay check looks at kind, tags and content only."""
    return Event(
        id="00" * 32,
        pubkey=AGENT,
        created_at=1,
        kind=KIND_ENGRAM,
        tags=[["d", D], ["p", OWNER]] if tags is None else tags,
        content=content,
        sig="00" * 64,
    )


def test_relay_accepts_minimal_and_real_payloads() -> None:
    assert validate_engram_envelope(relay_event()) is None
    assert validate_engram_envelope(relay_event(VALID_MIN[:-2] + "==")) is not None  # 97 B
    real = build_event(SEC_A, OWNER, BODY, 1, NONCE, AUX)
    assert validate_engram_envelope(real) is None
    extra = [["alt", "encrypted agent memory record"], ["d", D], ["e", "x"], ["p", OWNER]]
    assert validate_engram_envelope(relay_event(tags=extra)) is None


def test_relay_ignores_other_kinds() -> None:
    other = msgspec.structs.replace(relay_event("x", tags=[]), kind=1)
    assert validate_engram_envelope(other) is None


REJECTS = {
    "short": relay_event("x"),
    "all zero version": relay_event("A" * 132),
    "too short decoded": relay_event("Ag=="),
    "not base64": relay_event("Ag!!" + "A" * 128),
    "empty": relay_event(""),
    "three pads": relay_event("Ag" + "A" * 127 + "==="),
    "two d tags": relay_event(tags=[["d", D], ["d", D], ["p", OWNER]]),
    "missing d": relay_event(tags=[["p", OWNER]]),
    "upper-case d": relay_event(tags=[["d", D.upper()], ["p", OWNER]]),
    "upper-case p": relay_event(tags=[["d", D], ["p", OWNER.upper()]]),
    "missing p": relay_event(tags=[["d", D]]),
    "two p tags": relay_event(tags=[["d", D], ["p", OWNER], ["p", OTHER]]),
    "d without value": relay_event(tags=[["d"], ["p", OWNER]]),
}


@pytest.mark.parametrize("name", REJECTS)
def test_relay_rejects(name: str) -> None:
    reason = validate_engram_envelope(REJECTS[name])
    assert reason is not None and reason.startswith("invalid: agent-engram ")


def test_relay_reasons_are_distinct_per_rule() -> None:
    named = ["short", "all zero version", "too short decoded", "not base64", "two d tags"]
    named += ["upper-case d", "missing p", "empty", "three pads", "missing d", "two p tags"]
    reasons = [validate_engram_envelope(REJECTS[name]) for name in named]
    assert len(set(reasons)) == len(reasons), reasons


def test_relay_check_agrees_with_nip44_on_the_version_byte() -> None:
    for prefix in ("Ag", "Ah", "Av"):  # first byte 0x02 whatever the low bits of char 2
        assert validate_engram_envelope(relay_event(prefix + "A" * 130)) is None
    for prefix in ("AQ", "Aw", "BA", "AA"):
        reason = validate_engram_envelope(relay_event(prefix + "A" * 130))
        assert reason is not None and "version" in reason


def test_relay_constants() -> None:
    assert envelope.KIND_ENGRAM == 30174
    assert envelope.REASON_PREFIX == "invalid: agent-engram "
