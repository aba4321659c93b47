"""NIP-OA beyond the vectors: clause semantics (strict bounds, kind), edge decimals, and
the event-level check. The vector cases themselves are in test_vectors.py."""

from __future__ import annotations

import pytest

from engram import nipoa
from engram.errors import (
    AttestationError,
    AttestationFormatError,
    AttestationSignatureError,
    ConditionsError,
    ConditionsNotMetError,
    SelfAttestationError,
)
from engram.nip01 import pubkey_of, sign_event

OWNER_SEC = bytes.fromhex("00" * 31 + "01")
AGENT_SEC = bytes.fromhex("00" * 31 + "02")
OWNER, AGENT = pubkey_of(OWNER_SEC), pubkey_of(AGENT_SEC)
AUX = bytes(32)


@pytest.mark.parametrize(
    ("conditions", "kind", "created_at", "allowed"),
    [
        ("", 7, 123, True),
        ("kind=1", 1, 0, True),
        ("kind=1", 2, 0, False),
        ("created_at<100", 1, 99, True),
        ("created_at<100", 1, 100, False),  # strict
        ("created_at>100", 1, 101, True),
        ("created_at>100", 1, 100, False),  # strict
        ("kind=1&created_at>10&created_at<20", 1, 15, True),
        ("kind=1&created_at>10&created_at<20", 1, 20, False),
        ("kind=1&created_at>10&created_at<20", 2, 15, False),
        ("kind=1&kind=2", 1, 0, False),  # every clause must hold
        ("created_at<0", 1, 0, False),
        ("created_at>4294967295", 1, 4294967296, True),
    ],
)
def test_check_conditions(conditions: str, kind: int, created_at: int, allowed: bool) -> None:
    assert nipoa.check_conditions(conditions, kind, created_at) is allowed


@pytest.mark.parametrize(
    "bad",
    [
        "kind=", "kind=-1", "kind=+1", "kind=1.0", "kind=0x10", "kind=١", "KIND=1",
        "created_at=5", "created_at<=5", "created_at < 5", " kind=1", "kind=1 ",
        "kind=1&", "&", "kind=99999999999", "created_at<99999999999", "created_at>00",
        "kind=1;created_at<5", "kind=1\n",
    ],
)  # fmt: skip
def test_malformed_conditions(bad: str) -> None:
    with pytest.raises(ConditionsError):
        nipoa.parse_conditions(bad)
    with pytest.raises(ConditionsError):
        nipoa.check_conditions(bad, 1, 1)


def test_conditions_are_signed_verbatim() -> None:
    a = nipoa.sign_attestation(OWNER_SEC, AGENT, "kind=1&created_at<5", AUX)
    b = nipoa.sign_attestation(OWNER_SEC, AGENT, "created_at<5&kind=1", AUX)
    assert a[3] != b[3]
    with pytest.raises(AttestationSignatureError):
        nipoa.verify_auth_tag([*a[:2], b[2], a[3]], AGENT)


def test_sign_refuses_self_attestation() -> None:
    with pytest.raises(SelfAttestationError):
        nipoa.sign_attestation(OWNER_SEC, OWNER, "", AUX)


def test_off_curve_owner_is_rejected() -> None:
    tag = nipoa.sign_attestation(OWNER_SEC, AGENT, "", AUX)
    with pytest.raises(AttestationFormatError):
        nipoa.verify_auth_tag(["auth", "00" * 31 + "05", "", tag[3]], AGENT)


def test_wrong_label_and_types() -> None:
    tag = nipoa.sign_attestation(OWNER_SEC, AGENT, "", AUX)
    with pytest.raises(AttestationFormatError):
        nipoa.parse_auth_tag(["delegation", *tag[1:]])
    with pytest.raises(AttestationFormatError):
        nipoa.parse_auth_tag([*tag[:3], tag[3][:-2]])


def event(tags: list[list[str]], kind: int = 1, created_at: int = 1_000) -> object:
    return sign_event(AGENT_SEC, created_at, kind, tags, "hi", AUX)


def test_event_attestation_checks_conditions_against_the_event() -> None:
    tag = nipoa.sign_attestation(OWNER_SEC, AGENT, "kind=1&created_at<2000", AUX)
    att = nipoa.event_attestation(event([tag]))
    assert att is not None and att.owner == OWNER
    assert att.clauses == (("kind=", 1), ("created_at<", 2000))
    with pytest.raises(ConditionsNotMetError):
        nipoa.event_attestation(event([tag], kind=2))
    with pytest.raises(ConditionsNotMetError):
        nipoa.event_attestation(event([tag], created_at=2000))


def test_event_attestation_binds_the_agent_key() -> None:
    # A tag issued to another agent does not transfer to this one.
    other_agent = pubkey_of(bytes.fromhex("00" * 31 + "09"))
    tag = nipoa.sign_attestation(OWNER_SEC, other_agent, "", AUX)
    with pytest.raises(AttestationSignatureError):
        nipoa.event_attestation(event([tag]))


def test_all_errors_share_a_base() -> None:
    for err in (
        AttestationFormatError,
        AttestationSignatureError,
        ConditionsError,
        ConditionsNotMetError,
        SelfAttestationError,
    ):
        assert issubclass(err, AttestationError)
