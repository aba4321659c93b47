"""The read cache (relay.store.readcache): REQs for authors' newest events answered from
memory, on a real PostgreSQL, with the store's bus running as the relay runs it.

Every hidden event (deleted, expired, replaced, vanished, banned, private to a
non-reader) stays out of answers from the cache, each beside a positive twin that is
still served from it; answers equal the statements' (a second store on the same database
without a bus answers by statement only); two nodes on one database see each other's
changes through the bus; a fill that a change overtakes is dropped; the cache keeps to
its byte budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable

import asyncpg
import msgspec
import pytest
from relay_fixtures import until

from engram.nip01 import Event, pubkey_of
from engram.nip62 import KIND_GIFT_WRAP, KIND_VANISH
from relay.config import DEFAULT_PRIVATE, KIND_ENGRAM, Settings
from relay.filters import Filter
from relay.store import DEFAULT_TENANT, SaveStatus, moderation
from relay.store.pgbus import PostgresBus
from relay.store.postgres import PostgresStore
from relay.store.readcache import Need, Needs, ReadCache, plan

SK = [bytes([0x40 + i]) * 32 for i in range(5)]
PK = [pubkey_of(k) for k in SK]
STORED = SaveStatus.STORED
MakeEvent = Callable[..., Event]


class Node:
    """A PostgresStore with its bus running; `seen` holds the ids the bus delivered."""

    def __init__(self, store: PostgresStore, bus: asyncio.Task[None]) -> None:
        self.store = store
        self.bus = bus
        self.seen: set[str] = set()

    @property
    def cache(self) -> ReadCache:
        assert self.store.read_cache is not None
        return self.store.read_cache

    async def close(self) -> None:
        self.bus.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.bus
        await self.store.close()


async def open_node(url: str, settings: Settings | None = None) -> Node:
    store = await PostgresStore.open(url, settings or Settings(bus_poll_seconds=0.2))
    node: Node

    def deliver(_tenant: str, raw: bytes) -> None:
        node.seen.add(msgspec.json.decode(raw)["id"])

    node = Node(store, asyncio.create_task(PostgresBus(url, store, poll=0.2).run(deliver)))
    await until(store.read_cache_current, "the bus is current")
    return node


@pytest.fixture
async def node(database_url: str) -> AsyncIterator[Node]:
    n = await open_node(database_url)
    yield n
    await n.close()


@pytest.fixture
async def plain(node: Node, database_url: str) -> AsyncIterator[PostgresStore]:
    """A store on the same database without a bus: every REQ by statement."""
    s = await PostgresStore.open(database_url, Settings())
    yield s
    await s.close()


def raw(ev: Event) -> bytes:
    return msgspec.json.encode(ev)


async def put(store: PostgresStore, *events: Event) -> None:
    for ev in events:
        assert (await store.save(ev, raw(ev))).status is STORED, ev


async def ids(store: PostgresStore, *filters: Filter, viewer: str | None = None) -> list[str]:
    rows = await store.query(list(filters), DEFAULT_TENANT, viewer)
    return [msgspec.json.decode(r)["id"] for r in rows]


async def cached(node: Node, *filters: Filter, viewer: str | None = None) -> list[str]:
    """The answer, checked to come from the cache (a hit, and no fill for it)."""
    hits, fills = node.cache.hits, node.cache.fills
    got = await ids(node.store, *filters, viewer=viewer)
    assert (node.cache.hits, node.cache.fills) == (hits + 1, fills), "not from the cache"
    return got


def newest(author: int = 0, limit: int = 10, **kw: object) -> Filter:
    return Filter(authors=[PK[author]], limit=limit, **kw)  # type: ignore[arg-type]


# --- answers ---------------------------------------------------------------------------


async def test_answers_equal_the_statements(
    node: Node, plain: PostgresStore, make_event: MakeEvent
) -> None:
    """Every filter shape the cache answers gets, for every viewer, the rows and order
    the statements give: kinds, since/until, limits, ties, several authors and filters,
    expiring and private events."""
    now = int(time.time())
    evs = []
    for i in range(12):
        evs.append(
            make_event(SK[i % 3], kind=(1, 7, 1)[i % 3], content=str(i), created_at=100 + i // 2)
        )
    evs.append(make_event(SK[0], kind=1, tags=[["expiration", str(now + 3600)]], created_at=103))
    evs.append(make_event(SK[0], kind=4, tags=[["p", PK[1]]], content="dm", created_at=104))
    evs.append(make_event(SK[1], kind=KIND_ENGRAM, tags=[["d", "s"], ["p", PK[2]]], created_at=105))
    evs.append(make_event(SK[2], kind=0, content="{}", created_at=99))
    await put(node.store, *evs)
    shapes: list[list[Filter]] = []
    for limit in (1, 2, 3, 5, 50):
        for a in range(4):
            shapes.append([newest(a, limit)])
            shapes.append([newest(a, limit, kinds=[1])])
            shapes.append([newest(a, limit, kinds=[1, 4, KIND_ENGRAM])])
            shapes.append([newest(a, limit, since=102)])
            shapes.append([newest(a, limit, until=103, since=101)])
        shapes.append([Filter(authors=PK[:3], limit=limit)])
        shapes.append([Filter(authors=PK[:3], kinds=[1], limit=limit)])
        shapes.append([newest(0, limit), newest(1, limit, kinds=[1, 7])])
        shapes.append([newest(0, limit), newest(0, 2)])
    asked = 0
    for viewer in (None, PK[0], PK[1], PK[2], PK[3]):
        for filters in shapes:
            expected = await ids(plain, *filters, viewer=viewer)
            for _ in range(2):  # filled (or not), then from memory (or not)
                assert await ids(node.store, *filters, viewer=viewer) == expected, filters
                asked += 1
    # most are answered from memory: those whose newest rows are private to another
    # viewer than the one asking are left to the statements
    assert node.cache.hits > asked * 2 // 3


async def test_shapes_it_leaves_to_the_statements(node: Node, make_event: MakeEvent) -> None:
    """Ids, tags, search, no limit or one past the prefix bound, too many authors: never
    answered here (and nothing filled for them)."""
    await put(node.store, make_event(SK[0], tags=[["t", "x"]], content="word"))
    for f in (
        Filter(ids=["0" * 64], authors=[PK[0]], limit=5),
        Filter(authors=[PK[0]], tags={"t": ["x"]}, limit=5),
        Filter(authors=[PK[0]], search="word", limit=5),
        Filter(authors=[PK[0]]),
        Filter(authors=[PK[0]], limit=501),
        Filter(authors=[f"{i:064x}" for i in range(9)], limit=5),
        Filter(authors=[PK[0]], kinds=[], limit=5),
    ):
        assert plan(f) is None
    await ids(node.store, Filter(authors=[PK[0]], tags={"t": ["x"]}, limit=5))
    assert (node.cache.hits, node.cache.fills) == (0, 0)


# --- hidden events never come back from the cache ---------------------------------------


async def test_deleted_event_leaves_the_cache(node: Node, make_event: MakeEvent) -> None:
    gone = make_event(SK[0], content="to delete", created_at=10)
    kept = make_event(SK[0], content="kept", created_at=11)
    await put(node.store, gone, kept)
    await ids(node.store, newest(0))
    assert await cached(node, newest(0)) == [kept.id, gone.id]
    request = make_event(SK[0], kind=5, tags=[["e", gone.id]], created_at=12)
    await put(node.store, request)
    assert await ids(node.store, newest(0)) == [request.id, kept.id]
    assert await cached(node, newest(0)) == [request.id, kept.id]  # the twin, from memory


async def test_replaced_event_leaves_the_cache(node: Node, make_event: MakeEvent) -> None:
    v1 = make_event(SK[0], kind=0, content='{"name":"a"}', created_at=10)
    note = make_event(SK[0], content="note", created_at=5)
    await put(node.store, v1, note)
    await ids(node.store, newest(0))
    assert await cached(node, newest(0)) == [v1.id, note.id]
    v2 = make_event(SK[0], kind=0, content='{"name":"b"}', created_at=20)
    await put(node.store, v2)
    assert await ids(node.store, newest(0)) == [v2.id, note.id]
    assert await cached(node, newest(0)) == [v2.id, note.id]


async def test_own_write_is_read_by_the_next_req(node: Node, make_event: MakeEvent) -> None:
    old = make_event(SK[0], content="old", created_at=10)
    await put(node.store, old)
    await ids(node.store, newest(0))
    assert await cached(node, newest(0)) == [old.id]
    new = make_event(SK[0], content="new", created_at=11)
    await put(node.store, new)  # answered after its commit: the next REQ reads it
    assert await ids(node.store, newest(0)) == [new.id, old.id]


async def test_own_write_joins_the_cached_prefix(
    node: Node, plain: PostgresStore, make_event: MakeEvent
) -> None:
    """A regular event this node stores goes into its author's prefixes (where it
    falls in the store's order), so the next REQ is still answered from memory, and
    equal to the statement: newer, older than the prefix, tied, of another kind."""
    first = [make_event(SK[0], content=f"n{i}", created_at=100 + i) for i in range(3)]
    await put(node.store, *first)
    shapes = [newest(0, 2), newest(0, 10, kinds=[1]), newest(0, 10, kinds=[7])]
    for f in shapes:  # filled: the newest two of any kind, every kind 1, no kind 7
        await ids(node.store, f)
    shapes += [newest(0, 1), newest(0, 3, kinds=[1])]  # served by the same prefixes
    writes = [
        make_event(SK[0], content="newest", created_at=200),
        make_event(SK[0], content="older than the prefix of two", created_at=50),
        make_event(SK[0], content="tied", created_at=200),
        make_event(SK[0], kind=7, content="+", created_at=150),
    ]
    for ev in writes:
        fills = node.cache.fills
        await put(node.store, ev)
        for f in shapes:
            assert await cached(node, f) == await ids(plain, f), (ev.content, f)
        assert node.cache.fills == fills  # nothing read again


async def test_a_written_hidden_event_stays_hidden_in_the_cache(
    node: Node, make_event: MakeEvent
) -> None:
    """What joins a prefix is shown by the same rules as a filled row: a private kind
    to its author and recipient only, an expiring event until its expiration."""
    note = make_event(SK[0], content="public", created_at=10)
    await put(node.store, note)
    await ids(node.store, newest(0))
    ends = int(time.time()) + 2
    dm = make_event(SK[0], kind=4, tags=[["p", PK[1]]], content="secret", created_at=12)
    brief = make_event(SK[0], tags=[["expiration", str(ends)]], content="brief", created_at=11)
    await put(node.store, dm, brief)
    for party in (PK[0], PK[1]):
        assert await cached(node, newest(0), viewer=party) == [dm.id, brief.id, note.id]
    for stranger in (None, PK[2]):
        assert await cached(node, newest(0), viewer=stranger) == [brief.id, note.id]
    await until(lambda: time.time() >= ends + 1, "the expiration has passed")
    assert await cached(node, newest(0)) == [note.id]
    assert await cached(node, newest(0), viewer=PK[1]) == [dm.id, note.id]


async def test_interleaved_writes_and_reads_equal_the_statements(
    node: Node, plain: PostgresStore, make_event: MakeEvent
) -> None:
    """A fixed mix of writes (notes, reactions, private messages, events expiring later,
    replaceable profiles, deletions of earlier notes) by two authors, each followed by
    REQs of the shapes the cache answers for three viewers: every answer equals the
    statement's, while stored events keep joining the cached prefixes."""
    rng = random.Random(7)
    later = str(int(time.time()) + 3600)
    shapes = [
        newest(0, 3),
        newest(0, 10),
        newest(1, 5, kinds=[1]),
        newest(0, 5, kinds=[1, 4]),
        newest(1, 4, since=150),
        newest(0, 2, until=150),
        Filter(authors=PK[:2], limit=4),
    ]
    notes: list[list[Event]] = [[], []]
    for step in range(40):
        a, r, at = rng.randrange(2), rng.random(), 100 + rng.randrange(100)
        if r < 0.45:
            ev = make_event(SK[a], content=f"note {step}", created_at=at)
            notes[a].append(ev)
        elif r < 0.6:
            dm = f"dm {step}"
            ev = make_event(SK[a], kind=4, tags=[["p", PK[1 - a]]], content=dm, created_at=at)
        elif r < 0.7:
            ev = make_event(SK[a], kind=7, content=f"+{step}", created_at=at)
        elif r < 0.8:
            expiring = [["expiration", later]]
            ev = make_event(SK[a], tags=expiring, content=f"brief {step}", created_at=at)
        elif r < 0.9:
            ev = make_event(SK[a], kind=0, content=f'{{"name":"{step}"}}', created_at=at)
        elif notes[a]:
            gone = notes[a].pop(rng.randrange(len(notes[a])))
            ev = make_event(SK[a], kind=5, tags=[["e", gone.id]], created_at=at)
        else:
            continue
        await node.store.save(ev, raw(ev))  # an older profile than the stored one loses
        for f in shapes:
            for viewer in (None, PK[0], PK[1]):
                expected = await ids(plain, f, viewer=viewer)
                assert await ids(node.store, f, viewer=viewer) == expected, (step, f, viewer)
    assert node.cache.joined > 0 and node.cache.hits > 0


