"""NIP-44 v2 beyond the vectors: round trips (hypothesis), argument checks, tampering, and
interop with nostr-sdk's independent (Rust) implementation in both directions."""

from __future__ import annotations

import base64
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import nip44
from engram.errors import (
    InvalidBase64Error,
    InvalidConversationKeyError,
    InvalidMacError,
    InvalidNonceError,
    InvalidPayloadLengthError,
    InvalidPlaintextError,
    InvalidPublicKeyError,
    InvalidSecretKeyError,
    Nip44Error,
    PlaintextLengthError,
    UnknownVersionError,
)
from engram.nip01 import pubkey_of

SEC_A = bytes.fromhex("00" * 31 + "01")
SEC_O = bytes.fromhex("00" * 31 + "02")
K_C = nip44.conversation_key(SEC_A, pubkey_of(SEC_O))
NONCE = bytes(range(32))


def utf8_len(s: str) -> int:
    return len(s.encode("utf-8"))


# Short texts of any code points, plus long runs up to the limit (hypothesis rarely
# generates long strings by itself).
TEXTS = st.one_of(
    st.text(min_size=1, max_size=200),
    st.builds(
        lambda ch, n: (ch * n)[: 65_535 // utf8_len(ch)],
        st.characters(exclude_categories=("Cs",)),
        st.integers(1, 65_535),
    ),
).filter(lambda s: 1 <= utf8_len(s) <= 65_535)


@settings(max_examples=150, deadline=None)
@given(plaintext=TEXTS, nonce=st.binary(min_size=32, max_size=32))
def test_round_trip(plaintext: str, nonce: bytes) -> None:
    payload = nip44.encrypt(plaintext, K_C, nonce)
    assert nip44.decrypt(payload, K_C) == plaintext
    padded = nip44.calc_padded_len(utf8_len(plaintext))
    assert len(base64.b64decode(payload)) == 1 + 32 + 2 + padded + 32


def test_round_trip_at_both_limits() -> None:
    for text in ("a", "a" * 65_535, "😀" * (65_535 // 4)):
        assert nip44.decrypt(nip44.encrypt(text, K_C, NONCE), K_C) == text


@pytest.mark.parametrize(
    ("text", "error"),
    [("", PlaintextLengthError), ("a" * 65_536, PlaintextLengthError), ("\ud800", Nip44Error)],
)
def test_encrypt_rejects_plaintext(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        nip44.encrypt(text, K_C, NONCE)


def test_argument_lengths() -> None:
    with pytest.raises(InvalidNonceError):
        nip44.encrypt("a", K_C, bytes(31))
    with pytest.raises(InvalidConversationKeyError):
        nip44.encrypt("a", bytes(16), NONCE)
    with pytest.raises(InvalidSecretKeyError):
        nip44.conversation_key(bytes(31) + b"\x01" + b"\x00", pubkey_of(SEC_O))
    with pytest.raises(InvalidPublicKeyError):
        nip44.conversation_key(SEC_A, pubkey_of(SEC_O).upper())
    with pytest.raises(InvalidPublicKeyError):
        nip44.conversation_key(SEC_A, "02" + pubkey_of(SEC_O))


def test_off_curve_public_key_with_positive_control() -> None:
    on_curve, off_curve = "00" * 31 + "01", "00" * 31 + "05"  # x=1 lifts, x=5 does not
    assert len(nip44.conversation_key(SEC_A, on_curve)) == 32
    with pytest.raises(InvalidPublicKeyError, match=off_curve):
        nip44.conversation_key(SEC_A, off_curve)


def test_tampering_is_detected_by_the_mac() -> None:
    data = bytearray(base64.b64decode(nip44.encrypt("hello", K_C, NONCE)))
    for index in (1, 40, len(data) - 1):  # nonce, ciphertext, mac
        tampered = bytearray(data)
        tampered[index] ^= 1
        with pytest.raises(InvalidMacError):
            nip44.decrypt(base64.b64encode(tampered).decode(), K_C)
    with pytest.raises(InvalidMacError):
        nip44.decrypt(base64.b64encode(data).decode(), bytes(32))  # wrong key


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ("#" + "A" * 131, UnknownVersionError),
        ("Aw" + "A" * 130, UnknownVersionError),  # version byte 3
        ("A" * 131, InvalidPayloadLengthError),
        ("A" * 87_476, InvalidPayloadLengthError),
        ("Ag" + "A" * 129 + "!", InvalidBase64Error),
        ("Ag" + "A" * 129 + " ", InvalidBase64Error),
        ("Ag" + "A" * 128 + "=A", InvalidBase64Error),
        ("Ag" + "A" * 126 + "====", InvalidBase64Error),
    ],
)
def test_decrypt_rejects_malformed(payload: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        nip44.decrypt(payload, K_C)


def test_decrypt_rejects_short_decoded_data() -> None:
    payload = base64.b64encode(b"\x02" + bytes(97)).decode()  # 98 bytes in 132 chars
    assert len(payload) == 132
    with pytest.raises(InvalidPayloadLengthError):
        nip44.decrypt(payload, K_C)


def test_decrypt_rejects_non_utf8_plaintext() -> None:
    # Forge a correctly MAC'd payload whose plaintext is not UTF-8.
    chacha_key, chacha_nonce, hmac_key = nip44.message_keys(K_C, NONCE)
    padded = (1).to_bytes(2, "big") + b"\xff" + bytes(31)
    ciphertext = nip44._chacha20(chacha_key, chacha_nonce, padded)
    mac = hmac.digest(hmac_key, NONCE + ciphertext, "sha256")
    payload = base64.b64encode(b"\x02" + NONCE + ciphertext + mac).decode()
    with pytest.raises(InvalidPlaintextError):
        nip44.decrypt(payload, K_C)


def test_every_error_is_a_value_error() -> None:
    assert issubclass(Nip44Error, ValueError)


# --- interop with nostr-sdk ---------------------------------------------------------------


def test_nostr_sdk_decrypts_ours_and_we_decrypt_theirs() -> None:
    ns = pytest.importorskip("nostr_sdk")
    agent = ns.SecretKey.parse(SEC_A.hex())
    owner = ns.SecretKey.parse(SEC_O.hex())
    text = "interop é 😀 " * 50
    ours = nip44.encrypt(text, K_C, NONCE)
    assert ns.nip44_decrypt(owner, ns.PublicKey.parse(pubkey_of(SEC_A)), ours) == text
    theirs = ns.nip44_encrypt(agent, ns.PublicKey.parse(pubkey_of(SEC_O)), text, ns.Nip44Version.V2)
    assert nip44.decrypt(theirs, K_C) == text
