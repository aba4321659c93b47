"""PostgresStore against a real (embedded) PostgreSQL: what only a database shows.

Commits before answers, group commit, writers racing in SQL, failures and outages,
stored words and plans, migrations, the differential against `relay.filters.matches`,
COUNT from event_tags. What every store must do alike (saving, replace rules, deletions,
queries, the read gate) is the contract, tests/test_store_contract.py.

Every test gets a fresh database (`database_url`); tests that need many independent
stores inside one database use distinct tenants instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

import asyncpg
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram.head import select_head
from engram.nip01 import Event, pubkey_of
from engram.readers import parties
from relay.config import KIND_ENGRAM, Settings
from relay.filters import Filter, matches, matches_any
from relay.store import DEFAULT_TENANT, SaveResult, SaveStatus, StoreError
from relay.store.migrate import apply_migrations, migration_files, migration_status
from relay.store.postgres import PostgresStore
from relay.store.sqlcount import build_count
from relay.store.sqlread import build_query
from relay.store.sqlwrite import encode_row
from relay.validate import expiration_of

SK = [bytes([i + 1]) * 32 for i in range(4)]
PK = [pubkey_of(k) for k in SK]
STORED, DUPLICATE, STALE, ERROR = (
    SaveStatus.STORED,
    SaveStatus.DUPLICATE,
    SaveStatus.STALE,
    SaveStatus.ERROR,
)

MakeEvent = Callable[..., Event]


def raw(ev: Event) -> bytes:
    return msgspec.json.encode(ev)


def ids_of(raws: list[bytes]) -> list[str]:
    return [msgspec.json.decode(r)["id"] for r in raws]


def tenant() -> str:
    return "t-" + uuid.uuid4().hex


async def put(store: PostgresStore, ev: Event, tenant: str = DEFAULT_TENANT) -> SaveStatus:
    return (await store.save(ev, raw(ev), tenant)).status


async def q(store: PostgresStore, *filters: Filter, **kw: object) -> list[str]:
    return ids_of(await store.query(list(filters), **kw))  # type: ignore[arg-type]


def head_of(events: list[Event]) -> Event:
    """Spec head selection, from its one home (`engram.head`): the SQL replace rule
    (`relay.store.sqlwrite.INSERT_REPLACEABLE`) and the writer's in-batch rule must agree."""
    head = select_head(events)
    assert head is not None
    return head


# --- saving ---------------------------------------------------------------------------