async def test_expired_event_leaves_the_cache(node: Node, make_event: MakeEvent) -> None:
    """NIP-40 is checked at every answer from memory, against the REQ's clock."""
    ends = int(time.time()) + 2
    brief = make_event(SK[0], tags=[["expiration", str(ends)]], content="brief", created_at=11)
    kept = make_event(SK[0], content="kept", created_at=10)
    await put(node.store, brief, kept)
    await ids(node.store, newest(0))
    assert await cached(node, newest(0)) == [brief.id, kept.id]
    await until(lambda: time.time() >= ends + 1, "the expiration has passed")
    assert await cached(node, newest(0)) == [kept.id]  # the same prefix, read again


async def test_private_kinds_only_to_their_parties(node: Node, make_event: MakeEvent) -> None:
    """A prefix holds private kinds (filled for their author); others never see them."""
    dm = make_event(SK[0], kind=4, tags=[["p", PK[1]]], content="secret", created_at=12)
    head = make_event(SK[0], kind=KIND_ENGRAM, tags=[["d", "x"], ["p", PK[1]]], created_at=11)
    note = make_event(SK[0], content="public", created_at=10)
    await put(node.store, dm, head, note)
    await ids(node.store, newest(0), viewer=PK[0])
    everything = [dm.id, head.id, note.id]
    assert await cached(node, newest(0), viewer=PK[0]) == everything  # the author
    assert await cached(node, newest(0), viewer=PK[1]) == everything  # the recipient
    for stranger in (None, PK[2]):
        assert await cached(node, newest(0), viewer=stranger) == [note.id]
    assert {4, KIND_ENGRAM} <= DEFAULT_PRIVATE


