"""The store contract: one suite that every store passes, the same way.

Parametrised over the reference (relay.store.memory.MemoryStore), PostgresStore and
StoreRouter (the relay's own), the last two on a real PostgreSQL, one database for the
module. Each test sees the store through its own tenants (`Scoped`), so the tests share
the stores without seeing each other's events. What only PostgreSQL can show (commits,
races between writers, migrations, plans, outages) is in test_store_postgres.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable

import msgspec
import pytest
from relay_fixtures import until

from engram.nip01 import Event, pubkey_of
from engram.nip62 import KIND_GIFT_WRAP, KIND_VANISH
from engram.replace import NEWER_STORED, TIE_LOST, is_superseded
from relay.config import DEFAULT_PRIVATE, KIND_ENGRAM, Settings
from relay.filters import Filter
from relay.store import DEFAULT_TENANT, EventStore, Saved, SaveResult, SaveStatus
from relay.store.memory import MemoryStore
from relay.store.postgres import PostgresStore
from relay.store.router import StoreRouter

pytestmark = pytest.mark.xdist_group("store-contract")  # one worker: one database

SK = [bytes([i + 1]) * 32 for i in range(4)]
PK = [pubkey_of(k) for k in SK]
STORED, DUPLICATE, STALE, ERROR, BLOCKED = (
    SaveStatus.STORED,
    SaveStatus.DUPLICATE,
    SaveStatus.STALE,
    SaveStatus.ERROR,
    SaveStatus.BLOCKED,
)

MakeEvent = Callable[..., Event]


class Scoped:
    """A store seen through one test's own tenants: its tenant `t` is `scope/t` below."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.scope = uuid.uuid4().hex

    def _t(self, tenant: str) -> str:
        return f"{self.scope}/{tenant}"

    def enqueue(self, event: Event, raw: bytes, tenant: str, done: Saved) -> None:
        self.store.enqueue(event, raw, self._t(tenant), done)

    def submit(
        self, event: Event, raw: bytes, tenant: str = DEFAULT_TENANT
    ) -> asyncio.Future[SaveResult]:
        return self.store.submit(event, raw, self._t(tenant))

    async def save(self, event: Event, raw: bytes, tenant: str = DEFAULT_TENANT) -> SaveResult:
        return await self.store.save(event, raw, self._t(tenant))

    async def query(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes]:
        return await self.store.query(filters, self._t(tenant), viewer, private)

    async def count(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> int:
        return await self.store.count(filters, self._t(tenant), viewer, private)

    async def negentropy_items(
        self,
        f: Filter,
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        limit: int = 500_001,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> tuple[list[int], bytes]:
        return await self.store.negentropy_items(f, self._t(tenant), viewer, limit, private)

    async def close(self) -> None:  # the module's store outlives the test
        return None


@pytest.fixture(scope="module", params=["memory", "postgres", "router"])
async def backend(
    request: pytest.FixtureRequest, module_database_url: str
) -> AsyncIterator[EventStore]:
    """Each store once per module; Postgres and the router share one database. The
    router runs its bus, as the relay does: its REQs for authors' newest events are
    answered from its read cache (relay.store.readcache), PostgresStore's all by
    statements (no bus, no cache)."""
    store: EventStore
    bus = None
    if request.param == "memory":
        store = MemoryStore()
    elif request.param == "postgres":
        store = await PostgresStore.open(module_database_url, Settings())
    else:
        router = await StoreRouter.open(module_database_url, Settings())
        bus = asyncio.create_task(router.bus.run(lambda _tenant, _raw: None))
        await until(router.control.read_cache_current, "the router's bus is current")
        store = router
    yield store
    if bus is not None:
        bus.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await bus
    await store.close()


@pytest.fixture
def store(backend: EventStore) -> EventStore:
    """The module's store of this parameter, through tenants of the test's own."""
    return Scoped(backend)


def raw(ev: Event) -> bytes:
    return msgspec.json.encode(ev)


def ids_of(raws: list[bytes]) -> list[str]:
    return [msgspec.json.decode(r)["id"] for r in raws]


def tenant() -> str:
    return "t-" + uuid.uuid4().hex


async def put(store: EventStore, ev: Event, tenant: str = DEFAULT_TENANT) -> SaveStatus:
    return (await store.save(ev, raw(ev), tenant)).status


async def q(store: EventStore, *filters: Filter, **kw: object) -> list[str]:
    return ids_of(await store.query(list(filters), **kw))  # type: ignore[arg-type]


# --- saving (moved from test_store_postgres.py) -----------------------------------------


async def test_save_then_duplicate(store: EventStore, make_event: MakeEvent) -> None:
    ev = make_event(SK[0], content="hello")
    assert (await store.save(ev, raw(ev))).status is STORED
    again = await store.save(ev, raw(ev))
    assert again.status is DUPLICATE
    assert again.message.startswith("duplicate:")
    assert await store.query([Filter(ids=[ev.id], limit=10)]) == [raw(ev)]


async def test_raw_served_verbatim(store: EventStore, make_event: MakeEvent) -> None:
    ev = make_event(SK[0], content="é 😀 \u2028")
    pretty = (
        b'{ "sig": "%s",\n "id": "%s", "pubkey": "%s", "created_at": %d, "kind": 1,\n'
        % (
            ev.sig.encode(),
            ev.id.encode(),
            ev.pubkey.encode(),
            ev.created_at,
        )
        + b'"tags": [], "content": "\\u00e9 \xf0\x9f\x98\x80 \\u2028" }'
    )
    assert (await store.save(ev, pretty)).status is STORED
    assert await store.query([Filter(limit=5)]) == [pretty]


async def test_regular_events_all_kept(store: EventStore, make_event: MakeEvent) -> None:
    evs = [make_event(SK[0], kind=1, content=f"n{i}", created_at=100) for i in range(5)]
    assert [await put(store, e) for e in evs] == [STORED] * 5
    assert sorted(await q(store, Filter(limit=100))) == sorted(e.id for e in evs)


async def test_in_batch_duplicates(store: EventStore, make_event: MakeEvent) -> None:
    ev = make_event(SK[0], content="twice")
    rep = make_event(SK[0], kind=0, content="{}", created_at=5)
    res = await asyncio.gather(*(store.save(e, raw(e)) for e in (ev, ev, rep, rep, rep)))
    assert sorted(r.status.value for r in res[:2]) == ["duplicate", "stored"]
    assert sorted(r.status.value for r in res[2:]) == ["duplicate", "duplicate", "stored"]


async def test_ephemeral_refused(store: EventStore, make_event: MakeEvent) -> None:
    ev = make_event(SK[0], kind=20001)
    res = await store.save(ev, raw(ev))
    assert res.status is ERROR and "ephemeral" in res.message
    ok = make_event(SK[0], kind=19999)  # positive control: last replaceable kind
    assert await put(store, ok) is STORED
    assert await q(store, Filter(limit=10)) == [ok.id]


async def test_malformed_event_refused(store: EventStore, make_event: MakeEvent) -> None:
    ev = make_event(SK[0])
    bad = msgspec.structs.replace(ev, id=ev.id.upper())
    res = await store.save(bad, raw(bad))
    assert res.status is ERROR and res.message.startswith("invalid:")
    assert await put(store, ev) is STORED


@pytest.mark.parametrize("kind", [0, 3, 10002])
async def test_replaceable(store: EventStore, make_event: MakeEvent, kind: int) -> None:
    old = make_event(SK[0], kind=kind, content="old", created_at=100)
    new = make_event(SK[0], kind=kind, content="new", created_at=200)
    other = make_event(SK[1], kind=kind, content="other author", created_at=50)
    assert await put(store, old) is STORED
    assert await put(store, new) is STORED
    assert await put(store, old) is STALE  # re-sent after being replaced
    assert await put(store, new) is DUPLICATE  # the current head itself
    assert await put(store, other) is STORED
    assert await q(store, Filter(kinds=[kind], limit=10)) == [new.id, other.id]
    older = make_event(SK[0], kind=kind, content="older", created_at=10)
    res = await store.save(older, raw(older))
    assert res.status is STALE and res.message


async def test_tie_lowest_id_wins(store: EventStore, make_event: MakeEvent) -> None:
    a = make_event(SK[0], kind=10000, content="a", created_at=500)
    b = make_event(SK[0], kind=10000, content="b", created_at=500)
    low, high = sorted((a, b), key=lambda e: e.id)
    t1, t2 = tenant(), tenant()
    assert await put(store, high, t1) is STORED
    assert await put(store, low, t1) is STORED  # same created_at, lower id: replaces
    assert await put(store, low, t2) is STORED
    assert await put(store, high, t2) is STALE
    for t in (t1, t2):
        assert await q(store, Filter(limit=10), tenant=t) == [low.id]
    # the OK says which case it is (engram.replace): a tie lost, not a newer version
    lost = await store.save(high, raw(high), t1)
    assert lost.message == TIE_LOST and is_superseded(lost.message)
    older = make_event(SK[0], kind=10000, content="c", created_at=499)
    assert (await store.save(older, raw(older), t1)).message == NEWER_STORED
    # in one batch as well: the loser learns it from its winner
    t3 = tenant()
    both = await asyncio.gather(*(store.save(e, raw(e), t3) for e in (high, low, older)))
    assert [r.message for r in both] == [TIE_LOST, "", NEWER_STORED]


async def test_addressable(store: EventStore, make_event: MakeEvent) -> None:
    k = 30023
    a1 = make_event(SK[0], kind=k, tags=[["d", "a"]], content="a1", created_at=1)
    a2 = make_event(SK[0], kind=k, tags=[["d", "a"], ["d", "b"]], content="a2", created_at=2)
    b1 = make_event(SK[0], kind=k, tags=[["d", "b"]], content="b1", created_at=1)
    none1 = make_event(SK[0], kind=k, content="no d", created_at=1)
    empty2 = make_event(SK[0], kind=k, tags=[["d"]], content="bare d tag", created_at=2)
    blank3 = make_event(SK[0], kind=k, tags=[["d", ""]], content="empty d", created_at=3)
    for ev in (a1, a2, b1, none1, empty2, blank3):
        assert await put(store, ev) is STORED  # each is newer than its address's head
    # a2's address is its FIRST d tag ("a"); no d tag, ["d"] and ["d", ""] are all "".
    assert sorted(await q(store, Filter(kinds=[k], limit=10))) == sorted([a2.id, b1.id, blank3.id])
    assert await q(store, Filter(kinds=[k], tags={"d": ["a"]}, limit=10)) == [a2.id]


async def test_huge_d_tag_replaces(store: EventStore, make_event: MakeEvent) -> None:
    d = "x" * 100_000
    old = make_event(SK[0], kind=30000, tags=[["d", d]], created_at=1)
    new = make_event(SK[0], kind=30000, tags=[["d", d]], created_at=2)
    near = make_event(SK[0], kind=30000, tags=[["d", d[:-1]]], created_at=1)
    assert [await put(store, e) for e in (old, new, near, old)] == [STORED] * 3 + [STALE]
    assert await q(store, Filter(tags={"d": [d]}, limit=10)) == [new.id]


async def test_nul_characters_stored_verbatim(store: EventStore, make_event: MakeEvent) -> None:
    ev = make_event(SK[0], tags=[["t", "a\x00b"], ["d", "\x00"]], content="nul\x00here")
    assert await put(store, ev) is STORED
    assert await store.query([Filter(tags={"t": ["a\x00b"]}, limit=5)]) == [raw(ev)]
    assert await store.query([Filter(tags={"t": ["ab", "a"]}, limit=5)]) == []
    addr = make_event(SK[0], kind=30001, tags=[["d", "\x00"]], content="\x00")
    assert await put(store, addr) is STORED
    assert await q(store, Filter(kinds=[30001], tags={"d": ["\x00"]}, limit=5)) == [addr.id]


@pytest.fixture
async def corpus(store: EventStore, make_event: MakeEvent) -> dict[str, Event]:
    evs = {
        "a1": make_event(SK[0], kind=1, tags=[["e", "x" * 64], ["p", PK[1]]], created_at=10),
        "a2": make_event(SK[0], kind=7, tags=[["e", "y" * 64]], created_at=20),
        "b1": make_event(SK[1], kind=1, tags=[["t", "nostr"], ["t", "pg"]], created_at=20),
        "b2": make_event(SK[1], kind=30000, tags=[["d", "list"], ["p", PK[0]]], created_at=30),
        "c1": make_event(SK[2], kind=1, tags=[["E", "x" * 64], ["ee", "x" * 64]], created_at=40),
    }
    for ev in evs.values():
        assert await put(store, ev) is STORED
    return evs


async def test_filter_fields(store: EventStore, corpus: dict[str, Event]) -> None:
    c = {k: e.id for k, e in corpus.items()}

    async def got(**kw: object) -> set[str]:
        return {k for k, v in c.items() if v in await q(store, Filter(limit=100, **kw))}  # type: ignore[arg-type]

    assert await got() == set(c)
    assert await got(ids=[c["a1"], c["b2"], "0" * 64]) == {"a1", "b2"}
    assert await got(authors=[PK[1]]) == {"b1", "b2"}
    assert await got(kinds=[1]) == {"a1", "b1", "c1"}
    assert await got(kinds=[1, 7], authors=[PK[0]]) == {"a1", "a2"}
    assert await got(tags={"e": ["x" * 64, "y" * 64]}) == {"a1", "a2"}  # any value
    assert await got(tags={"E": ["x" * 64]}) == {"c1"}  # case matters; "ee" is not "e"
    assert await got(tags={"p": [PK[0]]}) == {"b2"}
    assert await got(tags={"d": ["list"]}) == {"b2"}
    assert await got(tags={"t": ["pg"], "e": ["x" * 64]}) == set()  # fields are ANDed
    assert await got(tags={"t": ["pg"]}, authors=[PK[1]]) == {"b1"}
    assert await got(since=20) == {"a2", "b1", "b2", "c1"}  # inclusive
    assert await got(until=20) == {"a1", "a2", "b1"}  # inclusive
    assert await got(since=20, until=20) == {"a2", "b1"}
    assert await got(since=21, until=20) == set()
    for empty in ({"ids": []}, {"authors": []}, {"kinds": []}, {"tags": {"e": []}}):
        assert await got(**empty) == set()  # an empty list matches nothing
    assert await got(ids=["not hex"]) == set()


async def test_order_limit_and_union(store: EventStore, corpus: dict[str, Event]) -> None:
    c = {k: e.id for k, e in corpus.items()}
    tie = sorted([c["a2"], c["b1"]])  # both created_at 20: id ascending
    everything = [c["c1"], c["b2"], *tie, c["a1"]]
    assert await q(store, Filter(limit=100)) == everything
    assert await q(store, Filter(limit=3)) == everything[:3]
    assert await q(store, Filter(limit=0)) == []
    # Each filter's limit applies to that filter; the union is de-duplicated and ordered.
    assert await q(store, Filter(kinds=[1], limit=1), Filter(authors=[PK[0]], limit=5)) == [
        c["c1"],
        c["a2"],
        c["a1"],
    ]
    assert await q(store, Filter(kinds=[1], limit=5), Filter(kinds=[1], limit=5)) == [
        c["c1"],
        *[i for i in tie if i == c["b1"]],
        c["a1"],
    ]
    assert await q(store, Filter(kinds=[], limit=5), Filter(ids=[c["b2"]], limit=5)) == [c["b2"]]
    assert await store.query([]) == []


async def test_count(store: EventStore, corpus: dict[str, Event]) -> None:
    assert await store.count([Filter(limit=1)]) == 5  # NIP-45: limit is ignored
    assert await store.count([Filter(kinds=[1]), Filter(authors=[PK[0]])]) == 4
    assert await store.count([Filter(kinds=[])]) == 0
    assert await store.count([Filter()], tenant="elsewhere") == 0


async def test_concurrent_reads_share_statements(
    store: EventStore, corpus: dict[str, Event], make_event: MakeEvent
) -> None:
    """REQs and COUNTs issued together (batched into shared statements by readbatch) get
    exactly what each gets alone, each in its own order and limit, under the read gate."""
    engram = make_event(
        SK[3], kind=KIND_ENGRAM, tags=[["d", "slug"], ["p", PK[3]]], content="x", created_at=50
    )
    assert await put(store, engram) is STORED
    shapes: list[tuple[list[Filter], str | None]] = []
    for limit in (1, 2, 5):
        for pk in (*PK, "0" * 64):
            shapes.append(([Filter(authors=[pk], limit=limit)], None))
            shapes.append(([Filter(authors=[pk], kinds=[1], until=40, limit=limit)], None))
        shapes.append(([Filter(authors=PK[:2], limit=limit)], None))
        shapes.append(([Filter(authors=[*PK, "0" * 64], kinds=[1, 30000], limit=limit)], None))
        many = [*PK, *(f"{i:064x}" for i in range(40))]  # beyond MERGE_AUTHORS_MAX: LATERAL
        shapes.append(([Filter(authors=many, since=15, limit=limit)], None))
        shapes.append(([Filter(tags={"e": ["x" * 64]}, limit=limit)], None))
        shapes.append(([Filter(tags={"t": ["pg"]}, since=20, limit=limit)], None))
    head = Filter(kinds=[KIND_ENGRAM], authors=[PK[3]], tags={"p": [PK[3]], "d": ["slug"]})
    for viewer in (PK[3], PK[0], None):
        shapes.append(([head], viewer))
    alone = [await store.query(fs, viewer=v) for fs, v in shapes]
    counts_alone = [await store.count(fs, viewer=v) for fs, v in shapes]
    for _ in range(3):
        together = await asyncio.gather(*(store.query(fs, viewer=v) for fs, v in shapes))
        assert list(together) == alone
        counts = await asyncio.gather(*(store.count(fs, viewer=v) for fs, v in shapes))
        assert list(counts) == counts_alone
    assert alone[-3] == [raw(engram)] and alone[-2] == [] and alone[-1] == []


async def test_tenant_isolation(store: EventStore, make_event: MakeEvent) -> None:
    ev = make_event(SK[0], kind=10002, content="shared", created_at=5)
    newer = make_event(SK[0], kind=10002, content="newer", created_at=6)
    assert await put(store, ev, "alpha") is STORED
    assert await put(store, ev, "beta") is STORED  # same id, other tenant: independent
    assert await put(store, newer, "alpha") is STORED  # replaces in alpha only
    assert await q(store, Filter(limit=10), tenant="alpha") == [newer.id]
    assert await q(store, Filter(limit=10), tenant="beta") == [ev.id]
    assert await q(store, Filter(ids=[newer.id], limit=10), tenant="beta") == []
    assert await q(store, Filter(limit=10)) == []  # the default tenant saw nothing
    assert await store.count([Filter()], tenant="beta") == 1


async def test_engram_read_gate(store: EventStore, make_event: MakeEvent) -> None:
    author, owner, stranger = PK[0], PK[1], PK[2]
    mem = make_event(
        SK[0], kind=KIND_ENGRAM, tags=[["d", "h"], ["p", owner]], content="c", created_at=9
    )
    public = [make_event(SK[0], kind=1, content=str(i), created_at=i) for i in range(3)]
    for ev in (mem, *public):
        assert await put(store, ev) is STORED
    newest_public = [e.id for e in sorted(public, key=lambda e: -e.created_at)]
    for viewer in (None, stranger, "not-a-key"):
        # The limit counts visible rows: two public events, not the hidden engram + one.
        assert await q(store, Filter(limit=2), viewer=viewer) == newest_public[:2]
        assert await q(store, Filter(kinds=[KIND_ENGRAM], limit=5), viewer=viewer) == []
        assert await q(store, Filter(ids=[mem.id], limit=5), viewer=viewer) == []
        assert await store.count([Filter()], viewer=viewer) == 3
    for viewer in (author, owner):
        assert await q(store, Filter(limit=2), viewer=viewer) == [mem.id, newest_public[0]]
        assert await q(store, Filter(tags={"p": [owner]}, limit=5), viewer=viewer) == [mem.id]
        assert await store.count([Filter()], viewer=viewer) == 4


async def test_huge_tag_value(store: EventStore, make_event: MakeEvent) -> None:
    big = "v" * 100_000
    ev = make_event(SK[0], tags=[["t", big], ["e", big + "w"]], content="big")
    assert await put(store, ev) is STORED
    assert await q(store, Filter(tags={"t": [big]}, limit=5)) == [ev.id]
    assert await q(store, Filter(tags={"e": [big + "w"]}, limit=5)) == [ev.id]
    assert await q(store, Filter(tags={"t": [big[:-1], big + "w", "v" * 200]}, limit=5)) == []
    edge = make_event(SK[1], tags=[["t", "é" * 100], ["t", "\x01x"]])  # 200 bytes; marker
    assert await put(store, edge) is STORED
    assert await q(store, Filter(tags={"t": ["é" * 100]}, limit=5)) == [edge.id]
    assert await q(store, Filter(tags={"t": ["\x01x"]}, limit=5)) == [edge.id]


# --- what only the contract checks on every store -------------------------------------


async def test_deletion_by_id_and_by_address(store: EventStore, make_event: MakeEvent) -> None:
    """NIP-09: the author's own events go and never come back (an `a` deletion covers
    versions up to its created_at); another author's are untouched."""
    note = make_event(SK[0], content="to delete", created_at=10)
    kept = make_event(SK[0], content="kept", created_at=11)
    other = make_event(SK[1], content="not theirs", created_at=12)
    v1 = make_event(SK[0], kind=30023, tags=[["d", "post"]], content="v1", created_at=20)
    for ev in (note, kept, other, v1):
        assert await put(store, ev) is STORED
    request = make_event(
        SK[0],
        kind=5,
        tags=[["e", note.id], ["e", other.id], ["a", f"30023:{PK[0]}:post"]],
        created_at=30,
    )
    assert await put(store, request) is STORED
    assert await q(store, Filter(limit=10)) == [request.id, other.id, kept.id]
    assert await put(store, note) is BLOCKED  # re-sent: refused for good
    assert await put(store, kept) is DUPLICATE  # positive twin: not named, still stored
    older = make_event(SK[0], kind=30023, tags=[["d", "post"]], content="v0", created_at=25)
    newer = make_event(SK[0], kind=30023, tags=[["d", "post"]], content="v2", created_at=31)
    assert await put(store, older) is BLOCKED  # before the request: covered
    assert await put(store, newer) is STORED  # after it: a new version
    assert await q(store, Filter(kinds=[30023], limit=10)) == [newer.id]
    assert await store.count([Filter(authors=[PK[0]])]) == 3  # kept, request, newer


async def test_request_to_vanish(store: EventStore, make_event: MakeEvent) -> None:
    """NIP-62: the author's events up to the request go, and gift wraps to them; later
    events, and everybody else's, stay."""
    mine = make_event(SK[0], content="mine", created_at=10)
    wrap = make_event(SK[1], kind=KIND_GIFT_WRAP, tags=[["p", PK[0]]], created_at=11)
    wrap_other = make_event(SK[1], kind=KIND_GIFT_WRAP, tags=[["p", PK[2]]], created_at=11)
    theirs = make_event(SK[1], content="theirs", created_at=12)
    for ev in (mine, wrap, wrap_other, theirs):
        assert await put(store, ev) is STORED
    vanish = make_event(SK[0], kind=KIND_VANISH, tags=[["relay", "ALL_RELAYS"]], created_at=20)
    assert await put(store, vanish) is STORED
    everyone = [Filter(limit=10)]
    assert ids_of(await store.query(everyone, viewer=PK[2])) == [
        vanish.id,
        theirs.id,
        wrap_other.id,
    ]
    assert await put(store, mine) is BLOCKED
    assert await put(store, wrap) is BLOCKED
    later = make_event(SK[0], content="after", created_at=21)
    assert await put(store, later) is STORED


async def test_expired_events_are_not_served(store: EventStore, make_event: MakeEvent) -> None:
    """NIP-40: stored, but never served, counted or reconciled once expired."""
    now = int(time.time())
    gone = make_event(SK[0], tags=[["expiration", str(now - 5)]], created_at=now - 60)
    live = make_event(SK[0], tags=[["expiration", str(now + 3600)]], created_at=now - 30)
    for ev in (gone, live):
        assert await put(store, ev) is STORED
    assert await q(store, Filter(limit=10)) == [live.id]
    assert await store.count([Filter()]) == 1
    stamps, ids = await store.negentropy_items(Filter())
    assert (stamps, ids) == ([live.created_at], bytes.fromhex(live.id))


async def test_negentropy_items(store: EventStore, make_event: MakeEvent) -> None:
    """NIP-77's set: (created_at, id) ascending, at most `limit`, the filter's own limit
    ignored, under the read gate."""
    notes = [make_event(SK[i % 2], content=str(i), created_at=100 + i // 2) for i in range(6)]
    mem = make_event(SK[2], kind=KIND_ENGRAM, tags=[["d", "x"], ["p", PK[3]]], created_at=99)
    for ev in (*notes, mem):
        assert await put(store, ev) is STORED
    order = sorted(notes, key=lambda e: (e.created_at, e.id))
    stamps, ids = await store.negentropy_items(Filter(limit=1))
    assert stamps == [e.created_at for e in order]
    assert ids == b"".join(bytes.fromhex(e.id) for e in order)
    stamps, ids = await store.negentropy_items(Filter(), limit=4)
    assert ids == b"".join(bytes.fromhex(e.id) for e in order[:4])
    stamps, ids = await store.negentropy_items(Filter(authors=[PK[1]]))
    assert ids == b"".join(bytes.fromhex(e.id) for e in order if e.pubkey == PK[1])
    for viewer, seen in ((PK[3], True), (PK[2], True), (PK[0], False), (None, False)):
        stamps, ids = await store.negentropy_items(Filter(kinds=[KIND_ENGRAM]), viewer=viewer)
        assert ids == (bytes.fromhex(mem.id) if seen else b""), viewer


async def test_search(store: EventStore, make_event: MakeEvent) -> None:
    """NIP-50 on plain words: every word of the query, any case; engrams never."""
    a = make_event(SK[0], content="The Lighthouse keeper", created_at=3)
    b = make_event(SK[1], content="a lighthouse at night", created_at=2)
    mem = make_event(SK[2], kind=KIND_ENGRAM, tags=[["d", "x"], ["p", PK[2]]], content="lighthouse")
    for ev in (a, b, mem):
        assert await put(store, ev) is STORED
    assert await q(store, Filter(search="lighthouse", limit=10), viewer=PK[2]) == [a.id, b.id]
    assert await q(store, Filter(search="KEEPER lighthouse", limit=10)) == [a.id]
    assert await q(store, Filter(search="lighthouse", limit=1)) == [a.id]
    assert await q(store, Filter(search="absent", limit=10)) == []
    assert await store.count([Filter(search="night")]) == 1


async def test_private_kinds_of_a_tenant(store: EventStore, make_event: MakeEvent) -> None:
    """The tenant's private kinds (`private`) reach their author and recipient only, in
    every read; a kind left public is read by anyone."""
    private = frozenset({*DEFAULT_PRIVATE, 7})
    dm = make_event(SK[0], kind=7, tags=[["p", PK[1]]], content="+", created_at=5)
    note = make_event(SK[0], kind=1, tags=[["p", PK[1]]], content="hello", created_at=4)
    for ev in (dm, note):
        assert await put(store, ev) is STORED
    for viewer in (PK[0], PK[1]):
        assert await q(store, Filter(limit=5), viewer=viewer, private=private) == [dm.id, note.id]
        assert await store.count([Filter()], viewer=viewer, private=private) == 2
    for viewer in (PK[2], None):
        assert await q(store, Filter(limit=5), viewer=viewer, private=private) == [note.id]
        assert await store.count([Filter(kinds=[7])], viewer=viewer, private=private) == 0
        assert await q(store, Filter(limit=5), viewer=viewer) == [dm.id, note.id]  # public


async def test_close_answers_what_is_queued_then_refuses(make_event: MakeEvent) -> None:
    """Every store: writes queued before `close` are answered, later ones refused (the
    reference here; PostgresStore in test_store_postgres.py)."""
    store = MemoryStore()
    events = [make_event(SK[0], content=str(i)) for i in range(5)]
    saves = [store.submit(e, raw(e)) for e in events]
    await store.close()
    assert {(await s).status for s in saves} == {STORED}
    assert (await store.save(events[0], raw(events[0]))).status is ERROR
