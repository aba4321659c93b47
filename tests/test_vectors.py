"""Every published test vector: NIP-44 v2, NIP-AE (engrams), NIP-OA, and BIP-340 vector 0.

Vectors are read from tests/vectors/ (copies of the upstream files), never from elsewhere.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from ae_vectors import ae_events
from coincurve import PrivateKey

from engram import (
    body_text,
    build_event,
    conversation_key,
    core_profile,
    d_tag,
    encode_body,
    heads_by_slug,
    listing,
    lookup_head,
    nip44,
    nipoa,
    parse_body,
    reachability,
    validate_and_decrypt,
    validate_engram_envelope,
)
from engram.errors import (
    AttestationFormatError,
    AttestationSignatureError,
    ConditionsError,
    InvalidBase64Error,
    InvalidMacError,
    InvalidPaddingError,
    InvalidPayloadLengthError,
    InvalidPublicKeyError,
    InvalidSecretKeyError,
    PlaintextLengthError,
    SelfAttestationError,
    UnknownVersionError,
)
from engram.nip01 import Event, pubkey_of, sign_event, signature_valid, verify_event

VECTORS = Path(__file__).parent / "vectors"


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


NIP44 = load("nip44.vectors.json")["v2"]
AE = load("nip-ae.vectors.json")
OA = load("nip-oa.vectors.json")


def h(s: str) -> bytes:
    return bytes.fromhex(s)


# --- NIP-44 v2: valid ---------------------------------------------------------------------


@pytest.mark.parametrize("case", NIP44["valid"]["get_conversation_key"])
def test_nip44_conversation_key(case: dict[str, str]) -> None:
    assert conversation_key(h(case["sec1"]), case["pub2"]).hex() == case["conversation_key"]


@pytest.mark.parametrize("case", NIP44["valid"]["get_message_keys"]["keys"])
def test_nip44_message_keys(case: dict[str, str]) -> None:
    k_c = h(NIP44["valid"]["get_message_keys"]["conversation_key"])
    chacha_key, chacha_nonce, hmac_key = nip44.message_keys(k_c, h(case["nonce"]))
    assert chacha_key.hex() == case["chacha_key"]
    assert chacha_nonce.hex() == case["chacha_nonce"]
    assert hmac_key.hex() == case["hmac_key"]


@pytest.mark.parametrize(("unpadded", "padded"), NIP44["valid"]["calc_padded_len"])
def test_nip44_calc_padded_len(unpadded: int, padded: int) -> None:
    assert nip44.calc_padded_len(unpadded) == padded


@pytest.mark.parametrize("case", NIP44["valid"]["encrypt_decrypt"])
def test_nip44_encrypt_decrypt(case: dict[str, str]) -> None:
    sec1, sec2 = h(case["sec1"]), h(case["sec2"])
    k_c = conversation_key(sec1, pubkey_of(sec2))
    assert k_c.hex() == case["conversation_key"]
    assert conversation_key(sec2, pubkey_of(sec1)) == k_c  # symmetric
    payload = nip44.encrypt(case["plaintext"], k_c, h(case["nonce"]))
    assert payload == case["payload"]
    assert nip44.decrypt(case["payload"], k_c) == case["plaintext"]


@pytest.mark.parametrize("case", NIP44["valid"]["encrypt_decrypt_long_msg"])
def test_nip44_long_messages_by_checksum(case: dict[str, Any]) -> None:
    plaintext = case["pattern"] * case["repeat"]
    assert hashlib.sha256(plaintext.encode()).hexdigest() == case["plaintext_sha256"]
    k_c = h(case["conversation_key"])
    payload = nip44.encrypt(plaintext, k_c, h(case["nonce"]))
    assert hashlib.sha256(payload.encode()).hexdigest() == case["payload_sha256"]
    assert nip44.decrypt(payload, k_c) == plaintext


# --- NIP-44 v2: invalid (each category raises its own error type) -------------------------


@pytest.mark.parametrize("length", NIP44["invalid"]["encrypt_msg_lengths"])
def test_nip44_encrypt_rejects_message_length(length: int) -> None:
    with pytest.raises(PlaintextLengthError):
        nip44.encrypt("a" * length, bytes(32), bytes(32))


@pytest.mark.parametrize("case", NIP44["invalid"]["get_conversation_key"], ids=lambda c: c["note"])
def test_nip44_conversation_key_rejects(case: dict[str, str]) -> None:
    expected = InvalidSecretKeyError if case["note"].startswith("sec1") else InvalidPublicKeyError
    with pytest.raises(expected):
        conversation_key(h(case["sec1"]), case["pub2"])


DECRYPT_ERRORS = {
    "unknown encryption version": UnknownVersionError,
    "invalid base64": InvalidBase64Error,
    "invalid MAC": InvalidMacError,
    "invalid padding": InvalidPaddingError,
    "invalid payload length": InvalidPayloadLengthError,
}


def decrypt_error_for(note: str) -> type[Exception]:
    return next(err for prefix, err in DECRYPT_ERRORS.items() if note.startswith(prefix))


@pytest.mark.parametrize("case", NIP44["invalid"]["decrypt"], ids=lambda c: c["note"])
def test_nip44_decrypt_rejects(case: dict[str, str]) -> None:
    with pytest.raises(decrypt_error_for(case["note"])):
        nip44.decrypt(case["payload"], h(case["conversation_key"]))


def test_nip44_every_invalid_category_has_its_own_type() -> None:
    notes = {decrypt_error_for(c["note"]) for c in NIP44["invalid"]["decrypt"]}
    assert notes == set(DECRYPT_ERRORS.values())


# --- NIP-AE -------------------------------------------------------------------------------

SECKEY_A = h(AE["inputs"]["seckey_a"])
SECKEY_O = h(AE["inputs"]["seckey_o"])
AUX = h(AE["inputs"]["schnorr_aux"])
PUBKEY_A = AE["derived"]["pubkey_a"]
PUBKEY_O = AE["derived"]["pubkey_o"]
K_C = h(AE["derived"]["K_c"])


def test_ae_keys_and_conversation_key() -> None:
    assert pubkey_of(SECKEY_A) == PUBKEY_A
    assert pubkey_of(SECKEY_O) == PUBKEY_O
    assert conversation_key(SECKEY_A, PUBKEY_O) == K_C
    assert conversation_key(SECKEY_O, PUBKEY_A) == K_C  # the owner derives the same key
    assert bytes(32) == AUX


@pytest.mark.parametrize(("slug", "d"), AE["derived"]["d"].items())
def test_ae_d_tags(slug: str, d: str) -> None:
    assert AE["derived"]["d_tag_domain"] == "agent-memory/v1/d-tag"
    assert d_tag(K_C, slug) == d


@pytest.mark.parametrize("body_ref", sorted(AE["inputs"]["bodies"]))
def test_ae_body_encoding_is_byte_exact(body_ref: str) -> None:
    raw = AE["inputs"]["bodies"][body_ref]
    assert encode_body(parse_body(raw)) == raw.encode()


@pytest.mark.parametrize("case", AE["events"], ids=lambda c: c["name"])
def test_ae_event(case: dict[str, Any]) -> None:
    body = parse_body(AE["inputs"]["bodies"][case["body_ref"]])
    assert body.slug == case["slug"]
    event = build_event(SECKEY_A, PUBKEY_O, body, case["created_at"], h(case["nip44_nonce"]), AUX)
    assert event.kind == case["kind"]
    assert event.pubkey == case["pubkey"]
    assert event.tags == case["tags"]
    assert event.created_at == case["created_at"]
    assert event.content == case["content"]
    assert len(event.content) == case["content_len"]
    assert hashlib.sha256(event.content.encode()).hexdigest() == case["content_sha256"]
    assert event.id == case["id"]
    assert event.sig == case["sig"]
    assert verify_event(event)
    assert validate_engram_envelope(event) is None
    assert validate_and_decrypt(event, PUBKEY_A, PUBKEY_O, K_C) == body


vector_events = ae_events


@pytest.mark.parametrize("order", [1, -1], ids=["in-order", "reversed"])
def test_ae_expected_state_after_all_events(order: int) -> None:
    expected = AE["expected_state_after_all_events"]
    heads = heads_by_slug(vector_events()[::order], PUBKEY_A, PUBKEY_O, K_C)
    entries = [
        {"slug": e.slug, "event_id": e.event_id, "created_at": e.created_at} for e in listing(heads)
    ]
    assert entries == expected["listing"]
    assert core_profile(heads) == expected["core_profile"]
    # mem/example's head is the tombstone (event 3): it reads as absent.
    example = lookup_head(vector_events(), PUBKEY_A, PUBKEY_O, K_C, "mem/example")
    assert example.head is not None and example.head.event.id == AE["events"][2]["id"]
    assert body_text(example.head.body) is None
    assert (example.candidates, example.rejected) == (2, 0)
    # ...so core's reference to it dangles, from core and from the note.
    graph = reachability(
        core_profile(heads), {slug: body_text(head.body) for slug, head in heads.items()}
    )
    assert graph.reachable == ["mem/notes/2026-05-12"]
    assert graph.orphans == []
    assert graph.dangling == [("core", "mem/example"), ("mem/notes/2026-05-12", "mem/example")]


# --- BIP-340 test vector 0 ----------------------------------------------------------------

BIP340_V0_PUBKEY = "f9308a019258c31049344f85f89d5229b531c845836f99b08601f113bce036f9"
BIP340_V0_SIG = (
    "e907831f80848d1069a5371b402410364bdf1c5f8307b0084c55f1ce2dca8215"
    "25f66a4a85ea8b71e482a74f382d2ce5ebeee8fdb2172f477df4900d310536c0"
)


def test_bip340_vector_0() -> None:
    seckey = (3).to_bytes(32, "big")
    assert pubkey_of(seckey) == BIP340_V0_PUBKEY
    sig = PrivateKey(seckey).sign_schnorr(bytes(32), bytes(32)).hex()
    assert sig.startswith("e907831f80")
    assert sig == BIP340_V0_SIG
    # The same signature verifies through engram.nip01 (message = the "id").
    fake = Event(
        id="00" * 32,
        pubkey=BIP340_V0_PUBKEY,
        created_at=0,
        kind=1,
        tags=[],
        content="",
        sig=BIP340_V0_SIG,
    )
    assert signature_valid(fake)
    flipped = msgspec.structs.replace(fake, sig="f" + BIP340_V0_SIG[1:])
    assert not signature_valid(flipped)


# --- NIP-OA -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", OA["valid"])
def test_oa_valid(case: dict[str, Any]) -> None:
    owner_seckey, agent_seckey = h(case["owner_seckey"]), h(case["agent_seckey"])
    assert pubkey_of(owner_seckey) == case["owner_pubkey"]
    assert pubkey_of(agent_seckey) == case["agent_pubkey"]
    preimage = nipoa.attestation_preimage(case["agent_pubkey"], case["conditions"])
    assert preimage == case["preimage"].encode()
    digest = nipoa.attestation_digest(case["agent_pubkey"], case["conditions"])
    assert digest.hex() == case["sha256_preimage"]
    att = nipoa.verify_auth_tag(case["tag"], case["agent_pubkey"])
    assert (att.owner, att.conditions, att.sig) == (
        case["owner_pubkey"],
        case["conditions"],
        case["sig"],
    )
    assert case["tag"] == ["auth", case["owner_pubkey"], case["conditions"], case["sig"]]
    # Our signer produces a tag that verifies (aux differs from the vector's, so the
    # signature bytes may differ; BIP-340 signatures are randomized).
    ours = nipoa.sign_attestation(owner_seckey, case["agent_pubkey"], case["conditions"], AUX)
    assert nipoa.verify_auth_tag(ours, case["agent_pubkey"]).owner == case["owner_pubkey"]


@pytest.mark.parametrize("conditions", OA["valid_conditions"])
def test_oa_valid_conditions(conditions: str) -> None:
    nipoa.parse_conditions(conditions)  # does not raise


@pytest.mark.parametrize("conditions", OA["invalid_conditions"])
def test_oa_invalid_conditions(conditions: str) -> None:
    with pytest.raises(ConditionsError):
        nipoa.parse_conditions(conditions)
    case = OA["valid"][0]
    owner_seckey = h(case["owner_seckey"])
    with pytest.raises(ConditionsError):
        nipoa.sign_attestation(owner_seckey, case["agent_pubkey"], conditions, AUX)
    with pytest.raises(ConditionsError):
        nipoa.verify_auth_tag(
            ["auth", case["owner_pubkey"], conditions, case["sig"]], case["agent_pubkey"]
        )


def _oa_event(tags: list[list[str]], *, kind: int = 1, created_at: int = 1713956400) -> Event:
    agent_seckey = h(OA["valid"][0]["agent_seckey"])
    return sign_event(agent_seckey, created_at, kind, tags, "owner-attested agent event", AUX)


def test_oa_invalid_tags_note() -> None:
    """Each case of `invalid_tags_note`, next to the valid control."""
    case = OA["valid"][0]
    tag = case["tag"]
    assert nipoa.event_attestation(_oa_event([tag])) is not None  # positive control
    assert nipoa.event_attestation(_oa_event([])) is None  # no tag: no claim, no error
    # two auth tags: no valid attestation
    with pytest.raises(AttestationFormatError):
        nipoa.event_attestation(_oa_event([tag, tag]))
    # element count not 4
    for bad in (tag[:3], [*tag, "extra"]):
        with pytest.raises(AttestationFormatError):
            nipoa.verify_auth_tag(bad, case["agent_pubkey"])
    # owner == agent (self-attestation)
    with pytest.raises(SelfAttestationError):
        nipoa.verify_auth_tag(tag, case["owner_pubkey"])
    # upper-case hex (owner or signature)
    for bad in (
        ["auth", tag[1].upper(), tag[2], tag[3]],
        ["auth", tag[1], tag[2], tag[3].upper()],
    ):
        with pytest.raises(AttestationFormatError):
            nipoa.verify_auth_tag(bad, case["agent_pubkey"])
    # a signature that does not verify (right shape, wrong agent / altered conditions)
    with pytest.raises(AttestationSignatureError):
        nipoa.verify_auth_tag(tag, "ab" * 32)
    with pytest.raises(AttestationSignatureError):
        nipoa.verify_auth_tag(["auth", tag[1], "kind=1", tag[3]], case["agent_pubkey"])
    # a well-formed tag on an event whose own signature is invalid
    event = _oa_event([tag])
    forged = msgspec.structs.replace(event, content=event.content + "!")
    with pytest.raises(AttestationSignatureError):
        nipoa.event_attestation(forged)