async def test_private_kinds_never_fill_a_strangers_limit(
    node: Node, make_event: MakeEvent
) -> None:
    """A prefix of `limit` rows holding private ones cannot answer a stranger's `limit`:
    the statement does (the older public rows), never the private ones."""
    older = make_event(SK[0], content="older", created_at=5)
    dm = make_event(SK[0], kind=4, tags=[["p", PK[1]]], content="secret", created_at=12)
    await put(node.store, older, dm)
    assert await ids(node.store, newest(0, limit=1), viewer=PK[0]) == [dm.id]
    hits = node.cache.hits
    assert await ids(node.store, newest(0, limit=1)) == [older.id]
    assert node.cache.hits == hits  # by statement


async def test_vanished_author_and_gift_wraps_leave_the_cache(
    node: Node, make_event: MakeEvent
) -> None:
    """NIP-62 deletes the author's events and gift wraps others wrote to it: every
    prefix of the tenant is dropped, and read again."""
    mine = make_event(SK[0], content="mine", created_at=10)
    wrap = make_event(SK[1], kind=KIND_GIFT_WRAP, tags=[["p", PK[0]]], created_at=11)
    theirs = make_event(SK[1], content="theirs", created_at=10)
    await put(node.store, mine, wrap, theirs)
    for f in (newest(0), newest(1)):
        await ids(node.store, f, viewer=PK[0])
    assert await cached(node, newest(1), viewer=PK[0]) == [wrap.id, theirs.id]
    assert await cached(node, newest(0), viewer=PK[0]) == [mine.id]
    vanish = make_event(SK[0], kind=KIND_VANISH, tags=[["relay", "ALL_RELAYS"]], created_at=20)
    await put(node.store, vanish)
    assert await ids(node.store, newest(1), viewer=PK[0]) == [theirs.id]
    assert await cached(node, newest(1), viewer=PK[0]) == [theirs.id]
    assert await ids(node.store, newest(0), viewer=PK[0]) == [vanish.id]