async def test_committed_before_answer(
    store: PostgresStore, database_url: str, make_event: MakeEvent
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        events = [make_event(SK[0], content=str(i)) for i in range(30)]

        async def save_and_look(ev: Event) -> int:
            assert await put(store, ev) is STORED
            return await conn.fetchval(  # another connection sees it at once
                "SELECT count(*) FROM events WHERE id = $1", bytes.fromhex(ev.id)
            )

        for ev in events:  # sequential: each await must see its own row
            assert await save_and_look(ev) == 1
    finally:
        await conn.close()


async def test_group_commit_batches(database_url: str, make_event: MakeEvent) -> None:
    events = [make_event(SK[0], content=str(i), created_at=1000 + i) for i in range(200)]
    for batch_max, most, least in ((500, 3, 1), (10, 200, 20)):
        store = await PostgresStore.open(database_url, Settings(write_batch_max=batch_max))
        t = tenant()
        try:
            results = await asyncio.gather(*(store.save(e, raw(e), t) for e in events))
            assert {r.status for r in results} == {STORED}
            conn = await asyncpg.connect(database_url)
            xacts = await conn.fetchval(
                "SELECT count(DISTINCT xmin::text) FROM events WHERE tenant = $1", t
            )
            await conn.close()
            assert least <= xacts <= most, (batch_max, xacts)
        finally:
            await store.close()


async def test_enqueue_answers_each_event_once_even_when_a_callback_raises(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    """`enqueue` (the relay's EVENT path): every callback runs once, after the commit,
    and one that raises neither silences the rest of its batch nor stops the writer."""
    t = tenant()
    events = [make_event(SK[0], content=f"cb{i}") for i in range(40)]
    answers: Counter[str] = Counter()
    results: dict[str, SaveStatus] = {}
    all_answered = asyncio.Event()

    def done_for(ev: Event, i: int) -> Callable[[SaveResult], None]:
        def done(result: SaveResult) -> None:
            answers[ev.id] += 1
            results[ev.id] = result.status
            if len(answers) == len(events):
                all_answered.set()
            if i % 7 == 3:
                raise RuntimeError("a caller's bug")

        return done

    for i, ev in enumerate(events):  # one loop iteration: the same batch
        store.enqueue(ev, raw(ev), t, done_for(ev, i))
    await asyncio.wait_for(all_answered.wait(), 30)
    assert answers == Counter({e.id: 1 for e in events})
    assert set(results.values()) == {STORED}
    later = make_event(SK[0], content="after the bad callbacks")
    assert await put(store, later, t) is STORED  # the writer still runs
    await asyncio.sleep(0.05)
    assert answers == Counter({e.id: 1 for e in events})  # nothing answered twice


# --- replaceable and addressable: writers racing ---------------------------------------


async def _race(stores: list[PostgresStore], events: list[Event], t: str) -> None:
    order = events[:]
    random.shuffle(order)
    results = await asyncio.gather(
        *(stores[i % len(stores)].save(e, raw(e), t) for i, e in enumerate(order))
    )
    head = head_of(events)
    by_id = {e.id: r.status for e, r in zip(order, results, strict=True)}
    assert by_id[head.id] is STORED
    assert all(s in (STORED, STALE, DUPLICATE) for s in by_id.values())
    for s in stores:
        got = await q(s, Filter(authors=[head.pubkey], limit=500), tenant=t, viewer=head.pubkey)
        assert got == [head.id]


async def test_concurrent_writers_one_address(
    store: PostgresStore, database_url: str, make_event: MakeEvent
) -> None:
    rng = random.Random(7)
    events = [
        make_event(
            SK[2], kind=30174, tags=[["d", "mem/x"]], content=str(i), created_at=rng.randint(1, 20)
        )
        for i in range(200)
    ]  # created_at drawn from 20 values: many ties, settled by lowest id
    other = await PostgresStore.open(database_url, Settings(write_batch_max=7))
    try:
        for _ in range(3):
            await _race([store], events, tenant())  # group commit: in-batch resolution
            await _race([store, other], events, tenant())  # two writers racing in SQL
    finally:
        await other.close()


# --- failures -------------------------------------------------------------------------


async def test_bad_event_fails_alone(
    store: PostgresStore, database_url: str, make_event: MakeEvent
) -> None:
    conn = await asyncpg.connect(database_url)
    await conn.execute(  # the row of the event whose content is "boom" cannot be stored
        "ALTER TABLE events ADD CONSTRAINT test_no_boom"
        " CHECK (position('\\x22626f6f6d22'::bytea in raw) = 0)"
    )
    await conn.close()
    events = [make_event(SK[0], content=str(i)) for i in range(40)]
    events.insert(17, make_event(SK[0], content="boom"))
    results = await asyncio.gather(*(store.save(e, raw(e)) for e in events))
    assert [r.status for r in results] == [STORED] * 17 + [ERROR] + [STORED] * 23
    assert results[17].message.startswith("error:")
    assert len(await store.query([Filter(limit=500)])) == 40


class _Proxy:
    """A unix-socket proxy in front of the test server, to cut the database off."""

    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        host = parse_qs(parts.query).get("host", [parts.hostname or "localhost"])[0]
        port = parts.port or 5432
        self._target = (host, port)
        self._dir = Path(tempfile.mkdtemp(prefix="pgproxy-"))
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.AbstractServer | None = None
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        self.dsn = urlunsplit(("postgresql", netloc, parts.path, f"host={self._dir}", ""))

    async def start(self) -> None:
        path = str(self._dir / ".s.PGSQL.5432")
        self._server = await asyncio.start_unix_server(self._client, path=path)

    async def _client(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        host, port = self._target
        if host.startswith("/"):
            ur, uw = await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        else:
            ur, uw = await asyncio.open_connection(host, port)
        self._writers += [w, uw]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(r, uw), pipe(ur, w))

    async def kill(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        self._writers.clear()
        (self._dir / ".s.PGSQL.5432").unlink(missing_ok=True)
        await asyncio.sleep(0.05)  # let the clients see their sockets close

    async def close(self) -> None:
        await self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)


async def test_unreachable_database_is_error(database_url: str, make_event: MakeEvent) -> None:
    proxy = _Proxy(database_url)
    await proxy.start()
    store = await PostgresStore.open(proxy.dsn, Settings())
    try:
        first = make_event(SK[0], content="before")
        assert await put(store, first) is STORED
        await proxy.kill()
        lost = [make_event(SK[0], content=f"lost {i}") for i in range(5)]
        results = await asyncio.gather(*(store.save(e, raw(e)) for e in lost))
        assert [r.status for r in results] == [ERROR] * 5
        assert all(r.message.startswith("error:") for r in results)
        assert await store.ping() is False
        with pytest.raises(StoreError, match=r"^error:"):
            await store.query([Filter(limit=5)])
        await proxy.start()  # the database is back: the pool reconnects
        assert await put(store, lost[0]) is STORED
        assert await store.ping() is True
        assert sorted(await q(store, Filter(limit=10))) == sorted([first.id, lost[0].id])
    finally:
        await store.close()
        await proxy.close()


async def test_close_drains_then_refuses(database_url: str, make_event: MakeEvent) -> None:
    store = await PostgresStore.open(database_url, Settings(write_batch_max=5))
    events = [make_event(SK[0], content=str(i)) for i in range(50)]
    saves = [asyncio.ensure_future(store.save(e, raw(e))) for e in events]
    await asyncio.sleep(0)
    await store.close()
    assert {(await s).status for s in saves} == {STORED}
    late = await store.save(events[0], raw(events[0]))
    assert late.status is ERROR
    reopened = await PostgresStore.open(database_url, Settings())
    assert await reopened.count([Filter()]) == 50
    await reopened.close()


# --- queries --------------------------------------------------------------------------


async def test_awkward_tag_values(
    store: PostgresStore, database_url: str, make_event: MakeEvent
) -> None:
    values = ["NULL", "a,b", "{x}", " sp ", 'q"uote', "back\\slash", "\\", "", "ü", "😀"]
    ev = make_event(SK[0], tags=[["t", v] for v in values])
    assert await put(store, ev) is STORED
    for v in values:
        assert await q(store, Filter(tags={"t": [v]}, limit=5)) == [ev.id], v
    assert await q(store, Filter(tags={"t": ["null", "a", "x", "sp"]}, limit=5)) == []
    conn = await asyncpg.connect(database_url)
    stored = await conn.fetchval("SELECT tagvals FROM events")
    await conn.close()
    assert stored == ["t:" + v for v in values]


async def test_search_reads_stored_words(
    store: PostgresStore, database_url: str, make_event: MakeEvent
) -> None:
    """NIP-50 tests a row by the words stored at insert (migration 0012); a row stored
    before 0012 has none, is parsed when tested, and is found all the same."""
    new = make_event(SK[0], content="Stored words: Lighthouse keeper", created_at=1_000)
    old = make_event(SK[1], content="an older LIGHTHOUSE note", created_at=900)
    memo = make_event(SK[2], kind=KIND_ENGRAM, tags=[["d", "x"], ["p", pubkey_of(SK[2])]])
    for ev in (new, old, memo):
        assert await put(store, ev) is STORED
    conn = await asyncpg.connect(database_url)
    try:
        words = dict(await conn.fetch("SELECT id, words::text FROM events"))
        assert words[bytes.fromhex(new.id)] == "'keeper':4 'lighthouse':3 'stored':1 'words':2"
        assert words[bytes.fromhex(memo.id)] == ""  # engram content is never searchable
        await conn.execute(  # as a row written before 0012 is: content, no words
            "UPDATE events SET words = NULL, content = $2 WHERE id = $1",
            bytes.fromhex(old.id),
            old.content,
        )
        # The query tests the very expression the index holds (as PostgreSQL prints both),
        # or the planner could never take the index.
        index = await conn.fetchval("SELECT pg_get_indexdef('events_words'::regclass)")
        expression = index.partition(" USING gin (")[2].rpartition(") WHERE ")[0]
        built = build_query([Filter(search="lighthouse", limit=10)], DEFAULT_TENANT)
        assert built is not None and expression.startswith("COALESCE(words, to_tsvector(")
        plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + built[0], *built[1]))
        assert f"{expression} @@ " in plan, (index, plan)
    finally:
        await conn.close()
    assert await q(store, Filter(search="lighthouse", limit=10)) == [new.id, old.id]
    assert await q(store, Filter(search="older", limit=10)) == [old.id]
    assert await q(store, Filter(search="keeper", limit=10)) == [new.id]
    assert await q(store, Filter(search="absent", limit=10)) == []


