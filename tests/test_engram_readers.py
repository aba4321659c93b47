"""The pure rules behind NIP-70 and the private read gate (engram.nip70, engram.readers),
the policy decisions built on them, and the private_kinds setting."""

from __future__ import annotations

import pytest

from engram.nip01 import sign_event
from engram.nip70 import is_protected
from engram.readers import asks_only_own, parties, recipient
from relay import policy
from relay.config import ConfigError, Settings, load_settings
from relay.filters import Filter
from relay.tenants import TenantConfig, build_tenant, default_tenant, merged_limits

A, B, C = "aa" * 32, "bb" * 32, "cc" * 32


def test_is_protected() -> None:
    assert is_protected([["-"]])
    assert is_protected([["p", A], ["-"]])
    assert not is_protected([])
    assert not is_protected([["p", "-"], ["t", "-"], []])  # a value "-" is not the tag


def test_recipient_is_the_first_p_tag_when_it_is_a_key() -> None:
    assert recipient([["e", C], ["p", A], ["p", B]]) == A
    assert recipient([["p", "not a key"], ["p", A]]) is None
    assert recipient([["p"], ["p", B]]) == B  # a valueless `p` names nobody
    assert recipient([]) is None
    assert parties(A, [["p", B]]) == {A, B}
    assert parties(A, []) == {A}


@pytest.mark.parametrize(
    ("authors", "p", "viewer", "own"),
    [
        ([A], None, A, True),
        (None, [A], A, True),
        ([A, B], None, A, False),
        ([B], [A], A, True),  # `#p` alone makes it the viewer's own
        (None, None, A, False),
        ([A], None, None, False),
        ([], [], A, False),
    ],
)
def test_asks_only_own(authors, p, viewer, own) -> None:
    assert asks_only_own(authors, p, viewer) is own


def _tenant(**limits):
    settings = Settings()
    return build_tenant(TenantConfig(host="t.test", limits=limits), settings)


def test_check_write_protected_event() -> None:
    sk = (0x70).to_bytes(32, "big")
    event = sign_event(sk, 1, 1, [["-"]], "", bytes(32))
    tenant = _tenant()
    assert policy.check_write(event, None, None, tenant).startswith("auth-required:")
    assert policy.check_write(event, A, None, tenant).startswith("restricted:")
    assert policy.check_write(event, event.pubkey, None, tenant) is None
    plain = sign_event(sk, 1, 1, [], "", bytes(32))
    assert policy.check_write(plain, None, None, tenant) is None


def test_check_read_and_readers_follow_the_tenants_private_kinds() -> None:
    dm_only = _tenant(private_kinds=[4])
    assert dm_only.private_kinds == {4, 4174, 4175, 30174}  # agent memory and its history
    assert policy.check_read(Filter(kinds=[4]), None, dm_only).startswith("auth-required:")
    assert policy.check_read(Filter(kinds=[4], tags={"p": [B]}), A, dm_only).startswith(
        "restricted:"
    )
    assert policy.check_read(Filter(kinds=[4], tags={"p": [A]}), A, dm_only) is None
    assert policy.check_read(Filter(kinds=[1059]), None, dm_only) is None  # public here
    assert policy.check_read(Filter(ids=[C]), None, dm_only) is None  # rows are gated
    sk = (0x71).to_bytes(32, "big")
    dm = sign_event(sk, 1, 4, [["p", B]], "", bytes(32))
    assert policy.readers(dm, dm_only.private_kinds) == {dm.pubkey, B}
    assert policy.readers(dm, frozenset({30174})) is None
    assert default_tenant(Settings()).private_kinds == {4, 1059, 1060, 4174, 4175, 30174}


def test_private_kinds_setting() -> None:
    assert load_settings(env={}).limits.private_kinds == [4, 1059, 1060]
    env = {"ENGRAM_LIMITS_PRIVATE_KINDS": "4, 14"}
    assert load_settings(env=env).limits.private_kinds == [4, 14]
    assert load_settings(env={"ENGRAM_LIMITS_PRIVATE_KINDS": ""}).limits.private_kinds == []
    with pytest.raises(ConfigError, match="ENGRAM_LIMITS_PRIVATE_KINDS"):
        load_settings(env={"ENGRAM_LIMITS_PRIVATE_KINDS": "4,dm"})
    with pytest.raises(ConfigError, match="private_kinds"):
        load_settings(env={"ENGRAM_LIMITS_PRIVATE_KINDS": "70000"})
    with pytest.raises(ValueError, match="private_kinds"):
        merged_limits(Settings().limits, {"private_kinds": [-1]})