async def test_banned_author_leaves_the_cache(node: Node, make_event: MakeEvent) -> None:
    """A ban deletes rows no event announces: any administrative action empties it."""
    banned = make_event(SK[0], content="spam", created_at=10)
    kept = make_event(SK[1], content="fine", created_at=10)
    await put(node.store, banned, kept)
    for a in (0, 1):
        await ids(node.store, newest(a))
        assert await cached(node, newest(a)) != []
    n = await node.store.run_admin(
        lambda conn: moderation.ban_pubkey(conn, conn, DEFAULT_TENANT, PK[0], "spam")
    )
    assert n == 1
    assert await ids(node.store, newest(0)) == []
    assert await ids(node.store, newest(1)) == [kept.id]
    assert await cached(node, newest(1)) == [kept.id]


async def test_prefix_read_again_after_max_age(database_url: str, make_event: MakeEvent) -> None:
    """What no event announces (rows pruned by retention) is read again after
    `read_cache_seconds`."""
    n = await open_node(database_url, Settings(bus_poll_seconds=0.2, read_cache_seconds=0.0))
    try:
        await put(n.store, make_event(SK[0], content="x"))
        await ids(n.store, newest(0))
        fills = n.cache.fills
        await asyncio.sleep(0.01)
        await ids(n.store, newest(0))
        assert n.cache.fills == fills + 1
    finally:
        await n.close()


