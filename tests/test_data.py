"""`engram export` / `import` / `prune` and background retention, on real relays and databases."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import asyncpg
import msgspec
import pytest
from nostr_client import Client
from relay_fixtures import create_database_sync

from cli.commands.data import ImportSummary, parse_time
from engram.nip01 import Event, pubkey_of, sign_event
from relay.config import ConfigError, load_settings
from relay.retention import RetentionPolicy, parse_duration
from relay.store.maintenance import Selection

AUX = bytes(32)
DAY = 86400
AUTHOR, OTHER, AGENT, OWNER = ((0xDA7A0000 + i).to_bytes(32, "big") for i in range(4))
ENGRAM_CONTENT = "Ag" + "A" * 130  # shaped like a NIP-44 v2 payload; never decrypted


def ev(sk: bytes, kind: int = 1, tags=(), content: str = "", created_at: int | None = None):
    ts = int(time.time()) if created_at is None else created_at
    return sign_event(sk, ts, kind, [list(t) for t in tags], content, AUX)


def engram(created_at: int, slot: str = "ab", kind: int = 30174) -> Event:
    """An engram head, or (kind 4174) a revision of one: the memory's history (issue 39)."""
    tags = [("d", slot * 32), ("p", pubkey_of(OWNER)), ("alt", "encrypted agent memory record")]
    return ev(AGENT, kind, tags, ENGRAM_CONTENT, created_at)


def cli(*args: str, stdin: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "cli.commands.main", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
        env=env,
    )
    if check:
        assert proc.returncode == 0, proc.stderr.decode()
    return proc


def import_json(db: str, path: str, *extra: str) -> dict:
    proc = cli("import", path, "--database-url", db, "--json", *extra)
    return json.loads(proc.stdout)


async def publish_all(url: str, events: list[Event]) -> None:
    async with await Client.connect(url) as c:
        for e in events:  # one by one, in order: replaceable versions arrive oldest first
            ok = await c.publish(e)
            assert ok[2] is True, ok


