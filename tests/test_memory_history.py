"""Issue 39: history, audit, tombstones that remember, trust and validity, on a relay set
of our relay AND nostr-sdk's LocalRelay (an implementation nobody here wrote), through
`engram mem` run as a real process (docs/NIP-AE-HISTORY.md).

One relay of ours and one LocalRelay serve the module; every test uses a fresh
agent/owner pair, so memories never mix.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from cli_support import (
    Keys,
    deletion_ignoring_proxy,
    engram,
    engram_async,
    put,
    shared_local_relay,
    shared_relay,
)
from relay_fixtures import RelayProcess

from cli.memory.api import AgentMemory
from cli.nostr.client import connect_relay
from cli.nostr.errors import BadInputError, NotFoundError, RefusedError
from cli.nostr.identity import load_identity
from engram import (
    Core,
    Memory,
    Tombstone,
    body_text,
    build_event,
    conversation_key,
    heads_by_slug,
    listing,
)
from engram.nip01 import sign_event
from engram.versions import AGENT, Meta, build_version


@pytest.fixture(scope="module")
def ours(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("history-relay")))


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from shared_local_relay(str(tmp_path_factory.mktemp("history-sdk")))


@pytest.fixture
def keys() -> Keys:
    return Keys.fresh()


@pytest.fixture
def relays(ours: RelayProcess, sdk: str) -> list[str]:
    return [ours.url, sdk]


def mem(keys: Keys, relays: list[str], *args: str, owner: bool = False) -> Any:
    """`engram mem ARGS…` as the agent (or, `owner`, as the owner naming the agent)."""
    if owner:
        env = keys.owner_env(",".join(relays))
        args = (*args, "--agent", keys.agent)
    else:
        env = keys.agent_env(",".join(relays))
    return engram("mem", *args, "--timeout", "120", env=env)


async def amem(keys: Keys, relays: list[str], *args: str, owner: bool = False) -> Any:
    """`mem` without blocking the event loop (a proxy of the test serves meanwhile)."""
    if owner:
        env = keys.owner_env(",".join(relays))
        args = (*args, "--agent", keys.agent)
    else:
        env = keys.agent_env(",".join(relays))
    return await engram_async("mem", *args, "--timeout", "120", env=env)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def ok(result: Any) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return str(result.stdout.decode())


def api(keys: Keys, relays: list[str]) -> AgentMemory:
    env = {"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()}
    return AgentMemory(load_identity(None, keys.owner, None, env=env), relays, timeout=60)


def owner_api(keys: Keys, relays: list[str]) -> AgentMemory:
    env = {"ENGRAM_PRIVATE_KEY": keys.owner_sk.hex()}
    return AgentMemory(load_identity(None, None, keys.agent, env=env), relays, timeout=60)


async def test_five_versions_log_as_of_diff_revert_audit(keys: Keys, relays: list[str]) -> None:
    ids = []
    for i in range(5):
        trust = "stated" if i % 2 else "guess"
        out = ok(mem(keys, relays, "set", "notes/city", f"city {i}\n", "--trust", trust,
                     "--source", f"session {i}"))  # fmt: skip
        ids.append(out.strip())
    log = json.loads(ok(mem(keys, relays, "log", "notes/city", "--json")))
    assert [v["id"] for v in log] == ids[::-1]
    assert [v["trust"] for v in log] == ["guess", "stated", "guess", "stated", "guess"]
    assert {v["author"] for v in log} == {keys.agent} and {v["role"] for v in log} == {"agent"}
    assert [v["source"] for v in log] == [f"session {i}" for i in range(4, -1, -1)]
    for v, prev in zip(log, [*log[1:], None], strict=True):
        assert v["prev"] == (prev["id"] if prev else None)
    plain = ok(mem(keys, relays, "log", "notes/city")).splitlines()
    assert [line.split("\t")[0] for line in plain] == ids[::-1]
    for i, v in enumerate(reversed(log)):
        got = mem(keys, relays, "get", "notes/city", "--as-of", str(v["created_at"]))
        assert ok(got) == f"city {i}\n"
        assert (await api(keys, relays).get("notes/city", rev=v["id"])).value == f"city {i}\n"
    assert ok(mem(keys, relays, "get", "notes/city", "--rev", log[-1]["id"][:8])) == "city 0\n"
    before = mem(keys, relays, "get", "notes/city", "--as-of", str(log[-1]["created_at"] - 1))
    assert before.returncode == 1
    diff = ok(mem(keys, relays, "diff", "notes/city"))
    assert "-city 3\n" in diff and "+city 4\n" in diff
    diff = ok(mem(keys, relays, "diff", "notes/city", ids[0], ids[2]))
    assert "-city 0\n" in diff and "+city 2\n" in diff
    reverted = ok(mem(keys, relays, "revert", "notes/city", ids[1][:10])).strip()
    assert ok(mem(keys, relays, "get", "notes/city")) == "city 1\n"
    latest = json.loads(ok(mem(keys, relays, "get", "notes/city", "--json")))
    assert latest["id"] == reverted and latest["trust"] == "stated"
    assert latest["source"] == f"revert of {ids[1]}"
    assert len(json.loads(ok(mem(keys, relays, "log", "notes/city", "--json")))) == 6
    audit = mem(keys, relays, "audit", "--json")
    report = json.loads(ok(audit))
    assert report["clean"] and report["findings"] == [] and report["versions"] == 6, report


async def test_audit_finds_missing_fork_and_out_of_chain(
    keys: Keys, relays: list[str], ours: RelayProcess
) -> None:
    m = api(keys, relays)
    # a plain NIP-AE head before the first version: where history starts (clean)
    now = int(time.time())
    plain_first = build_event(
        keys.agent_sk, keys.owner, Memory("mem/a/before", "plain"), now - 100,
        os.urandom(32), os.urandom(32),
    )  # fmt: skip
    for url in relays:
        await put(url, [plain_first], keys.agent_sk)
    await m.set("a/before", "versioned")
    clean = await amem(keys, relays, "audit", "a/before")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    # missing: a version deleted from our relay only (NIP-09 by its author)
    one = await m.set("a/missing", "one")
    await m.set("a/missing", "two")
    deletion = sign_event(
        keys.agent_sk, int(time.time()), 5, [["e", one.event_id], ["k", "4174"]], "",
        os.urandom(32),
    )  # fmt: skip
    await put(ours.url, [deletion], keys.agent_sk)
    # fork: two writers from one base
    base = await m.set("a/fork", "base")
    for i, text in enumerate(("left", "right")):
        meta = Meta(trust="guess", prev=base.event_id, prev_sha256=sha("base"))
        fork = build_version(
            keys.agent_sk, keys.owner, AGENT, "mem/a/fork", text, meta,
            base.created_at + 1 + i, os.urandom(32), os.urandom(32),
        )  # fmt: skip
        for url in relays:
            await put(url, [fork], keys.agent_sk)
    # out of chain: a head rewritten by a NIP-AE-only writer over an existing history
    versioned = await m.set("a/plain", "versioned")
    rewrite = build_event(
        keys.agent_sk, keys.owner, Memory("mem/a/plain", "plain rewrite"),
        versioned.created_at + 1, os.urandom(32), os.urandom(32),
    )  # fmt: skip
    for url in relays:
        await put(url, [rewrite], keys.agent_sk)
    result = await amem(keys, relays, "audit", "--json")
    assert result.returncode == 6, result.stderr
    found = {
        (f["kind"], f["slug"], f["version"], f["relay"])
        for f in json.loads(result.stdout)["findings"]
    }
    assert ("missing", "mem/a/missing", one.event_id, ours.url) in found
    assert ("fork", "mem/a/fork", base.event_id, None) in found
    for url in relays:
        assert ("out_of_chain", "mem/a/plain", rewrite.id, url) in found
    assert not any(slug == "mem/a/before" for _, slug, _, _ in found)
    plain_text = (await amem(keys, relays, "audit")).stdout.decode()
    assert f"missing\tmem/a/missing\t{one.event_id}\t{ours.url}\t" in plain_text
    # the newest write wins whoever wrote it; log names the plain head as such
    assert (await m.get("a/plain")).value == "plain rewrite"
    log = json.loads(ok(await amem(keys, relays, "log", "a/plain", "--json")))
    assert (log[0]["id"], log[0]["plain"], log[0]["trust"]) == (rewrite.id, True, None)


async def test_tombstones_remember_and_forget_names_a_relay_that_keeps(
    keys: Keys, ours: RelayProcess, sdk: str
) -> None:
    relays = [ours.url, sdk]
    ok(await amem(keys, relays, "set", "notes/home", "Berlin"))
    tomb = ok(await amem(keys, relays, "rm", "notes/home", "--reason", "moved to Paris")).strip()
    again = await amem(keys, relays, "set", "notes/home", "Berlin")
    err = again.stderr.decode()
    assert again.returncode == 1 and tomb in err and "moved to Paris" in err, err
    log = json.loads(ok(await amem(keys, relays, "log", "notes/home", "--json")))
    assert log[0]["state"] == "removed" and log[0]["reason"] == "moved to Paris"
    assert "Berlin" not in json.dumps(log)  # a tombstone records the hash, never the value
    patch = "--- a\n+++ b\n@@ -0,0 +1 @@\n+Berlin\n\\ No newline at end of file\n"
    patched = await engram_async(
        "mem", "patch", "notes/home", "-", "--no-base-hash", "--timeout", "120",
        env=keys.agent_env(",".join(relays)), stdin=patch.encode(),
    )  # fmt: skip
    assert patched.returncode == 1 and tomb in patched.stderr.decode()
    ok(await amem(keys, relays, "set", "notes/home", "Paris"))  # another value: fine
    forced = ok(await amem(keys, relays, "set", "notes/home", "Berlin", "--force")).strip()
    assert ok(await amem(keys, relays, "get", "notes/home")) == "Berlin"
    # rm without --reason still records the rejected value's hash
    bare = ok(await amem(keys, relays, "rm", "notes/home")).strip()
    refused = await amem(keys, relays, "set", "notes/home", "Berlin")
    assert refused.returncode == 1 and bare in refused.stderr.decode()
    # forget: every relay is asked to delete; one that ignores NIP-09 is named (exit 2)
    async with deletion_ignoring_proxy(sdk) as keeps:
        relays = [ours.url, keeps]
        forgot = await amem(keys, relays, "forget", "notes/home")
        err = forgot.stderr.decode()
        assert forgot.returncode == 2, err
        assert keeps in err and ours.url not in err.split("still served by")[-1]
        # afterwards no read path shows a forgotten value, history included
        log = json.loads(ok(await amem(keys, relays, "log", "notes/home", "--json")))
        assert [v["state"] for v in log] == ["forgotten"]
        for args in (("--rev", forced), ("--as-of", str(int(time.time()) + 5))):
            gone = await amem(keys, relays, "get", "notes/home", *args)
            assert gone.returncode == 1 and b"Berlin" not in gone.stdout
        assert ok(await amem(keys, relays, "ls")) == ""
    # our relay deleted every version; the one that ignored NIP-09 still holds them
    mine = {"authors": [keys.agent], "kinds": [4174]}
    for url, expect_old in ((ours.url, False), (sdk, True)):
        client = await connect_relay(url, keys.agent_sk)
        try:
            held = {e.id for e in await client.query(mine)}
        finally:
            await client.close()
        assert (forced in held) is expect_old, url


async def test_owner_denies_and_corrects_with_the_owner_key_alone(
    keys: Keys, relays: list[str]
) -> None:
    ok(await amem(keys, relays, "set", "notes/diet", "vegan", "--trust", "stated"))
    ok(await amem(keys, relays, "set", "notes/city", "Berlin"))
    # an owner-only process: the owner's key, the agent named by --agent
    denied = await amem(keys, relays, "deny", "notes/diet", "--reason", "eats fish", owner=True)
    verdict = ok(denied).strip()
    corrected = ok(await amem(keys, relays, "set", "notes/city", "Paris", owner=True)).strip()
    # a fresh agent process sees both
    gone = await amem(keys, relays, "get", "notes/diet")
    assert gone.returncode == 1 and b"denied" in gone.stderr
    listed = [line.split("\t") for line in ok(await amem(keys, relays, "ls")).splitlines()]
    assert [r[0] for r in listed] == ["mem/notes/city"]
    assert listed[0][1:2] == [corrected] and listed[0][3] == "confirmed"
    assert ok(await amem(keys, relays, "search", "vegan")) == ""
    city = json.loads(ok(await amem(keys, relays, "get", "notes/city", "--json")))
    assert (city["value"], city["role"], city["author"]) == ("Paris", "owner", keys.owner)
    assert city["trust"] == "confirmed" and city["id"] == corrected
    # the agent cannot re-assert a denied value, even with --force
    refused = await amem(keys, relays, "set", "notes/diet", "vegan", "--force")
    assert refused.returncode == 1 and verdict in refused.stderr.decode()
    mem = api(keys, relays)
    with pytest.raises(RefusedError) as denied_again:
        await mem.set("notes/diet", "vegan")
    assert (denied_again.value.version_id, denied_again.value.overridable) == (verdict, False)
    await mem.set("notes/diet", "pescatarian")  # another value is fine
    # writing over the owner's correction needs --force
    over = await amem(keys, relays, "set", "notes/city", "Rome")
    assert over.returncode == 1 and corrected in over.stderr.decode()
    await mem.set("notes/city", "Rome", force=True)
    # the owner confirms: the agent's value, now confirmed by the owner
    confirmed = ok(await amem(keys, relays, "confirm", "notes/city", owner=True)).strip()
    got = await mem.get("notes/city")
    assert (got.value, got.event_id, got.trust) == ("Rome", confirmed, "confirmed")
    log = [msgspec.structs.asdict(v) for v in await mem.log("notes/city")]
    assert [(v["role"], v["trust"]) for v in log] == [
        ("owner", "confirmed"), ("agent", "guess"), ("owner", "confirmed"), ("agent", "guess"),
    ]  # fmt: skip
    # the owner's log shows the denied value's hash, never the value
    diet = json.loads(ok(await amem(keys, relays, "log", "notes/diet", "--json", owner=True)))
    assert [v["state"] for v in diet] == ["value", "denied", "withheld"]
    assert diet[1]["reason"] == "eats fish" and diet[2]["value_sha256"] == sha("vegan")
    with pytest.raises(NotFoundError, match="denied"):
        await owner_api(keys, relays).get("notes/diet", rev=diet[2]["id"])
    # the agent's key never writes a verdict
    with pytest.raises(BadInputError, match="only the owner"):
        await api(keys, relays).confirm("notes/city")


async def test_a_nip_ae_only_reader_reads_the_same_heads_and_values(
    keys: Keys, relays: list[str], ours: RelayProcess
) -> None:
    """The same writes, made once by a plain NIP-AE writer and once with the extension:
    a reader that knows only NIP-AE (engram's head rule, heads only) reads the same
    values and the same listing from both stores, and the extension reads the same
    values as it, for every memory without an owner verdict."""
    plain_keys = Keys.fresh()
    ops: list[tuple[str, str | None]] = [
        ("mem/a", "one"), ("mem/b", "bee"), ("mem/a", "two"), ("core", "me [[mem/a]]"),
        ("mem/c", "sea"), ("mem/c", None), ("mem/b", "bee\nline 2\n"), ("mem/d", "dee"),
        ("mem/d", None), ("mem/d", "dee again"), ("core", "me, later [[mem/b]]"),
    ]  # fmt: skip
    mem = api(keys, relays)
    start = int(time.time()) - 1000
    plain_events = []
    for i, (slug, value) in enumerate(ops):
        body = (
            Core(value or "") if slug == "core"
            else Tombstone(slug) if value is None else Memory(slug, value)
        )  # fmt: skip
        plain_events.append(
            build_event(plain_keys.agent_sk, plain_keys.owner, body, start + i,
                        os.urandom(32), os.urandom(32))
        )  # fmt: skip
        if value is None:
            await mem.rm(slug, force=True)
        else:
            await mem.set(slug, value, trust="stated", valid_until=start + 10**9)
    await mem.set("mem/e", "owner-touched")
    await owner_api(keys, relays).set("mem/e", "owner's value")  # excluded: a verdict
    for url in relays:
        await put(url, plain_events, plain_keys.agent_sk)

    async def nip_ae_view(k: Keys) -> tuple[dict[str, str | None], list[str]]:
        client = await connect_relay(ours.url, k.agent_sk)
        try:
            events = await client.query({"kinds": [30174], "authors": [k.agent], "#p": [k.owner]})
        finally:
            await client.close()
        ck = conversation_key(k.agent_sk, k.owner)
        heads = heads_by_slug(events, k.agent, k.owner, ck)
        values = {slug: body_text(h.body) for slug, h in heads.items()}
        return values, [e.slug for e in listing(heads)]

    extension_store, extension_listing = await nip_ae_view(keys)
    plain_store, plain_listing = await nip_ae_view(plain_keys)
    assert extension_store.pop("mem/e") == "owner-touched"  # a NIP-AE reader: the agent's head
    assert extension_listing == [*plain_listing, "mem/e"]
    assert extension_store == plain_store
    # the extension reads the same values as the NIP-AE-only reader (verdicts aside)
    live = (await mem.live()).views
    assert {s: v.value for s, v in live.items() if s != "mem/e"} == {
        s: v for s, v in plain_store.items() if v is not None
    }
    assert live["mem/e"].value == "owner's value" and live["mem/e"].role == "owner"
    assert (await api(plain_keys, relays).live()).views.keys() == live.keys() - {"mem/e"}
