"""NIP-44 v2: conversation key, padding, encryption and decryption.

Pure: the 32-byte nonce is an argument (callers pass `os.urandom(32)`; tests pin it).
Checks run in the order of the NIP-44 reference, cheapest first, and each failure raises
its own `Nip44Error` subclass (see `engram.errors`).
"""

from __future__ import annotations

import base64
import binascii
import hmac

from coincurve import PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from engram.errors import (
    InvalidBase64Error,
    InvalidConversationKeyError,
    InvalidMacError,
    InvalidNonceError,
    InvalidPaddingError,
    InvalidPayloadLengthError,
    InvalidPlaintextError,
    InvalidPublicKeyError,
    InvalidSecretKeyError,
    PlaintextLengthError,
    UnknownVersionError,
)
from engram.nip01 import is_hex

VERSION = 2
SALT = b"nip44-v2"
PLAINTEXT_MIN = 1
PLAINTEXT_MAX = 65_535  # NIP44_PLAINTEXT_MAX: the u16 length prefix
PAYLOAD_MIN_CHARS = 132
PAYLOAD_MAX_CHARS = 87_472
DATA_MIN_BYTES = 99  # version 1 + nonce 32 + padded 32 + length prefix 2 + mac 32
DATA_MAX_BYTES = 65_603
_CURVE_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def conversation_key(seckey: bytes, pubkey_hex: str) -> bytes:
    """HKDF-extract(salt="nip44-v2", IKM = raw x of seckey·P); symmetric in the two parties.

    Not `PrivateKey.ecdh()`: libsecp256k1's default ECDH hashes the point, which gives
    the wrong key.
    """
    if len(seckey) != 32 or not 0 < int.from_bytes(seckey, "big") < _CURVE_N:
        raise InvalidSecretKeyError("secret key must be a 32-byte scalar in [1, n-1]")
    if not is_hex(pubkey_hex, 64):
        raise InvalidPublicKeyError("public key must be 64 lower-case hex characters")
    try:
        point = PublicKey(b"\x02" + bytes.fromhex(pubkey_hex))
    except ValueError as exc:
        raise InvalidPublicKeyError(f"public key is not on secp256k1: {pubkey_hex}") from exc
    shared_x = point.multiply(seckey).format(compressed=True)[1:]
    return hmac.digest(SALT, shared_x, "sha256")


def message_keys(conversation_key: bytes, nonce: bytes) -> tuple[bytes, bytes, bytes]:
    """HKDF-expand(PRK=K_c, info=nonce, L=76) -> (chacha key, chacha nonce, hmac key)."""
    if len(conversation_key) != 32:
        raise InvalidConversationKeyError("conversation key must be 32 bytes")
    if len(nonce) != 32:
        raise InvalidNonceError("nonce must be 32 bytes")
    # RFC 5869 expand, three SHA-256 blocks: cheaper inline than building an HKDFExpand.
    t1 = hmac.digest(conversation_key, nonce + b"\x01", "sha256")
    t2 = hmac.digest(conversation_key, t1 + nonce + b"\x02", "sha256")
    t3 = hmac.digest(conversation_key, t2 + nonce + b"\x03", "sha256")
    okm = t1 + t2 + t3
    return okm[:32], okm[32:44], okm[44:76]