# --- when the cache is not used ---------------------------------------------------------


async def test_no_bus_no_cache(store: PostgresStore, make_event: MakeEvent) -> None:
    """A store whose bus does not run (nothing tells it of other nodes' writes) answers
    by statement only; and `read_cache_bytes = 0` turns the cache off."""
    await put(store, make_event(SK[0]))
    for _ in range(2):
        await ids(store, newest(0))
    assert store.read_cache is not None and (store.read_cache.hits, len(store.read_cache)) == (
        0,
        0,
    )
    assert not store.read_cache_current()


async def test_cache_off(database_url: str) -> None:
    s = await PostgresStore.open(database_url, Settings(read_cache_bytes=0))
    try:
        assert s.read_cache is None and not s.read_cache_current()
    finally:
        await s.close()


# --- two nodes on one database ----------------------------------------------------------


async def test_other_nodes_changes_reach_the_cache_through_the_bus(
    database_url: str, make_event: MakeEvent
) -> None:
    a, b = await open_node(database_url), await open_node(database_url)
    try:
        gone = make_event(SK[0], content="to delete", created_at=10)
        kept = make_event(SK[1], content="twin", created_at=10)
        await put(a.store, gone, kept)
        for author in (0, 1):
            await ids(a.store, newest(author))
        assert await cached(a, newest(0)) == [gone.id]
        request = make_event(SK[0], kind=5, tags=[["e", gone.id]], created_at=11)
        note = make_event(SK[0], content="new on b", created_at=12)
        await put(b.store, request, note)
        await until(lambda: {request.id, note.id} <= a.seen, "node a's bus delivered them")
        assert await ids(a.store, newest(0)) == [note.id, request.id]
        assert await cached(a, newest(0)) == [note.id, request.id]
        assert await cached(a, newest(1)) == [kept.id]  # untouched: still in memory
    finally:
        await a.close()
        await b.close()