async def migrate_before(conn: asyncpg.Connection, version: str) -> None:
    """The schema as a relay of an older release left it: every migration before
    `version` applied and recorded, as apply_migrations does."""
    await conn.execute(
        "CREATE TABLE schema_migrations (version text PRIMARY KEY,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    for name, sql in migration_files():
        if name >= version:
            break
        async with conn.transaction():
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", name)


async def test_upgrade_to_stored_words_keeps_old_rows(
    database_url: str, make_event: MakeEvent
) -> None:
    """A store written before migration 0012 (no `words` column) upgrades in place: its
    rows are served byte for byte and found by search, and new rows get their words."""
    old = make_event(
        SK[0],
        tags=[["t", "before"]],
        content="written before the upgrade: lighthouse",
        created_at=900,
    )
    conn = await asyncpg.connect(database_url)
    try:
        await migrate_before(conn, "0012")
        await conn.execute(  # what the relay's insert wrote then
            "INSERT INTO events (tenant, id, pubkey, created_at, kind, d, owner, tagvals,"
            " content, sig, raw, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7,"
            " $8::text::text[], $9, $10, $11, $12)",
            DEFAULT_TENANT,
            *(row := encode_row(old, raw(old)))[:8],
            bytes.fromhex(old.sig),
            *row[8:],
        )
    finally:
        await conn.close()
    store = await PostgresStore.open(database_url, Settings())  # applies 0012
    try:
        new = make_event(SK[1], content="written after: lighthouse keeper", created_at=1_000)
        assert await put(store, new) is STORED
        assert await q(store, Filter(search="lighthouse", limit=10)) == [new.id, old.id]
        assert await q(store, Filter(search="upgrade", limit=10)) == [old.id]
        assert await store.query([Filter(ids=[old.id], limit=1)]) == [raw(old)]
        # 0013 indexed the old row's tags in event_tags
        assert await q(store, Filter(tags={"t": ["before"]}, limit=10)) == [old.id]
    finally:
        await store.close()
    conn = await asyncpg.connect(database_url)
    try:
        words = dict(await conn.fetch("SELECT id, words IS NOT NULL FROM events"))
        indexes = {r[0] for r in await conn.fetch("SELECT indexname FROM pg_indexes")}
    finally:
        await conn.close()
    assert words == {bytes.fromhex(old.id): False, bytes.fromhex(new.id): True}
    assert "events_words" in indexes and "events_search" not in indexes


# --- migrations -----------------------------------------------------------------------


async def test_migrations_idempotent(database_url: str) -> None:
    versions = [v for v, _ in migration_files()]
    assert versions and versions[0] == "0001_init" and versions == sorted(versions)
    conn = await asyncpg.connect(database_url)
    try:
        assert await migration_status(conn) == [(v, False) for v in versions]
        assert await apply_migrations(conn) == versions
        assert await apply_migrations(conn) == []
        assert await migration_status(conn) == [(v, True) for v in versions]
        n = await conn.fetchval("SELECT count(*) FROM schema_migrations")
        assert n == len(versions)
    finally:
        await conn.close()


async def test_concurrent_migrations_do_not_race(database_url: str) -> None:
    conns = [await asyncpg.connect(database_url) for _ in range(4)]
    try:
        results = await asyncio.gather(*(apply_migrations(c) for c in conns))
        versions = [v for v, _ in migration_files()]
        assert sorted(results, key=len) == [[]] * 3 + [versions]
    finally:
        for c in conns:
            await c.close()


# --- differential: Postgres vs relay.filters.matches ----------------------------------

_KINDS = [1, 7, 0, 3, 10002, 30000, 30023, KIND_ENGRAM, 40000]
_VALUES = ["a", "b", "", "A", "z" * 300, "n\x00ul", PK[0], PK[1]]
_tag = st.tuples(st.sampled_from(["e", "p", "d", "t", "E", "dd"]), st.sampled_from(_VALUES))
_event = st.tuples(
    st.integers(0, 2),  # author
    st.sampled_from(_KINDS),
    st.integers(100, 106),  # created_at: narrow, to make ties
    st.lists(_tag.map(list), max_size=3),
    st.sampled_from(["", "x", "y"]),
)
_filter = st.builds(
    Filter,
    ids=st.none() | st.lists(st.integers(0, 30), max_size=3),  # indexes, resolved later
    authors=st.none() | st.lists(st.sampled_from(PK), max_size=2),
    kinds=st.none() | st.lists(st.sampled_from(_KINDS), max_size=3),
    tags=st.dictionaries(
        st.sampled_from(["e", "p", "d", "t", "E"]),
        st.lists(st.sampled_from(_VALUES), max_size=3),
        max_size=2,
    ),
    since=st.none() | st.integers(99, 107),
    until=st.none() | st.integers(99, 107),
    limit=st.integers(0, 8),
)


def _address(ev: Event) -> tuple[str, int, str] | None:
    if ev.kind in (0, 3) or 10000 <= ev.kind < 20000:
        return ev.pubkey, ev.kind, ""
    if 30000 <= ev.kind < 40000:
        d = next((t for t in ev.tags if t and t[0] == "d"), ["d", ""])
        return ev.pubkey, ev.kind, d[1] if len(d) > 1 else ""
    return None


def _visible(ev: Event, viewer: str | None) -> bool:
    if ev.kind != KIND_ENGRAM:
        return True
    owner = next((t[1] for t in ev.tags if len(t) >= 2 and t[0] == "p"), None)
    return viewer is not None and viewer in (ev.pubkey, owner)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    specs=st.lists(_event, max_size=25),
    filters=st.lists(_filter, min_size=1, max_size=3),
    viewer=st.none() | st.sampled_from(PK[:3]),
)
async def test_differential_against_matches(
    store: PostgresStore,
    make_event: MakeEvent,
    specs: list,
    filters: list[Filter],
    viewer: str | None,
) -> None:
    events = [
        make_event(SK[a], kind=k, tags=tags, content=c, created_at=t) for a, k, t, tags, c in specs
    ]
    t = tenant()
    results = await asyncio.gather(*(store.save(e, raw(e), t) for e in events))
    # Engrams without exactly one `d` tag are refused (ingest never lets them through).
    malformed = [
        e.kind == KIND_ENGRAM and sum(1 for tg in e.tags if tg and tg[0] == "d") != 1
        for e in events
    ]
    for bad, result in zip(malformed, results, strict=True):
        assert (result.status is SaveStatus.ERROR) == bad, result
    events = [e for e, bad in zip(events, malformed, strict=True) if not bad]
    # The oracle's idea of what is stored: every regular id, and one head per address.
    heads: dict[object, Event] = {}
    for ev in events:
        key = _address(ev) or ev.id
        if key not in heads or head_of([ev, heads[key]]) is ev:
            heads[key] = ev
    stored = list(heads.values())
    pool = [e.id for e in events] + ["f" * 64]
    for f in filters:
        if f.ids is not None:
            f.ids = [pool[i % len(pool)] for i in f.ids]
    expected: dict[str, Event] = {}
    for f in filters:
        hits = sorted(
            (e for e in stored if matches(f, e) and _visible(e, viewer)),
            key=lambda e: (-e.created_at, e.id),
        )
        expected.update((e.id, e) for e in hits[: f.limit])
    want = [raw(e) for e in sorted(expected.values(), key=lambda e: (-e.created_at, e.id))]
    assert await store.query(filters, t, viewer) == want
    n = sum(1 for e in stored if _visible(e, viewer) and any(matches(f, e) for f in filters))
    assert await store.count(filters, t, viewer) == n