def calc_padded_len(unpadded_len: int) -> int:
    """Padded size for a plaintext of `unpadded_len` bytes (min 32, then power-of-two chunks)."""
    if unpadded_len <= 32:
        return 32
    next_power = 1 << (unpadded_len - 1).bit_length()
    chunk = 32 if next_power <= 256 else next_power // 8
    return chunk * ((unpadded_len - 1) // chunk + 1)


def _chacha20(key: bytes, nonce12: bytes, data: bytes) -> bytes:
    # `cryptography` takes the 16-byte IETF form: 4-byte little-endian counter (0) + nonce.
    cipher = Cipher(algorithms.ChaCha20(key, b"\x00\x00\x00\x00" + nonce12), mode=None)
    return cipher.encryptor().update(data)


def _pad(plaintext: bytes) -> bytes:
    n = len(plaintext)
    return n.to_bytes(2, "big") + plaintext + bytes(calc_padded_len(n) - n)


def encrypt(plaintext: str, conversation_key: bytes, nonce: bytes) -> str:
    """Encrypt UTF-8 `plaintext` (1..65,535 bytes) to a base64 NIP-44 v2 payload."""
    try:
        raw = plaintext.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidPlaintextError("plaintext is not encodable as UTF-8") from exc
    if not PLAINTEXT_MIN <= len(raw) <= PLAINTEXT_MAX:
        raise PlaintextLengthError(
            f"plaintext must be {PLAINTEXT_MIN}..{PLAINTEXT_MAX} bytes, got {len(raw)}"
        )
    chacha_key, chacha_nonce, hmac_key = message_keys(conversation_key, nonce)
    ciphertext = _chacha20(chacha_key, chacha_nonce, _pad(raw))
    mac = hmac.digest(hmac_key, nonce + ciphertext, "sha256")
    return base64.b64encode(b"\x02" + nonce + ciphertext + mac).decode("ascii")


def decode_payload(payload: str) -> tuple[bytes, bytes, bytes]:
    """Split a payload into (nonce, ciphertext, mac) after the length/base64/version checks."""
    plen = len(payload)
    if plen and payload[0] == "#":
        raise UnknownVersionError("unknown encryption version (payload starts with '#')")
    if not PAYLOAD_MIN_CHARS <= plen <= PAYLOAD_MAX_CHARS:
        raise InvalidPayloadLengthError(
            f"invalid payload length: {plen} (must be {PAYLOAD_MIN_CHARS}..{PAYLOAD_MAX_CHARS})"
        )
    # Padded standard base64 only. strict_mode rejects foreign characters and misplaced
    # '=', but still accepts a surplus "====" quantum, hence the explicit count.
    if plen % 4 or plen - len(payload.rstrip("=")) > 2:
        raise InvalidBase64Error("invalid base64 (length or padding)")
    try:
        data = binascii.a2b_base64(payload, strict_mode=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: non-ASCII characters
        raise InvalidBase64Error("invalid base64") from exc
    dlen = len(data)
    if not DATA_MIN_BYTES <= dlen <= DATA_MAX_BYTES:
        raise InvalidPayloadLengthError(
            f"invalid data length: {dlen} (must be {DATA_MIN_BYTES}..{DATA_MAX_BYTES})"
        )
    if data[0] != VERSION:
        raise UnknownVersionError(f"unknown encryption version {data[0]}")
    return data[1:33], data[33:-32], data[-32:]


def decrypt(payload: str, conversation_key: bytes) -> str:
    """Authenticate (constant-time MAC over nonce||ciphertext), then decrypt and unpad."""
    nonce, ciphertext, mac = decode_payload(payload)
    chacha_key, chacha_nonce, hmac_key = message_keys(conversation_key, nonce)
    expected = hmac.digest(hmac_key, nonce + ciphertext, "sha256")
    if not hmac.compare_digest(expected, mac):
        raise InvalidMacError("invalid MAC")
    padded = _chacha20(chacha_key, chacha_nonce, ciphertext)
    unpadded_len = int.from_bytes(padded[:2], "big")
    # As the NIP-44 reference: the padding bytes themselves are not inspected (they are
    # MAC-authenticated), so every conforming reader accepts the same payloads.
    if unpadded_len < PLAINTEXT_MIN or len(padded) != 2 + calc_padded_len(unpadded_len):
        raise InvalidPaddingError("invalid padding")
    try:
        return padded[2 : 2 + unpadded_len].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidPlaintextError("decrypted plaintext is not valid UTF-8") from exc
