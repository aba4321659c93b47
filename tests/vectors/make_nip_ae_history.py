"""Writes nip-ae-history.vectors.json (docs/NIP-AE-HISTORY.md): run from the repository root,
`python tests/vectors/make_nip_ae_history.py`. Deterministic: nonces and aux are sha256 of
a counter. The vectors pin the extension's wire format and rules; tests/test_history_vectors.py
rebuilds every event from them and checks every expectation against `engram`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec

from engram import Core, Memory, build_event, conversation_key
from engram.chain import Holdings, audit_slug
from engram.live import check_write, live_view, visible
from engram.nip01 import Event, pubkey_of
from engram.versions import (
    AGENT,
    OWNER,
    Meta,
    build_head,
    build_version,
    encode_version_body,
    sha256_text,
    validate_version,
)

SK_A = bytes.fromhex("00" * 31 + "01")
SK_O = bytes.fromhex("00" * 31 + "02")
A, O = pubkey_of(SK_A), pubkey_of(SK_O)
CK = conversation_key(SK_A, O)
T0 = 1_700_000_000
SLUG = "mem/example"
OUT = Path(__file__).with_name("nip-ae-history.vectors.json")

counter = 0


def rand(label: str) -> bytes:
    global counter
    counter += 1
    return hashlib.sha256(f"{label}-{counter}".encode()).digest()


events: list[dict[str, Any]] = []


def add(name: str, event: Event, **spec: Any) -> Event:
    events.append({"name": name, **spec, "event": msgspec.to_builtins(event)})
    return event


def version(
    name: str, role: str, slug: str, text: str | None, meta: Meta, at: int, head: bool = True
) -> tuple[Event, Event | None]:
    seckey, peer = (SK_A, O) if role == AGENT else (SK_O, A)
    nonce, aux = rand("nonce"), rand("aux")
    rev = build_version(seckey, peer, role, slug, text, meta, at, nonce, aux)
    spec = {
        "build": "version",
        "role": role,
        "slug": slug,
        "text": text,
        "meta": msgspec.to_builtins(meta),
        "created_at": at,
        "nonce": nonce.hex(),
        "aux": aux.hex(),
        "body": encode_version_body(slug, text, meta).decode(),
    }
    add(name, rev, **spec)
    copy = None
    if role == AGENT and head:
        meta_h = msgspec.structs.replace(meta, rev=rev.id)
        nonce, aux = rand("nonce"), rand("aux")
        copy = build_head(SK_A, O, slug, text, meta_h, at, nonce, aux)
        add(
            f"{name}.head", copy, build="head", role=role, slug=slug, text=text,
            meta=msgspec.to_builtins(meta_h), created_at=at, nonce=nonce.hex(), aux=aux.hex(),
            body=encode_version_body(slug, text, meta_h).decode(),
        )  # fmt: skip
    return rev, copy


def main() -> None:
    h = sha256_text
    r1, h1 = version("R1", AGENT, SLUG, "hello", Meta(trust="guess", source="session 1"), T0)
    r2, h2 = version(
        "R2", AGENT, SLUG, "hello, world",
        Meta(trust="stated", valid_from=T0 - 10**7, valid_until=T0 + 10**7,
             prev=r1.id, prev_sha256=h("hello")), T0 + 1,
    )  # fmt: skip
    v3, _ = version(
        "V3", OWNER, SLUG, "hello, world",
        Meta(trust="confirmed", valid_from=T0 - 10**7, valid_until=T0 + 10**7,
             prev=r2.id, prev_sha256=h("hello, world")), T0 + 2,
    )  # fmt: skip
    r4, h4 = version(
        "R4", AGENT, SLUG, None,
        Meta(reason="wrong", rejected=(h("hello, world") or "",), prev=v3.id,
             prev_sha256=h("hello, world")), T0 + 3,
    )  # fmt: skip
    v5, _ = version(
        "V5", OWNER, SLUG, "bonjour", Meta(trust="confirmed", prev=r4.id), T0 + 4
    )
    v6, _ = version(
        "V6", OWNER, SLUG, None,
        Meta(trust="denied", reason="not French", rejected=(h("bonjour") or "",), prev=v5.id,
             prev_sha256=h("bonjour")), T0 + 5,
    )  # fmt: skip
    nonce, aux = rand("nonce"), rand("aux")
    p7 = build_event(SK_A, O, Memory(SLUG, "bonjour"), T0 + 6, nonce, aux)
    add("P7", p7, build="plain", slug=SLUG, text="bonjour", created_at=T0 + 6,
        nonce=nonce.hex(), aux=aux.hex())  # fmt: skip
    r8, h8 = version(
        "R8", AGENT, SLUG, "hola", Meta(trust="guess", prev=v6.id, prev_sha256=None), T0 + 7
    )
    r9, h9 = version(
        "R9", AGENT, SLUG, None,
        Meta(forget=True, rejected=tuple(sorted([h("hola") or "", h("bonjour") or "",
                                                  h("hello, world") or ""]))), T0 + 8,
    )  # fmt: skip
    c1, ch1 = version("C1", AGENT, "core", "I am the agent.", Meta(trust="stated"), T0)
    vc, _ = version(
        "VC", OWNER, "core", None,
        Meta(trust="denied", reason="not who you are", rejected=(h("I am the agent.") or "",),
             prev=c1.id, prev_sha256=h("I am the agent.")), T0 + 1,
    )  # fmt: skip
    # two writers from one base (only in the audit's fork case)
    f_left, _ = version(
        "F1", AGENT, SLUG, "left", Meta(trust="guess", prev=r8.id, prev_sha256=h("hola")),
        T0 + 9, head=False,
    )  # fmt: skip
    f_right, _ = version(
        "F2", AGENT, SLUG, "right", Meta(trust="guess", prev=r8.id, prev_sha256=h("hola")),
        T0 + 10, head=False,
    )  # fmt: skip

    by_name = {e["name"]: msgspec.convert(e["event"], Event) for e in events}
    as_versions = {n: validate_version(e, A, O, CK) for n, e in by_name.items()}
    order = ["R1", "R1.head", "R2", "R2.head", "V3", "R4", "R4.head", "V5", "V6", "P7",
             "R8", "R8.head", "R9", "R9.head"]  # fmt: skip
    steps = []
    for i in range(1, len(order) + 1):
        seen = order[:i]
        lv = live_view(SLUG, [as_versions[n] for n in seen])
        steps.append(
            {
                "events": seen,
                "state": lv.state,
                "value": lv.text,
                "version": lv.version.id if lv.version else None,
                "trust": lv.version.meta.trust if lv.version else None,
                "role": lv.version.role if lv.version else None,
            }
        )
    core = live_view("core", [as_versions[n] for n in ("C1", "C1.head", "VC")])
    core_steps = [{"events": ["C1", "C1.head", "VC"], "state": core.state, "value": core.text}]
    as_of = []
    upto = [as_versions[n] for n in order[:-2]]  # before the forget
    for at in range(T0 - 1, T0 + 8):
        lv = live_view(SLUG, upto, as_of=at)
        as_of.append({"as_of": at, "state": lv.state, "value": lv.text})
    refusals = []
    for upto_name, role, text, force in [
        ("R4.head", AGENT, "hello, world", False),
        ("R4.head", AGENT, "hello, world", True),
        ("V5", AGENT, "something else", False),
        ("V5", AGENT, "something else", True),
        ("V6", AGENT, "bonjour", False),
        ("V6", AGENT, "bonjour", True),
        ("V6", OWNER, "bonjour", False),
        ("V6", AGENT, "hola", False),
    ]:
        seen = [as_versions[n] for n in order[: order.index(upto_name) + 1]]
        refusal = check_write(seen, role, text, force=force)
        refusals.append(
            {
                "events": order[: order.index(upto_name) + 1],
                "role": role,
                "text": text,
                "force": force,
                "refusal": None
                if refusal is None
                else {"kind": refusal.kind, "version": refusal.version.id},
            }
        )
    log = [
        {"id": v.id, "role": v.role, "trust": v.meta.trust, "plain": v.plain}
        for v in visible([as_versions[n] for n in order[:-2]])
    ]
    chain = [n for n in ("R1", "R2", "V3", "R4", "V5", "V6", "R8")]
    audits = []
    for name, holdings in [
        (
            "clean",
            {"relay-a": (chain, ["R8.head"]), "relay-b": (chain, ["R8.head"])},
        ),
        (
            "missing and out of chain",
            {
                "relay-a": (chain, ["R8.head"]),
                "relay-b": ([n for n in chain if n != "R2"], ["P7"]),
            },
        ),
        ("fork", {"relay-a": ([*chain, "F1", "F2"], ["R8.head"])}),
        ("stale head", {"relay-a": (chain, ["R4.head"])}),
    ]:
        found = audit_slug(
            SLUG,
            {
                url: Holdings([as_versions[n] for n in vs], [as_versions[n] for n in hs])
                for url, (vs, hs) in holdings.items()
            },
        )
        audits.append(
            {
                "name": name,
                "holdings": {u: {"versions": vs, "heads": hs} for u, (vs, hs) in holdings.items()},
                "findings": sorted([f.kind, f.version, f.relay] for f in found),
            }
        )
    invalid = []
    bad_cases = [
        ("an agent may not write 'confirmed'", SK_A, O, 4174, '{"slug":"mem/example","value":"x","trust":"confirmed"}', 5),
        ("an owner's value is 'confirmed'", SK_O, A, 4175, '{"slug":"mem/example","value":"x","trust":"guess"}', 5),
        ("a revision needs a value member", SK_A, O, 4174, '{"slug":"mem/example"}', 5),
        ("a verdict is the owner's", SK_A, O, 4175, '{"slug":"mem/example","value":null,"trust":"denied"}', 1),
        ("validity must be a window", SK_A, O, 4174, '{"slug":"mem/example","value":"x","valid_from":5,"valid_until":5}', 5),
        ("prev must be an event id", SK_A, O, 4174, '{"slug":"mem/example","value":"x","prev":"XYZ"}', 5),
    ]  # fmt: skip
    from engram import nip44
    from engram.nip01 import sign_event
    from engram.slug import d_tag

    for why, sk, peer, kind, body, rule in bad_cases:
        nonce, aux = rand("nonce"), rand("aux")
        content = nip44.encrypt(body, CK, nonce)
        ev = sign_event(sk, T0, kind, [["d", d_tag(CK, SLUG)], ["p", peer]], content, aux)
        invalid.append({"why": why, "body": body, "rule": rule, "event": msgspec.to_builtins(ev)})
    plain_meta = []
    nonce, aux = rand("nonce"), rand("aux")
    odd = '{"slug":"mem/odd","value":"kept","trust":"confirmed","rev":"nothex"}'
    content = nip44.encrypt(odd, CK, nonce)
    from engram.nip01 import sign_event as sign

    odd_head = sign(SK_A, T0, 30174, [["d", d_tag(CK, "mem/odd")], ["p", O]], content, aux)
    plain_meta.append(
        {
            "why": "a head whose extension members fail is a plain NIP-AE head, never invalid",
            "body": odd,
            "event": msgspec.to_builtins(odd_head),
            "value": "kept",
            "plain": True,
        }
    )
    doc = {
        "about": (
            "Test vectors for the NIP-AE history extension (docs/NIP-AE-HISTORY.md): "
            "revisions (kind 4174), owner verdicts (kind 4175), versioned heads (30174). "
            "Keys are NIP-AE's vector keys; nonce and aux are given per event."
        ),
        "inputs": {"seckey_a": SK_A.hex(), "seckey_o": SK_O.hex(), "pubkey_a": A, "pubkey_o": O},
        "events": events,
        "live": steps,
        "core": core_steps,
        "as_of": as_of,
        "log_before_forget": log,
        "refusals": refusals,
        "audit": audits,
        "invalid": invalid,
        "plain_heads": plain_meta,
    }
    _ = Core
    OUT.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({len(events)} events)")


if __name__ == "__main__":
    main()