# --- COUNT of a tag filter from event_tags (0026) --------------------------------------


def _from_tags(filters: list[Filter], viewer: str | None = None) -> bool:
    """Whether build_count reads these filters from event_tags alone (not `events` rows,
    but for the expired ones and the private kinds), or reads nothing."""
    built = build_count(filters, "t", viewer, 1)
    return built is None or "FROM events WHERE tenant" not in built[0]


async def test_tag_count_cases(store: PostgresStore, make_event: MakeEvent) -> None:
    """Each rule a COUNT from event_tags must keep, on a store written through the store."""
    note, other = "a" * 64, "b" * 64
    now = int(time.time())

    async def count(*filters: Filter, viewer: str | None = None) -> int:
        assert _from_tags(list(filters), viewer)
        return await store.count(list(filters), viewer=viewer)

    reactions = [
        make_event(SK[i % 3], kind=7, tags=[["e", note]], content="+", created_at=100 + i)
        for i in range(5)
    ]
    reply = make_event(SK[0], kind=1, tags=[["e", note], ["e", other]], created_at=110)
    on_other = make_event(SK[1], kind=7, tags=[["e", other]], created_at=111)
    expired = make_event(
        SK[2], kind=7, tags=[["e", note], ["expiration", str(now - 60)]], created_at=112
    )
    later = make_event(
        SK[2], kind=7, tags=[["e", note], ["expiration", str(now + 3600)]], created_at=113
    )
    for ev in (*reactions, reply, on_other, expired, later):
        assert await put(store, ev) is STORED
    assert await count(Filter(kinds=[7], tags={"e": [note]})) == 6  # not the expired one
    assert await count(Filter(tags={"e": [note]})) == 7  # the reply too
    assert await count(Filter(kinds=[1, 7], tags={"e": [note]}, limit=1)) == 7  # no limit
    assert await count(Filter(kinds=[1], tags={"e": [note, other]})) == 1  # reply: once
    assert await count(Filter(tags={"e": [note, other]})) == 8
    # an event matched by two filters counts once
    assert await count(Filter(kinds=[1], tags={"e": [note]}), Filter(tags={"e": [other]})) == 2
    assert await count(Filter(tags={"e": [note]}), Filter(kinds=[7], tags={"e": [note]})) == 7
    assert await count(Filter(tags={"e": [note]}, since=102, until=110)) == 4
    assert await count(Filter(tags={"e": [note]}, since=110, until=102)) == 0
    assert await count(Filter(kinds=[3], tags={"e": [note]})) == 0
    assert await count(Filter(tags={"e": ["c" * 64]})) == 0
    # NIP-09: a deleted reaction is gone from the count (its entries went with its row)
    deletion = make_event(SK[0], kind=5, tags=[["e", reactions[0].id]], created_at=120)
    assert await put(store, deletion) is STORED
    assert await count(Filter(kinds=[7], tags={"e": [note]})) == 5
    # private kinds (a DM, a gift wrap): counted for their author and recipient only
    dm = make_event(SK[0], kind=4, tags=[["p", PK[1]], ["e", note]], created_at=130)
    wrap = make_event(SK[3], kind=1059, tags=[["p", PK[1]], ["e", note]], created_at=131)
    for ev in (dm, wrap):
        assert await put(store, ev) is STORED
    assert await count(Filter(tags={"e": [note]})) == 6
    assert await count(Filter(tags={"e": [note]}), viewer=PK[2]) == 6
    assert await count(Filter(tags={"e": [note]}), viewer=PK[0]) == 7  # the DM's author
    assert await count(Filter(tags={"e": [note]}), viewer=PK[1]) == 8  # both go to PK[1]
    assert await count(Filter(kinds=[4], tags={"p": [PK[1]]}), viewer=PK[1]) == 1
    assert await count(Filter(kinds=[4], tags={"p": [PK[1]]}), viewer=PK[3]) == 0
    assert await count(Filter(kinds=[4], tags={"p": [PK[1]]})) == 0
    assert (
        await count(
            Filter(kinds=[4, 7], tags={"e": [note]}),
            Filter(kinds=[1059], tags={"p": [PK[1]]}),
            viewer=PK[1],
        )
        == 7
    )
    # replaced events count once, under their kind (the update trigger): a replaceable
    # kind 3 and an addressable kind 30023, each stored in three versions
    for t in (200, 201, 202):
        for ev in (
            make_event(SK[1], kind=3, tags=[["p", PK[2]], ["t", f"v{t}"]], created_at=t),
            make_event(SK[1], kind=30023, tags=[["d", "x"], ["p", PK[2]]], created_at=t),
        ):
            assert await put(store, ev) is STORED
    assert await count(Filter(tags={"p": [PK[2]]})) == 2
    assert await count(Filter(kinds=[3], tags={"p": [PK[2]]})) == 1
    assert await count(Filter(kinds=[30023], tags={"d": ["x"]})) == 1
    assert await count(Filter(tags={"t": ["v200", "v201"]})) == 0  # old versions gone
    assert await count(Filter(kinds=[3], tags={"t": ["v202"]})) == 1