async def test_no_cache_while_the_tail_is_held_back(
    database_url: str, make_event: MakeEvent
) -> None:
    """A running transaction holds other nodes' commits back from the tail: meanwhile
    REQs read the database, and see another node's write at once."""
    a, b = await open_node(database_url), await open_node(database_url)
    blocker = await asyncpg.connect(database_url)
    try:
        old = make_event(SK[0], content="old", created_at=10)
        await put(a.store, old)
        await ids(a.store, newest(0))
        assert await cached(a, newest(0)) == [old.id]
        tx = blocker.transaction()
        await tx.start()
        await blocker.fetchval("SELECT pg_current_xact_id()")  # holds the snapshot's xmin
        new = make_event(SK[0], content="new on b", created_at=11)
        await put(b.store, new)
        await until(lambda: a.store.bus_held_back, "node a's tail is held back")
        assert not a.store.read_cache_current()
        assert new.id not in a.seen
        hits = a.cache.hits
        assert await ids(a.store, newest(0)) == [new.id, old.id]
        assert a.cache.hits == hits
        await tx.rollback()
        await until(lambda: new.id in a.seen, "node a's bus delivered the write")
        await until(a.store.read_cache_current, "node a's tail is current again")
        await ids(a.store, newest(0))
        assert await cached(a, newest(0)) == [new.id, old.id]
    finally:
        await blocker.close()
        await a.close()
        await b.close()


# --- the cache itself ---------------------------------------------------------------------


def row(i: int, size: int = 100) -> tuple[bytes, int, bytes, int, None, None]:
    return (b"x" * size, 1000 - i, i.to_bytes(32, "big"), 1, None, None)


def test_a_fill_overtaken_by_a_change_is_dropped() -> None:
    """A change seen while a fill's statement runs (its rows may predate it) wins: the
    rows are not installed, whether the change names the author, the tenant or all."""
    author = bytes(32)
    changes: list[Callable[[ReadCache], None]] = [
        lambda c: c.changed("t", author, 1),
        lambda c: c.changed("t", bytes(31) + b"\x01", KIND_VANISH),  # someone vanished
        lambda c: c.forget_tenant("t"),
        lambda c: c.clear(),
    ]
    for change in changes:
        cache = ReadCache(1 << 20, 60.0)
        fill = cache.begin("t", Need((author, None, 5)))
        change(cache)
        cache.put(fill, [row(0)], 0.0)
        assert len(cache) == 0
    cache = ReadCache(1 << 20, 60.0)  # the positive twin: another author's change
    fill = cache.begin("t", Need((author, None, 5)))
    cache.changed("t", bytes(31) + b"\x02", 1)
    cache.changed("u", author, 1)  # the same key in another tenant
    cache.put(fill, [row(0)], 0.0)
    assert len(cache) == 1


def test_a_fill_overtaken_by_a_stored_event_is_dropped() -> None:
    """A fill whose statement may have run before an event of its author committed is
    not installed (the event joins only prefixes already there); another author's stored
    event leaves it be."""
    author = bytes(32)
    cache = ReadCache(1 << 20, 60.0)
    fill = cache.begin("t", Need((author, None, 5)))
    cache.stored("t", author, row(9))
    cache.put(fill, [row(0)], 0.0)
    assert len(cache) == 0
    fill = cache.begin("t", Need((author, None, 5)))  # the positive twin
    cache.stored("t", bytes(31) + b"\x02", row(9))
    cache.put(fill, [row(0)], 0.0)
    assert len(cache) == 1


def test_bounded_by_its_budget() -> None:
    """Least recently used authors go first; the size never passes the budget; one
    author's prefix may not take more than a quarter of it."""
    cache = ReadCache(20_000, 60.0)
    f = Filter(authors=["00" * 32], limit=5)
    for i in range(40):
        author = i.to_bytes(32, "big")
        cache.put(cache.begin("t", Need((author, None, 5))), [row(j) for j in range(5)], 0.0)
        assert cache.size <= cache.budget
        if i >= 1:  # the first author is read after each fill: it stays
            first = msgspec.structs.replace(f, authors=[bytes(32).hex()])
            p = plan(first)
            assert p is not None
            got = cache.answer([p], [first], "t", None, 0, 0.0, frozenset())
            assert got is not None and not isinstance(got, Needs) and len(got) == 5
    assert 0 < len(cache) < 40
    big = ReadCache(4_000, 60.0)
    big.put(big.begin("t", Need((bytes(32), None, 5))), [row(j, 400) for j in range(5)], 0.0)
    assert len(big) == 0 and big.size == 0


