"""engram.negentropy on fixed inputs, and cross-checked byte for byte against nostr-sdk's
negentropy (the Rust `negentropy` crate inside its LocalRelay)."""

from __future__ import annotations

import asyncio
import hashlib
import random

import msgspec
import pytest
import websockets
from negentropy_support import BASE, KEY_B, event, items_of, local_relay

from engram.negentropy import (
    END,
    FINGERPRINT,
    ID_LIST,
    INFINITY,
    SKIP,
    Bound,
    Bridge,
    Items,
    Negentropy,
    NegentropyError,
    decode_message,
    decode_varint,
    encode_message,
    encode_varint,
    fingerprint,
    id_sum,
    minimal_bound,
)


def ident(n: int) -> bytes:
    return hashlib.sha256(n.to_bytes(8, "big")).digest()


# --- varints --------------------------------------------------------------------------

VARINTS = [
    (0, "00"),
    (1, "01"),
    (127, "7f"),
    (128, "8100"),
    (255, "817f"),
    (300, "822c"),
    (16383, "ff7f"),
    (16384, "818000"),
    (2**32, "9080808000"),
    (2**64 - 1, "81ffffffffffffffff7f"),
]


@pytest.mark.parametrize(("n", "hexed"), VARINTS)
def test_varint_fixed_encodings(n: int, hexed: str) -> None:
    assert encode_varint(n).hex() == hexed
    assert decode_varint(bytes.fromhex(hexed) + b"\x05", 0) == (n, len(hexed) // 2)


def test_varint_truncated_or_negative() -> None:
    with pytest.raises(NegentropyError):
        decode_varint(b"\x81\x80", 0)
    with pytest.raises(ValueError):
        encode_varint(-1)


# --- bounds ---------------------------------------------------------------------------


def test_bounds_delta_encode_timestamps_and_carry_the_shortest_prefix() -> None:
    fp = bytes(range(16))
    msg = encode_message(
        [
            (Bound(100), FINGERPRINT, fp),
            (Bound(100, b"\xab"), SKIP, b""),
            (Bound(130, b"\x00\x01"), ID_LIST, ident(1)),
            (END, FINGERPRINT, fp),
        ]
    )
    expected = (
        "61"
        + "65" + "00" + "01" + fp.hex()  # 1 + 100, no prefix, fingerprint
        + "01" + "01ab" + "00"  # 1 + 0 (same timestamp), 1-byte prefix, skip
        + "1f" + "020001" + "02" + "01" + ident(1).hex()  # 1 + 30
        + "00" + "00" + "01" + fp.hex()  # infinity
    )  # fmt: skip
    assert msg.hex() == expected
    ranges = decode_message(msg)
    assert [r.upper for r in ranges] == [
        Bound(100),
        Bound(100, b"\xab"),
        Bound(130, b"\x00\x01"),
        Bound(INFINITY),
    ]
    assert ranges[1].lower == Bound(100) and ranges[2].payload == ident(1)


def test_minimal_bound() -> None:
    a = bytes.fromhex("aabbcc" + "00" * 29)
    b = bytes.fromhex("aabbdd" + "00" * 29)
    assert minimal_bound((5, a), (6, b)) == Bound(6)
    assert minimal_bound((6, a), (6, b)) == Bound(6, bytes.fromhex("aabbdd"))
    assert Bound(6, b"\xaa").key < (6, a)


def test_malformed_messages_raise() -> None:
    for bad in ("", "5f", "6101", "610000", "6100000105", "61000002050000", "6100212100"):
        with pytest.raises(NegentropyError):
            Negentropy(Items.from_pairs([])).reconcile(bytes.fromhex(bad))
    # another version in the 0x6x range: answered with the one we speak
    assert Negentropy(Items.from_pairs([])).reconcile(b"\x62") == b"\x61"


# --- fingerprints ---------------------------------------------------------------------


def test_fingerprint_of_the_empty_set_and_of_fixed_ids() -> None:
    assert fingerprint([]) == hashlib.sha256(bytes(32) + b"\x00").digest()[:16]
    ids = [ident(i) for i in range(3)]
    total = sum(int.from_bytes(i, "little") for i in ids) % 2**256
    want = hashlib.sha256(total.to_bytes(32, "little") + b"\x03").digest()[:16]
    assert fingerprint(ids) == want


def test_fingerprint_sum_wraps_mod_2_256() -> None:
    ff, one = b"\xff" * 32, (1).to_bytes(32, "little")
    assert fingerprint([ff, one]) == hashlib.sha256(bytes(32) + b"\x02").digest()[:16]


def test_column_sum_equals_the_plain_sum() -> None:
    rng = random.Random(5)
    ids = [rng.randbytes(32) for _ in range(1000)] + [b"\xff" * 32, b"\xfe" + b"\xff" * 31]
    assert id_sum(b"".join(ids)) == sum(int.from_bytes(i, "little") for i in ids)
    items = Items.from_pairs((7, i) for i in ids)
    assert items.fingerprint(0, len(items)) == fingerprint(ids)


# --- splitting ------------------------------------------------------------------------


def test_few_items_are_listed_many_are_split_into_16_buckets() -> None:
    small = Items.from_pairs((BASE + i, ident(i)) for i in range(31))
    (only,) = decode_message(Negentropy(small).initiate())
    assert only.mode == ID_LIST and only.upper == END and len(only.payload) == 31 * 32

    pairs = [(BASE + i // 4, ident(i)) for i in range(40)]  # 4 items per timestamp
    items = Items.from_pairs(pairs)
    ranges = decode_message(Negentropy(items).initiate())
    assert [r.mode for r in ranges] == [FINGERPRINT] * 16
    assert ranges[-1].upper == END
    sizes, lower = [], 0
    for r in ranges:
        upper = items.lower_bound(lower, len(items), r.upper)
        assert r.payload == items.fingerprint(lower, upper)
        sizes.append(upper - lower)
        lower = upper
    assert sizes == [3] * 8 + [2] * 8  # 40 = 16 * 2 + 8 buckets with one more
    # bucket bounds inside a run of equal timestamps carry an id prefix, else none
    for r, end in zip(
        ranges, [3, 6, 9, 12, 15, 18, 21, 24, 26, 28, 30, 32, 34, 36, 38], strict=False
    ):
        prev, curr = items.item(end - 1), items.item(end)
        assert r.upper == minimal_bound(prev, curr)
        assert (len(r.upper.prefix) > 0) == (prev[0] == curr[0])


# --- reconciliation -------------------------------------------------------------------


def _pairs(n: int, seed: int, spread: int) -> list[tuple[int, bytes]]:
    rng = random.Random(seed)
    return [(BASE + rng.randrange(spread), rng.randbytes(32)) for _ in range(n)]


def _run(a: list, b: list, limit: int) -> tuple[set[bytes], set[bytes]]:
    ours, theirs = Negentropy(Items.from_pairs(a), limit), Negentropy(Items.from_pairs(b), limit)
    msg: bytes | None = ours.initiate()
    have: set[bytes] = set()
    need: set[bytes] = set()
    while msg is not None:
        reply = theirs.reconcile(msg)
        if limit:
            assert len(reply) <= limit
        msg, h, n = ours.reconcile_initiator(reply)
        have.update(h)
        need.update(n)
    return have, need


def _bridge(a: list, b: list, limit: int) -> tuple[set[bytes], set[bytes]]:
    sides = {
        "a": Negentropy(Items.from_pairs(a), limit),
        "b": Negentropy(Items.from_pairs(b), limit),
    }
    bridge = Bridge(limit, limit)
    msg: bytes | None = bridge.initial()
    side = "a"
    while msg is not None:
        msg = bridge.forward(sides[side].reconcile(msg), side)
        side = "b" if side == "a" else "a"
    return set(bridge.only_a), set(bridge.only_b)


@pytest.mark.parametrize("limit", [0, 4096, 50_000])
@pytest.mark.parametrize(
    ("n", "drop_a", "drop_b", "spread"),
    [(0, 0, 0, 10), (40, 0, 40, 10), (2000, 7, 11, 30), (2000, 300, 0, 5000), (3000, 0, 1, 3)],
)
def test_both_sides_learn_exactly_the_difference(
    limit: int, n: int, drop_a: int, drop_b: int, spread: int
) -> None:
    common = _pairs(n, 1, spread)
    a = common[drop_a:] + _pairs(drop_b, 2, spread)
    b = common[: len(common) - drop_b] + _pairs(drop_a // 2, 3, spread)
    ids_a, ids_b = {i for _, i in a}, {i for _, i in b}
    assert _run(a, b, limit) == (ids_a - ids_b, ids_b - ids_a)
    assert _bridge(a, b, limit) == (ids_a - ids_b, ids_b - ids_a)


def test_a_difference_only_in_the_id_at_one_timestamp() -> None:
    common = [(BASE + i // 5, ident(i)) for i in range(500)]
    a, b = [*common, (BASE + 50, ident(10_000))], [*common, (BASE + 50, ident(10_001))]
    assert _run(a, b, 0) == ({ident(10_000)}, {ident(10_001)})
    assert _bridge(a, b, 0) == ({ident(10_000)}, {ident(10_001)})


# --- cross-check with nostr-sdk -------------------------------------------------------


async def _exchange(url: str, stored: list, mine: Items) -> list[tuple[str, str]]:
    """Our initiator against LocalRelay; each round: (their reply, our responder's reply
    over the same set to the same message)."""
    twin = Negentropy(items_of(stored))
    ours = Negentropy(mine)
    rounds: list[tuple[str, str]] = []
    async with websockets.connect(url, max_size=None) as ws:
        for e in stored:
            await ws.send(msgspec.json.encode(["EVENT", e]).decode())
        oks = 0
        while oks < len(stored):
            msg = msgspec.json.decode(await asyncio.wait_for(ws.recv(), 30))
            if msg[0] == "OK":
                assert msg[2], msg
                oks += 1
        out: bytes | None = ours.initiate()
        verb = "NEG-OPEN"
        while out is not None:
            frame = (
                ["NEG-OPEN", "x", {}, out.hex()]
                if verb == "NEG-OPEN"
                else ["NEG-MSG", "x", out.hex()]
            )
            await ws.send(msgspec.json.encode(frame).decode())
            verb = "NEG-MSG"
            while True:
                msg = msgspec.json.decode(await asyncio.wait_for(ws.recv(), 30))
                if msg[0] in ("NEG-MSG", "NEG-ERR"):
                    break
            assert msg[0] == "NEG-MSG", msg
            rounds.append((msg[2], twin.reconcile(out).hex()))
            out, _, _ = ours.reconcile_initiator(bytes.fromhex(msg[2]))
    return rounds


async def test_nostr_sdk_answers_exactly_as_our_responder() -> None:
    # 1200 events, six per second; we hold a shifted overlap of them plus a stranger
    stored = [event(i, BASE + i // 6) for i in range(1200)]
    stored += [event(5000 + i, BASE + 7, KEY_B) for i in range(3)]  # same second, other key
    mine = items_of([*stored[5:600], *stored[601:1190], event(7777, BASE + 9)])
    with local_relay() as url:
        rounds = await _exchange(url, stored, mine)
    for theirs, ours in rounds:
        assert theirs == ours
    assert len(rounds) >= 2  # fingerprints, a split, then id lists