_COUNT_KINDS = [1, 7, 4, 1059, 3, 30023]
_COUNT_VALUES = ["a", "b", "c", PK[0], PK[1]]


async def test_tag_count_against_the_stored_rows(
    store: PostgresStore, database_url: str, make_event: MakeEvent
) -> None:
    """Random single-tag COUNTs (several values, several filters, kinds public and private,
    time spans) against the rows themselves: `matches`, NIP-40 and the private read gate
    applied in Python to what is stored after replaces, deletions and expirations."""
    rng = random.Random(26)
    t = tenant()
    now = int(time.time())
    events: list[Event] = []
    for i in range(120):
        kind = rng.choice(_COUNT_KINDS)
        tags = [[rng.choice("ept"), rng.choice(_COUNT_VALUES)] for _ in range(rng.randint(0, 3))]
        if kind in (4, 1059) and rng.random() < 0.8:
            tags.insert(0, ["p", rng.choice(PK)])
        if kind == 30023:
            tags.append(["d", rng.choice("xy")])
        if rng.random() < 0.15:
            tags.append(["expiration", str(now + rng.choice((-100, 3600)))])
        events.append(make_event(rng.choice(SK), kind=kind, tags=tags, created_at=100 + i % 40))
    for ev in events:
        await store.save(ev, raw(ev), t)
    for ev in rng.sample(events, 10):  # NIP-09, by their authors
        sk = SK[PK.index(ev.pubkey)]
        await store.save(
            d := make_event(sk, kind=5, tags=[["e", ev.id]], created_at=500), raw(d), t
        )
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT raw FROM events WHERE tenant = $1", t)
    finally:
        await conn.close()
    stored = [msgspec.json.decode(r[0], type=Event) for r in rows]
    stored = [e for e in stored if e.kind != 5]  # deletion requests carry `e` tags: skip
    private = {4, 1059, 1060, KIND_ENGRAM}

    def visible(e: Event, viewer: str | None) -> bool:
        expires = expiration_of(e.tags)
        if expires is not None and expires <= now:
            return False
        return e.kind not in private or viewer in parties(e.pubkey, e.tags)

    for _ in range(150):
        filters = []
        for _ in range(rng.randint(1, 3)):
            kinds = None if rng.random() < 0.4 else rng.sample(_COUNT_KINDS, rng.randint(1, 3))
            since = None if rng.random() < 0.6 else rng.randint(100, 140)
            until = None if rng.random() < 0.6 else rng.randint(100, 140)
            values = rng.sample(_COUNT_VALUES, rng.randint(1, 3))
            filters.append(
                Filter(kinds=kinds, tags={rng.choice("ept"): values}, since=since, until=until)
            )
        for viewer in (None, PK[0], PK[1]):
            assert _from_tags(filters, viewer)
            want = sum(1 for e in stored if visible(e, viewer) and matches_any(filters, e))
            assert await store.count(filters, t, viewer) == want, (filters, viewer)


