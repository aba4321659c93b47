"""Head selection, monotonic timestamps, lookups and listings (spec: *Head selection*,
*Writing*, *Reading and listing*), with hypothesis properties."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram import (
    ClockConflictError,
    Core,
    Event,
    Memory,
    Tombstone,
    beats,
    build_event,
    conversation_key,
    core_profile,
    heads_by_slug,
    listing,
    lookup_head,
    merge_heads,
    monotonic_created_at,
    pick_head,
    select_head,
)
from engram.nip01 import pubkey_of, sign_event

SEC_A = bytes.fromhex("00" * 31 + "01")
SEC_O = bytes.fromhex("00" * 31 + "02")
AGENT, OWNER = pubkey_of(SEC_A), pubkey_of(SEC_O)
K_C = conversation_key(SEC_A, OWNER)
AUX = bytes(32)


def fake(created_at: int, id_: str) -> Event:
    return Event(
        id=id_, pubkey=AGENT, created_at=created_at, kind=30174, tags=[], content="", sig=""
    )


def write(body, created_at: int, nonce: int = 1, seckey: bytes = SEC_A, owner: str = OWNER):
    return build_event(seckey, owner, body, created_at, nonce.to_bytes(32, "big"), AUX)


# --- select_head --------------------------------------------------------------------------


def test_select_head_greatest_created_at_wins() -> None:
    old, new = fake(1, "00" * 32), fake(2, "ff" * 32)
    assert select_head([old, new]) is new
    assert select_head([new, old]) is new


def test_select_head_tie_goes_to_lowest_id() -> None:
    low, high = fake(5, "0a" + "ff" * 31), fake(5, "0b" + "00" * 31)
    assert select_head([high, low]) is low
    assert select_head([low, high]) is low


def test_select_head_empty() -> None:
    assert select_head([]) is None
    assert select_head(iter([])) is None


EVENTS = st.lists(
    st.tuples(st.integers(0, 5), st.binary(min_size=32, max_size=32)),
    min_size=1,
    max_size=12,
    unique_by=lambda t: t[1],
).map(lambda items: [fake(ts, raw.hex()) for ts, raw in items])


@given(EVENTS, st.randoms())
def test_select_head_is_independent_of_order(events: list[Event], rnd) -> None:
    shuffled = list(events)
    rnd.shuffle(shuffled)
    head = select_head(events)
    assert select_head(shuffled) is head
    assert head is not None
    assert all(
        e.created_at < head.created_at or (e.created_at == head.created_at and e.id >= head.id)
        for e in events
    )


# --- monotonic_created_at -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "prior", "expected"),
    [
        (100, None, 100),
        (100, 0, 100),  # 0 means "no head"
        (100, 50, 100),
        (100, 99, 100),
        (100, 100, 101),  # same second: must still supersede
        (100, 200, 201),  # slow clock: still after the head
    ],
)
def test_monotonic_created_at(now: int, prior: int | None, expected: int) -> None:
    assert monotonic_created_at(now, prior) == expected


def test_monotonic_refuses_clock_poisoned_head() -> None:
    assert monotonic_created_at(100, 150, max_skew=600) == 151
    assert monotonic_created_at(100, 699, max_skew=600) == 700  # exactly at the bound
    with pytest.raises(ClockConflictError):
        monotonic_created_at(100, 700, max_skew=600)
    assert monotonic_created_at(100, 10**9) == 10**9 + 1  # no bound unless asked


@given(st.integers(0, 2**40), st.one_of(st.none(), st.integers(0, 2**40)))
def test_monotonic_property(now: int, prior: int | None) -> None:
    t = monotonic_created_at(now, prior)
    assert t >= now
    if prior:
        assert t > prior


# --- lookup_head / listing ----------------------------------------------------------------


def test_lookup_head_statuses() -> None:
    a1 = write(Memory(slug="mem/a", value="one"), 10, 1)
    a2 = write(Memory(slug="mem/a", value="two"), 11, 2)
    b1 = write(Memory(slug="mem/b", value="b"), 12, 3)
    found = lookup_head([a1, b1, a2], AGENT, OWNER, K_C, "mem/a")
    assert found.head is not None and found.head.event is a2
    assert found.head.body == Memory(slug="mem/a", value="two")
    assert (found.candidates, found.rejected) == (2, 0)
    absent = lookup_head([a1, b1], AGENT, OWNER, K_C, "mem/zzz")
    assert absent == (None, 0, 0)
    broken = msgspec.structs.replace(a2, sig="00" * 64)
    unreadable = lookup_head([broken], AGENT, OWNER, K_C, "mem/a")
    assert unreadable == (None, 1, 1)  # candidates that all fail: not an absence


def test_invalid_newer_event_does_not_shadow_valid_head() -> None:
    good = write(Memory(slug="mem/a", value="good"), 10)
    forged = msgspec.structs.replace(write(Memory(slug="mem/a", value="evil"), 99), sig="00" * 64)
    found = lookup_head([forged, good], AGENT, OWNER, K_C, "mem/a")
    assert found.head is not None and found.head.event is good
    assert found.rejected == 1


def test_tie_between_real_events_goes_to_lowest_id() -> None:
    x = write(Memory(slug="mem/a", value="x"), 10, 1)
    y = write(Memory(slug="mem/a", value="y"), 10, 2)
    low = min(x, y, key=lambda e: e.id)
    assert lookup_head([x, y], AGENT, OWNER, K_C, "mem/a").head.event is low
    assert lookup_head([y, x], AGENT, OWNER, K_C, "mem/a").head.event is low


def test_listing_drops_tombstones_and_core_and_sorts() -> None:
    events = [
        write(Memory(slug="mem/z", value="z"), 1, 1),
        write(Memory(slug="mem/a", value="a"), 2, 2),
        write(Memory(slug="mem/gone", value="g"), 3, 3),
        write(Tombstone(slug="mem/gone"), 4, 4),
        write(Core(profile="me [[mem/a]]"), 5, 5),
    ]
    heads = heads_by_slug(events, AGENT, OWNER, K_C)
    assert sorted(heads) == ["core", "mem/a", "mem/gone", "mem/z"]
    assert [(e.slug, e.created_at) for e in listing(heads)] == [("mem/a", 2), ("mem/z", 1)]
    assert listing(heads)[0].event_id == events[1].id
    assert core_profile(heads) == "me [[mem/a]]"
    assert core_profile({}) is None


def test_memory_is_scoped_to_the_agent_owner_pair() -> None:
    other_owner = pubkey_of(bytes.fromhex("00" * 31 + "07"))
    for_other = write(Memory(slug="mem/a", value="other"), 50, owner=other_owner)
    mine = write(Memory(slug="mem/a", value="mine"), 10)
    assert for_other.tags[0] != mine.tags[0]  # different K_c, different d
    heads = heads_by_slug([for_other, mine], AGENT, OWNER, K_C)
    assert heads["mem/a"].event is mine


# --- property: foreign events are never selected -----------------------------------------

KEYS = [bytes.fromhex(f"{i:064x}") for i in (1, 2, 3, 4, 5)]


@st.composite
def mixed_events(draw):
    """Events for slug mem/a: legitimate ones plus events by other agents, for other
    owners, forged (someone else's signature) and tampered, often newer than the
    legitimate ones."""
    events, legit = [], []
    for i in range(draw(st.integers(1, 6))):
        ts = draw(st.integers(0, 20))
        kinds = ["legit", "other-agent", "other-owner", "forged", "copied", "tampered"]
        kind = draw(st.sampled_from(kinds))
        body = Memory(slug="mem/a", value=f"v{i}")
        nonce = i + 1
        if kind == "legit":
            event = write(body, ts, nonce)
            legit.append(event)
        elif kind == "other-agent":
            # Another agent encrypts to our owner, under our d tag, tagged for our owner.
            seckey = draw(st.sampled_from(KEYS[2:]))
            event = write(body, ts, nonce, seckey=seckey)
        elif kind == "other-owner":
            owner = pubkey_of(draw(st.sampled_from(KEYS[2:])))
            event = write(body, ts, nonce, owner=owner)
        elif kind == "forged":
            # Someone else's valid event relabelled as ours: the signature breaks.
            theirs = write(body, ts, nonce, seckey=draw(st.sampled_from(KEYS[2:])))
            event = msgspec.structs.replace(theirs, pubkey=AGENT, tags=write(body, ts).tags)
        elif kind == "copied":
            # Our exact tags and ciphertext, re-signed by another key: wrong author.
            ours = write(body, ts, nonce)
            seckey = draw(st.sampled_from(KEYS[2:]))
            event = sign_event(seckey, ts + 50, 30174, ours.tags, ours.content, AUX)
        else:
            event = msgspec.structs.replace(write(body, ts, nonce), created_at=ts + 100)
        events.append(event)
    return events, legit


@settings(max_examples=60, deadline=None)
@given(mixed_events(), st.randoms())
def test_foreign_events_are_never_selected(case, rnd) -> None:
    events, legit = case
    rnd.shuffle(events)
    found = lookup_head(events, AGENT, OWNER, K_C, "mem/a")
    if not legit:
        assert found.head is None
        return
    assert found.head is not None
    assert found.head.event in legit
    assert found.head.event is select_head(legit)
    assert found.head.event.pubkey == AGENT and ["p", OWNER] in found.head.event.tags


# --- one home for the head rule: the client and the store use these ----------------------


@given(EVENTS)
def test_beats_is_select_heads_rule_on_hex_and_on_raw_ids(events: list[Event]) -> None:
    """Readers compare hex ids, the store raw bytes: the same order either way."""
    head = select_head(events)
    assert head is not None
    for other in events:
        if other is head:
            continue
        assert beats(head.created_at, head.id, other.created_at, other.id)
        raw = bytes.fromhex(head.id), bytes.fromhex(other.id)
        assert beats(head.created_at, raw[0], other.created_at, raw[1])
        assert not beats(other.created_at, raw[1], head.created_at, raw[0])


@given(EVENTS)
def test_the_stores_in_batch_rule_is_the_same_rule(events: list[Event]) -> None:
    """`relay.store.pgwriter.Pending.beats` settles two writes of one address in a batch."""
    from relay.store.pgwriter import Pending

    rows = {
        e.id: Pending("t", (bytes.fromhex(e.id), b"", e.created_at, 30174, "d"), None)  # type: ignore[arg-type]
        for e in events
    }
    head = select_head(events)
    assert head is not None
    assert all(rows[head.id].beats(rows[e.id]) for e in events if e is not head)


@st.composite
def memory_versions(draw):
    """Versions of a few slugs (ties included) plus invalid events, split into views."""
    events = []
    for i in range(draw(st.integers(1, 8))):
        slug = draw(st.sampled_from(["mem/a", "mem/b", "core"]))
        ts = draw(st.integers(0, 4))
        body = Core(profile=f"p{i}") if slug == "core" else Memory(slug=slug, value=f"v{i}")
        event = write(body, ts, i + 1)
        if draw(st.booleans()) and draw(st.booleans()):
            event = msgspec.structs.replace(event, created_at=ts + 9)  # tampered: invalid
        events.append(event)
    views = draw(st.lists(st.sampled_from(range(3)), min_size=len(events), max_size=len(events)))
    return events, [[e for e, v in zip(events, views, strict=True) if v == k] for k in range(3)]


@settings(max_examples=40)
@given(memory_versions(), st.randoms())
def test_the_clients_checker_and_merge_are_engrams_rule(case, rnd) -> None:
    """`cli.memory.heads.HeadChecker` (validating lazily, newest first) and merging the
    relays' views (`merge_heads`) give exactly `heads_by_slug` of everything."""
    from cli.memory.heads import HeadChecker
    from cli.nostr.identity import Identity

    events, views = case
    rnd.shuffle(events)
    whole = heads_by_slug(events, AGENT, OWNER, K_C)
    ident = Identity(seckey=SEC_A, agent=AGENT, owner=OWNER, conversation_key=K_C, as_owner=False)
    checker = HeadChecker(ident)
    assert {s: h.event for s, h in checker.heads(events).items()} == {
        s: h.event for s, h in whole.items()
    }
    merged = merge_heads(heads_by_slug(v, AGENT, OWNER, K_C) for v in views)
    assert {s: h.event for s, h in merged.items()} == {s: h.event for s, h in whole.items()}
    for slug, head in whole.items():
        valid = [e for e in events if lookup_head([e], AGENT, OWNER, K_C, slug).head]
        assert head.event is select_head(valid)
        assert pick_head([head]) is head
