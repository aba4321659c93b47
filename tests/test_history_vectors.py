"""The NIP-AE history extension's vectors (tests/vectors/nip-ae-history.vectors.json; the
spec is docs/NIP-AE-HISTORY.md): every event rebuilt byte for byte from its inputs and
read back, and every rule (what is live, as of a time, the log, the write refusals, the
audit, invalid events, plain heads) checked against `engram`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from engram import (
    InvalidEngramError,
    Memory,
    build_event,
    conversation_key,
    validate_and_decrypt,
    validate_engram_envelope,
)
from engram.chain import Holdings, audit_slug
from engram.live import check_write, live_view, visible
from engram.nip01 import Event
from engram.versions import (
    AGENT,
    Meta,
    Version,
    build_head,
    build_version,
    encode_version_body,
    validate_version,
)

V: dict[str, Any] = json.loads(
    (Path(__file__).parent / "vectors" / "nip-ae-history.vectors.json").read_text()
)
SK_A = bytes.fromhex(V["inputs"]["seckey_a"])
SK_O = bytes.fromhex(V["inputs"]["seckey_o"])
AGENT_PK, OWNER_PK = V["inputs"]["pubkey_a"], V["inputs"]["pubkey_o"]
CK = conversation_key(SK_A, OWNER_PK)
EVENTS = {e["name"]: e for e in V["events"]}


def event(name: str) -> Event:
    return msgspec.convert(EVENTS[name]["event"], Event)


def versions(names: list[str]) -> list[Version]:
    return [validate_version(event(n), AGENT_PK, OWNER_PK, CK) for n in names]


@pytest.mark.parametrize("name", list(EVENTS))
def test_every_event_is_rebuilt_byte_for_byte_and_read_back(name: str) -> None:
    spec = EVENTS[name]
    nonce, aux = bytes.fromhex(spec["nonce"]), bytes.fromhex(spec["aux"])
    at, slug, text = spec["created_at"], spec["slug"], spec["text"]
    if spec["build"] == "plain":
        built = build_event(SK_A, OWNER_PK, Memory(slug, text), at, nonce, aux)
    else:
        meta = msgspec.convert(spec["meta"], Meta)
        assert encode_version_body(slug, text, meta).decode() == spec["body"]
        if spec["build"] == "head":
            built = build_head(SK_A, OWNER_PK, slug, text, meta, at, nonce, aux)
        else:
            seckey, peer = (SK_A, OWNER_PK) if spec["role"] == AGENT else (SK_O, AGENT_PK)
            built = build_version(seckey, peer, spec["role"], slug, text, meta, at, nonce, aux)
    assert msgspec.to_builtins(built) == spec["event"]
    read = validate_version(built, AGENT_PK, OWNER_PK, CK)
    assert (read.slug, read.text) == (slug, text)
    assert read.role == spec.get("role", AGENT)
    if spec["build"] != "plain":
        assert json.loads(msgspec.json.encode(read.meta)) == spec["meta"]
    assert read.plain == (spec["build"] == "plain")
    assert validate_engram_envelope(built) is None  # a relay admits it as it admits engrams
    if built.kind == 30174:  # a NIP-AE-only reader reads the same value
        body = validate_and_decrypt(built, AGENT_PK, OWNER_PK, CK)
        assert getattr(body, "value", getattr(body, "profile", None)) == text


@pytest.mark.parametrize("step", V["live"] + V["core"], ids=lambda s: s["events"][-1])
def test_what_is_live(step: dict[str, Any]) -> None:
    slug = versions(step["events"][:1])[0].slug
    lv = live_view(slug, versions(step["events"]))
    assert (lv.state, lv.text) == (step["state"], step["value"])
    if "version" in step:
        got = (lv.version.id, lv.version.meta.trust, lv.version.role) if lv.version else None
        want = (step["version"], step["trust"], step["role"]) if step["version"] else None
        assert got == want


def test_as_of_log_refusals_audit() -> None:
    names = V["live"][-3]["events"]  # every event before the forget
    for case in V["as_of"]:
        lv = live_view("mem/example", versions(names), as_of=case["as_of"])
        assert (lv.state, lv.text) == (case["state"], case["value"]), case
    shown = visible(versions(names))
    assert [
        {"id": v.id, "role": v.role, "trust": v.meta.trust, "plain": v.plain} for v in shown
    ] == V["log_before_forget"]
    for case in V["refusals"]:
        refusal = check_write(
            versions(case["events"]), case["role"], case["text"], force=case["force"]
        )
        got = None if refusal is None else {"kind": refusal.kind, "version": refusal.version.id}
        assert got == case["refusal"], case
    for case in V["audit"]:
        holdings = {
            url: Holdings(versions(h["versions"]), versions(h["heads"]))
            for url, h in case["holdings"].items()
        }
        found = sorted([f.kind, f.version, f.relay] for f in audit_slug("mem/example", holdings))
        assert found == case["findings"], case["name"]


@pytest.mark.parametrize("case", V["invalid"], ids=lambda c: c["why"])
def test_invalid_versions(case: dict[str, Any]) -> None:
    with pytest.raises(InvalidEngramError) as refused:
        validate_version(msgspec.convert(case["event"], Event), AGENT_PK, OWNER_PK, CK)
    assert refused.value.rule == case["rule"]


@pytest.mark.parametrize("case", V["plain_heads"], ids=lambda c: c["why"])
def test_heads_with_bad_members_read_as_plain(case: dict[str, Any]) -> None:
    read = validate_version(msgspec.convert(case["event"], Event), AGENT_PK, OWNER_PK, CK)
    assert (read.text, read.plain, read.meta) == (case["value"], True, Meta())


def test_the_rule_ignores_order_and_duplicates() -> None:
    """Relays return versions in any order, some twice, heads beside their revisions."""
    import random

    names = V["live"][-3]["events"]
    expected = live_view("mem/example", versions(names))
    rng = random.Random(39)
    for _ in range(20):
        shuffled = versions(names) + versions(rng.sample(names, 4))
        rng.shuffle(shuffled)
        assert live_view("mem/example", shuffled) == expected
        assert [v.id for v in visible(shuffled)] == [v.id for v in visible(versions(names))]