def test_prefix_older_than_max_age_is_read_again() -> None:
    """After half to all of max_age, by the author's key: authors filled together are
    not all read again at once."""
    cache = ReadCache(1 << 20, 10.0)
    for first, deadline in ((0x00, 105.0), (0xFF, 110.0)):
        author = bytes([first]) + bytes(31)
        f = Filter(authors=[author.hex()], limit=5)
        p = plan(f)
        assert p is not None
        cache.put(cache.begin("t", Need((author, None, 5))), [row(0)], 100.0)
        got = cache.answer([p], [f], "t", None, 0, deadline - 0.01, frozenset())
        assert got == [b"x" * 100]
        assert isinstance(cache.answer([p], [f], "t", None, 0, deadline + 0.01, frozenset()), Needs)


def test_a_forgotten_tenant_is_read_again_and_only_it() -> None:
    """A request to vanish forgets the whole tenant at once (its prefixes answer nothing
    until read again); another tenant's still answer."""
    cache = ReadCache(1 << 20, 60.0)
    f = Filter(authors=["00" * 32], limit=5)
    p = plan(f)
    assert p is not None
    for tenant in ("t", "u"):
        cache.put(cache.begin(tenant, Need((bytes(32), None, 5))), [row(0)], 0.0)
    cache.changed("t", bytes(31) + b"\x01", KIND_VANISH)
    assert isinstance(cache.answer([p], [f], "t", None, 0, 0.0, frozenset()), Needs)
    assert cache.answer([p], [f], "u", None, 0, 0.0, frozenset()) == [b"x" * 100]
    cache.put(cache.begin("t", Need((bytes(32), None, 5))), [row(1)], 0.0)  # read again
    assert cache.answer([p], [f], "t", None, 0, 0.0, frozenset()) == [b"x" * 100]


def test_a_prefix_past_half_its_time_is_read_again_while_it_answers() -> None:
    """Past its refresh time a prefix still answers and is handed, once, to be read again
    in the background; past its end it answers nothing."""
    cache = ReadCache(1 << 20, 10.0)
    f = Filter(authors=["00" * 32], limit=5)
    p = plan(f)
    assert p is not None
    cache.put(cache.begin("t", Need((bytes(32), None, 5))), [row(0)], 100.0)  # 100 + 2.5 + 2.5
    assert cache.answer([p], [f], "t", None, 0, 102.0, frozenset()) == [b"x" * 100]
    assert cache.due == []
    for _ in range(2):
        assert cache.answer([p], [f], "t", None, 0, 103.0, frozenset()) == [b"x" * 100]
    assert [d[:2] for d in cache.due] == [("t", Need((bytes(32), None, 5)))]
    cache.later(cache.due.pop()[2])  # not read now: handed on again by the next answer
    assert cache.answer([p], [f], "t", None, 0, 103.0, frozenset()) == [b"x" * 100]
    assert len(cache.due) == 1
    assert isinstance(cache.answer([p], [f], "t", None, 0, 105.5, frozenset()), Needs)


async def test_hot_prefixes_are_read_again_in_the_background(
    node: Node, make_event: MakeEvent
) -> None:
    """A prefix read past its refresh time answers from memory and is read again behind
    the REQ, as a fill like any other (its refresh time is set back here, not waited
    for: the clock is not part of the test)."""
    old = make_event(SK[0], content="old", created_at=10)
    await put(node.store, old)
    await ids(node.store, newest(0))
    fills = node.cache.fills
    prefix = node.cache._authors[(DEFAULT_TENANT, bytes.fromhex(PK[0]))][None]
    prefix.refresh = 0.0
    assert await cached(node, newest(0)) == [old.id]  # still answers, from memory...
    await until(lambda: node.cache.fills == fills + 1, "the background read")  # ...read again
    assert node.cache._authors[(DEFAULT_TENANT, bytes.fromhex(PK[0]))][None] is not prefix
    assert await cached(node, newest(0)) == [old.id]