async def test_0026_gives_existing_entries_their_kind(
    database_url: str, make_event: MakeEvent
) -> None:
    """A store written before 0026 upgrades in place: every entry gets its event's kind
    (replaced and deleted events included), and the counts read it."""
    note = "e" * 64
    old = [
        make_event(SK[0], kind=7, tags=[["e", note]], created_at=10),
        make_event(SK[1], kind=1, tags=[["e", note], ["t", "x"]], created_at=11),
        make_event(SK[2], kind=30023, tags=[["d", "a"], ["e", note]], created_at=12),
    ]
    conn = await asyncpg.connect(database_url)
    try:
        await migrate_before(conn, "0026")
        for ev in old:  # what the relay's insert wrote then (0013's trigger: no kind)
            await conn.execute(
                "INSERT INTO events (tenant, id, pubkey, created_at, kind, d, owner, tagvals,"
                " content, raw, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7,"
                " $8::text::text[], $9, $10, $11)",
                DEFAULT_TENANT,
                *encode_row(ev, raw(ev)),
            )
        assert await conn.fetchval("SELECT count(*) FROM event_tags") == 5
    finally:
        await conn.close()
    store = await PostgresStore.open(database_url, Settings())  # applies 0026
    try:
        newer = make_event(SK[2], kind=30023, tags=[["d", "a"], ["e", note]], created_at=13)
        assert await put(store, newer) is STORED  # replaces old[2]
        assert await put(store, make_event(SK[3], kind=7, tags=[["e", note]])) is STORED
        assert await store.count([Filter(kinds=[7], tags={"e": [note]})]) == 2
        assert await store.count([Filter(kinds=[1], tags={"e": [note]})]) == 1
        assert await store.count([Filter(kinds=[30023], tags={"e": [note]})]) == 1
        assert await store.count([Filter(tags={"e": [note]})]) == 4
        assert await store.count([Filter(kinds=[1], tags={"t": ["x"]})]) == 1
    finally:
        await store.close()
    conn = await asyncpg.connect(database_url)
    try:
        wrong = await conn.fetchval(
            "SELECT count(*) FROM event_tags x LEFT JOIN events e"
            " ON e.tenant = x.tenant AND e.id = x.id WHERE e.kind IS DISTINCT FROM x.kind"
        )
        total = await conn.fetchval("SELECT count(*) FROM event_tags")
        index = await conn.fetchval("SELECT pg_get_indexdef('event_tags_time'::regclass)")
    finally:
        await conn.close()
    assert wrong == 0 and total == 6
    assert "INCLUDE (kind)" in index