async def fetch(db: str, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(db)
    try:
        return await conn.fetch(sql)
    finally:
        await conn.close()


async def stored_rows(db: str) -> list[tuple[str, bytes]]:
    rows = await fetch(db, "SELECT tenant, raw FROM events ORDER BY tenant, id")
    return [(r[0], bytes(r[1])) for r in rows]


async def count_rows(db: str) -> int:
    return len(await stored_rows(db))


def mixed_events(now: int) -> list[Event]:
    notes = [ev(AUTHOR, 1, [("t", "x")], f"note {i}", now - i * DAY) for i in range(6)]
    return [
        *notes,
        ev(OTHER, 1, [("e", notes[0].id), ("p", pubkey_of(AUTHOR))], "a reply", now - 30),
        ev(OTHER, 7, [("e", notes[1].id)], "+", now - 20),
        # replaceable: three versions, then a contact list
        *(ev(AUTHOR, 0, (), json.dumps({"name": f"v{i}"}), now - 300 + i * 100) for i in range(3)),
        ev(AUTHOR, 3, [("p", pubkey_of(OTHER))], "", now - 50),
        # addressable: two versions of one address, one of another
        ev(AUTHOR, 30023, [("d", "post")], "draft", now - 400),
        ev(AUTHOR, 30023, [("d", "post")], "final", now - 40),
        ev(AUTHOR, 30023, [("d", "other")], "other post", now - 45),
        # engrams (kind 30174): two versions of one slot, another slot
        engram(now - 500, "ab"),
        engram(now - 10, "ab"),
        engram(now - 12, "cd"),
        # a deletion request for one of the notes (NIP-09, whatever the relay does with it)
        ev(AUTHOR, 5, [("e", notes[5].id)], "gone", now - 5),
    ]


# --- pure parts ---------------------------------------------------------------------------


def test_durations_times_and_selections():
    durations = ("90s", "15m", "12h", "30d", "4w", " 2D ")
    assert [parse_duration(d) for d in durations] == [90, 900, 43200, 30 * DAY, 28 * DAY, 2 * DAY]
    for bad in ("", "30", "d", "1y", "-3d", "0s", "3 days"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert parse_time("1700000000") == 1_700_000_000
    assert parse_time("1970-01-02") == DAY
    assert parse_time("1970-01-02T00:00:10Z") == DAY + 10
    assert parse_time("1970-01-02T02:00:00+02:00") == DAY
    with pytest.raises(ValueError):
        parse_time("yesterday")

    assert Selection().where() == (" AND d IS NULL AND kind NOT IN (4174, 4175)", [])
    assert Selection(include_replaceable=True).where() == ("", [])
    assert Selection((30174, 1)).where() == (" AND kind = ANY($3::int4[])", [[30174, 1]])


def test_retention_settings():
    assert RetentionPolicy.from_settings(load_settings(env={}).retention) is None  # off
    settings = load_settings(
        env={
            "ENGRAM_RETENTION_OLDER_THAN": "90d",
            "ENGRAM_RETENTION_INTERVAL": "10m",
            "ENGRAM_RETENTION_BATCH": "100",
        }
    )
    policy = RetentionPolicy.from_settings(settings.retention)
    assert policy is not None
    assert (policy.older_than, policy.interval, policy.batch) == (90 * DAY, 600.0, 100)
    assert policy.selection == Selection(None, False)
    assert policy.cutoff(1_000_000_000.7) == 1_000_000_000 - 90 * DAY
    with pytest.raises(ConfigError, match="not a duration"):
        load_settings(env={"ENGRAM_RETENTION_OLDER_THAN": "90 days"})
    with pytest.raises(ConfigError, match="batch"):
        load_settings(env={"ENGRAM_RETENTION_OLDER_THAN": "1d", "ENGRAM_RETENTION_BATCH": "0"})


def test_import_summary_counts_by_reason():
    s = ImportSummary()
    s.record(1, True, "")
    s.record(2, True, "duplicate: already have this event")
    s.record(3, True, "duplicate: a newer version of this replaceable event is stored")
    s.record(4, False, "invalid: signature verification failed")
    s.record(5, False, "invalid: event is not valid JSON")
    s.record(6, False, "blocked: deleted by its author")
    s.record(7, False, "error: database unavailable")
    assert (s.imported, s.duplicates, s.errors, s.done) == (1, 2, 1, 7)
    assert s.rejected == {"invalid": 2, "blocked": 1, "error": 1}
    assert s.examples["invalid"] == "line 4: invalid: signature verification failed"
    assert s.report()[0] == "imported 1, duplicates 2, rejected 4"
    assert s.report()[1].startswith("  invalid: 2  (first: line 4:")


# --- export -> import ---------------------------------------------------------------------


FILTERS = [
    {},
    {"kinds": [1]},
    {"authors": [pubkey_of(AUTHOR)]},
    {"kinds": [0, 3]},
    {"kinds": [30023], "#d": ["post"]},
    {"#t": ["x"], "limit": 3},
    {"kinds": [1, 7], "since": int(time.time()) - 3 * DAY},
    {"kinds": [5]},
]


async def req_results(url: str) -> list[list[dict]]:
    async with await Client.connect(url) as c:
        results = [await c.query(f) for f in FILTERS]
        assert (await c.auth(AGENT, url, int(time.time())))[2] is True
        results.append(await c.query({"kinds": [30174], "authors": [pubkey_of(AGENT)]}))
        return results


async def test_export_then_import_reproduces_req_results(start_relay, pg_server_url, tmp_path):
    now = int(time.time())
    source = start_relay()
    await publish_all(source.url, mixed_events(now))

    exported = cli("export", "--database-url", source.database_url)
    lines = exported.stdout.splitlines()
    assert len(lines) == await count_rows(source.database_url)
    assert f"exported {len(lines)} events (tenant default)" in exported.stderr.decode()
    stamps = [msgspec.json.decode(line)["created_at"] for line in lines]
    assert stamps == sorted(stamps)  # oldest first
    assert sum(b'"kind":30174' in line for line in lines) == 2  # heads only, still ciphertext
    assert all(ENGRAM_CONTENT.encode() in line for line in lines if b'"kind":30174' in line)
    dump = tmp_path / "events.jsonl"
    dump.write_bytes(exported.stdout)
    # -o FILE: the same lines, in a file only its owner may read (private events), also
    # when it existed with a wider mode
    to_file = tmp_path / "private.jsonl"
    to_file.write_bytes(b"old")
    to_file.chmod(0o644)
    cli("export", "--database-url", source.database_url, "-o", str(to_file))
    assert to_file.read_bytes() == exported.stdout
    assert to_file.stat().st_mode & 0o777 == 0o600
    fresh = tmp_path / "fresh.jsonl"
    cli("export", "--database-url", source.database_url, "-o", str(fresh))
    assert fresh.stat().st_mode & 0o777 == 0o600

    target_db = create_database_sync(pg_server_url)
    summary = import_json(target_db, str(dump))
    assert summary["imported"] == len(lines), summary
    assert (summary["duplicates"], summary["rejected"]) == (0, {})
    assert await stored_rows(target_db) == await stored_rows(source.database_url)

    target = start_relay(database_url=target_db)
    before, after = await req_results(source.url), await req_results(target.url)
    assert after == before
    assert len(before[-1]) == 2 and all(e["content"] == ENGRAM_CONTENT for e in before[-1])
    assert {e["content"] for e in before[3] if e["kind"] == 0} == {'{"name": "v2"}'}

    # the copy exports byte for byte the same file
    assert cli("export", "--database-url", target_db).stdout == exported.stdout

    # importing again changes nothing: every line is a duplicate
    proc = cli("import", str(dump), "--database-url", target_db)
    assert proc.stdout.decode().splitlines() == [f"imported 0, duplicates {len(lines)}, rejected 0"]
    assert await stored_rows(target_db) == await stored_rows(source.database_url)

    # --since / --until (unix seconds or ISO dates) select by created_at, inclusive
    window = cli(
        "export", "--database-url", target_db, "--since", str(now - 300), "--until", str(now - 40)
    ).stdout.splitlines()
    expected = [line for line, ts in zip(lines, stamps, strict=True) if now - 300 <= ts <= now - 40]
    assert window == expected and 0 < len(window) < len(lines)
    assert cli("export", "--database-url", target_db, "--since", "2999-01-01").stdout == b""
    bad = cli("export", "--database-url", target_db, "--since", "soon", check=False)
    assert bad.returncode == 2 and b"--since" in bad.stderr


async def test_import_rejects_bad_lines_by_reason_and_imports_the_rest(pg_server_url, tmp_path):
    now = int(time.time())
    good = [ev(AUTHOR, 1, (), "good one", now - 60), ev(OTHER, 1, (), "good two", now - 30)]
    forged = ev(AUTHOR, 1, (), "forged", now)
    forged.sig = ("0" if forged.sig[0] != "0" else "1") + forged.sig[1:]
    tampered = ev(AUTHOR, 1, (), "original", now)
    tampered.content = "tampered"
    lines = [
        msgspec.json.encode(good[0]),
        b"this is not json",
        b'{"id": "00", "kind": 1}',
        msgspec.json.encode(forged),
        msgspec.json.encode(tampered),
        msgspec.json.encode(ev(AUTHOR, 1, (), "from the future", now + 7200)),
        msgspec.json.encode(ev(AGENT, 30174, [("d", "ab" * 32), ("p", pubkey_of(OWNER))], "x")),
        b"",
        msgspec.json.encode(good[0]),  # the same event twice in one file
        msgspec.json.encode(good[1]),
    ]
    dump = tmp_path / "mixed.jsonl"
    dump.write_bytes(b"\n".join(lines) + b"\n")
    db = create_database_sync(pg_server_url)

    summary = import_json(db, str(dump))
    assert summary["lines"] == 9
    assert (summary["imported"], summary["duplicates"]) == (2, 1)
    assert summary["rejected"] == {"invalid": 6}
    assert summary["examples"]["invalid"] == "line 2: invalid: event is not valid JSON"
    stored = {msgspec.json.decode(raw)["id"] for _, raw in await stored_rows(db)}
    assert stored == {good[0].id, good[1].id}
    # a bulk load leaves fresh planner statistics (the live path leaves them to autovacuum)
    stats = await fetch(db, "SELECT analyze_count FROM pg_stat_user_tables WHERE relname='events'")
    assert stats[0][0] >= 1

    # the text summary names each reason with its first case; rejections exit 0
    proc = cli("import", str(dump), "--database-url", db)
    out = proc.stdout.decode().splitlines()
    assert out[0] == "imported 0, duplicates 3, rejected 6"
    assert out[1].startswith("  invalid: 6  (first: line 2:")

    # stdin works too, and a missing file is a usage error
    piped = cli("import", "-", "--database-url", db, "--json", stdin=lines[9] + b"\n")
    assert json.loads(piped.stdout)["duplicates"] == 1
    missing = cli("import", str(tmp_path / "nope.jsonl"), "--database-url", db, check=False)
    assert missing.returncode == 2 and b"cannot read" in missing.stderr


async def test_tenants_export_and_import_by_host(pg_server_url, tmp_path):
    db = create_database_sync(pg_server_url)
    cli("tenant", "add", "a.test", "--alias", "alias-a.test", "--database-url", db)
    cli("tenant", "add", "b.test", "--database-url", db)
    events = [ev(AUTHOR, 1, (), f"for a {i}", int(time.time()) - i) for i in range(3)]
    dump = tmp_path / "a.jsonl"
    dump.write_bytes(b"".join(msgspec.json.encode(e) + b"\n" for e in events))

    assert import_json(db, str(dump), "--tenant", "alias-a.test")["imported"] == 3
    assert {t for t, _ in await stored_rows(db)} == {"a.test"}
    assert len(cli("export", "--database-url", db, "--tenant", "a.test").stdout.splitlines()) == 3
    assert cli("export", "--database-url", db, "--tenant", "b.test").stdout == b""
    assert cli("export", "--database-url", db).stdout == b""  # the default tenant
    unknown = cli("export", "--database-url", db, "--tenant", "c.test", check=False)
    assert unknown.returncode == 1 and b"no tenant serves" in unknown.stderr
    # the same file into another tenant: not a duplicate there
    assert import_json(db, str(dump), "--tenant", "b.test")["imported"] == 3


# --- prune and retention ------------------------------------------------------------------


def aged_events(now: int) -> tuple[list[Event], list[Event]]:
    """(old: 40 days, new) events; old ones are accepted by ingest (no lower limit)."""
    old_ts = now - 40 * DAY
    old = [ev(AUTHOR, 1, (), f"old note {i}", old_ts + i) for i in range(12)]
    old += [ev(OTHER, 7, [("e", old[0].id)], "+", old_ts + 100 + i) for i in range(3)]
    old_heads = [
        ev(AUTHOR, 0, (), '{"name":"old profile"}', old_ts),
        ev(AUTHOR, 30023, [("d", "old")], "old article", old_ts),
        engram(old_ts),
        engram(old_ts, kind=4174),  # memory history is kept like the heads it belongs to
    ]
    new = [ev(AUTHOR, 1, (), f"new note {i}", now - i) for i in range(3)]
    new.append(ev(OTHER, 7, [("e", new[0].id)], "+", now))
    return old + old_heads, new


def prune(db: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return cli("prune", "--database-url", db, *args, check=check)


async def test_prune_deletes_old_events_in_batches(start_relay):
    now = int(time.time())
    old, new = aged_events(now)
    rp = start_relay()
    await publish_all(rp.url, old + new)
    db = rp.database_url
    total = len(old) + len(new)

    dry = prune(db, "--older-than", "30d", "--dry-run").stdout.decode()
    assert dry.startswith("would delete 15 events (regular kinds")
    assert await count_rows(db) == total

    out = prune(db, "--older-than", "30d", "--kind", "7", "--batch", "2").stdout.decode()
    assert out.startswith("deleted 3 events in 2 batches (kind 7,")
    out = prune(db, "--older-than", "4w", "--batch", "5").stdout.decode()
    assert out.startswith("deleted 12 events in 3 batches (regular kinds")
    async with await Client.connect(rp.url) as c:
        assert {e["id"] for e in await c.query({"kinds": [1, 7]})} == {e.id for e in new}
        kept = {e["kind"] for e in await c.query({"authors": [pubkey_of(AUTHOR)]})}
        assert kept == {0, 1, 30023}  # replaceable and addressable heads are kept
    assert await count_rows(db) == len(new) + 4  # and the old engram head and its revision

    out = prune(db, "--older-than", "30d", "--kind", "30174", "--tenant", "default").stdout
    assert out.decode().startswith("deleted 1 events in 1 batches (kind 30174,")
    out = prune(db, "--older-than", "30d", "--include-replaceable").stdout.decode()
    assert out.startswith("deleted 3 events in 1 batches (all kinds")
    assert {msgspec.json.decode(r)["id"] for _, r in await stored_rows(db)} == {e.id for e in new}
    assert prune(db, "--older-than", "30d").stdout.decode().startswith("deleted 0 events")

    bad = prune(db, "--older-than", "30 days", check=False)
    assert bad.returncode == 2 and b"not a duration" in bad.stderr


async def test_retention_prunes_in_the_background(start_relay, tmp_path):
    config = tmp_path / "engram.toml"
    config.write_text('[retention]\nolder_than = "30d"\ninterval = "1s"\nbatch = 2\n')
    rp = start_relay(args=("--config", str(config)))
    now = int(time.time())
    old, new = aged_events(now)
    await publish_all(rp.url, old + new)

    async with await Client.connect(rp.url) as c:
        deadline = time.monotonic() + 60  # an outer bound: the job runs every second
        while {e["id"] for e in await c.query({"kinds": [1, 7]})} != {e.id for e in new}:
            assert time.monotonic() < deadline, "retention did not prune the old events"
            await asyncio.sleep(0.3)
        kinds = {e["kind"] for e in await c.query({"authors": [pubkey_of(AUTHOR)]})}
        assert kinds == {0, 1, 30023}  # heads kept: include_replaceable is off
    assert await count_rows(rp.database_url) == len(new) + 4  # engram head and revision too
    assert "retention: pruned" in rp.log()
