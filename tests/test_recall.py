"""Recall (`engram mem recall`, `AgentMemory.recall`, MCP `memory_recall`, `engram acp
--recall`, `set`'s hints) on a real relay of ours: what must come back, what must not
(tombstoned, rewritten, another pair's cache), and the cache's refusals.

One relay for the module; every test has its own agent/owner pair and cache directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from cli_support import ROOT, Keys, engram, engram_async, publish, shared_relay
from relay_fixtures import RelayProcess

from cli.memory.api import AgentMemory
from cli.memory.recall import SETTINGS, Recall, RecallSettings
from cli.memory.recall.cache import CacheFile
from cli.nostr.identity import load_identity
from engram import Memory, build_event

FACTS = {
    "prefs/editor-go": "The user writes Go in Neovim with gopls; VS Code only for notebooks.",
    "prefs/coffee": "Takes coffee black, no sugar, two cups before noon.",
    "people/dana": "Dana Okafor leads the payments team and reviews every schema migration.",
    "projects/atlas": "Project Atlas ships the billing rewrite; deadline is 2025-03-14.",
    "home/city": "The user moved from Lisbon to Rotterdam in June 2024.",
}


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("recall-relay")))


def api(keys: Keys, url: str, cache: Path) -> AgentMemory:
    ident = load_identity(None, keys.owner, None, env={"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()})
    return AgentMemory(ident, [url], timeout=60, recall_dir=cache)


def cli_env(keys: Keys, url: str, data_home: Path) -> dict[str, str]:
    return keys.agent_env(url, XDG_DATA_HOME=str(data_home))


def recall_json(keys: Keys, url: str, data_home: Path, query: str) -> list[dict]:
    out = engram("mem", "recall", query, "--json", env=cli_env(keys, url, data_home))
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


async def seeded(keys: Keys, url: str, cache: Path) -> AgentMemory:
    mem = api(keys, url, cache)
    for slug, value in FACTS.items():
        await mem.set(slug, value)
    return mem


async def test_recall_answers_a_paraphrase_and_follows_every_change(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys = Keys.fresh()
    data_home = tmp_path / "data"
    cache = data_home / "engram-relay" / "recall"  # where the CLI's platformdirs puts it
    mem = await seeded(keys, relay.url, cache)
    # positive: a question that quotes none of the memory's sentences
    found = await mem.recall("which editor does the user prefer for Go?", limit=3)
    assert found.hits[0].slug == "mem/prefs/editor-go"
    assert found.hits[0].value == FACTS["prefs/editor-go"]
    assert [h.score for h in found.hits] == sorted((h.score for h in found.hits), reverse=True)
    # a tombstone and a rewrite leave the results at the next call in this process
    await mem.rm("prefs/coffee")
    await mem.set("home/city", "The user lives in Utrecht since May 2025.")
    found = await mem.recall("how does the user take coffee?", limit=10)
    assert "mem/prefs/coffee" not in [h.slug for h in found.hits]
    found = await mem.recall("where does the user live now?", limit=10)
    city = [h for h in found.hits if h.slug == "mem/home/city"]
    assert city and city[0].value.startswith("The user lives in Utrecht")
    assert not any("Rotterdam" in h.value for h in found.hits)
    # another writer (another process) adds a memory: it appears at the next call here
    other = engram(
        "mem",
        "set",
        "pets/cat",
        "The user's cat is called Miso and hates the vacuum.",
        env=cli_env(keys, relay.url, tmp_path / "elsewhere"),
    )
    assert other.returncode == 0, other.stderr.decode()
    found = await mem.recall("what is the name of the user's pet?", limit=3)
    assert found.hits[0].slug == "mem/pets/cat"
    # ... and removes one: gone at the next call here
    gone = engram("mem", "rm", "people/dana", env=cli_env(keys, relay.url, tmp_path / "elsewhere"))
    assert gone.returncode == 0, gone.stderr.decode()
    found = await mem.recall("who reviews schema migrations?", limit=10)
    assert "mem/people/dana" not in [h.slug for h in found.hits]
    # a new process, reading the cache this one wrote, agrees
    rows = recall_json(keys, relay.url, data_home, "who reviews schema migrations?")
    slugs = [r["slug"] for r in rows]
    assert "mem/people/dana" not in slugs and "mem/prefs/coffee" not in slugs
    assert "mem/pets/cat" in slugs
    assert {r["slug"]: r["value"] for r in rows}["mem/home/city"].startswith("The user lives in")
    # a tombstone written by another process is seen by a new process using the cache
    assert (
        engram("mem", "rm", "pets/cat", env=cli_env(keys, relay.url, tmp_path / "x")).returncode
        == 0
    )
    rows = recall_json(keys, relay.url, data_home, "what is the name of the user's pet?")
    assert "mem/pets/cat" not in [r["slug"] for r in rows]


async def publish_old(keys: Keys, url: str, slug: str, value: str, age: int) -> str:
    """A write dated `age` seconds ago (a clock far behind, or a head `engram mem sync`
    copied in from another relay): published as the agent, straight to the relay."""
    event = build_event(
        keys.agent_sk,
        keys.owner,
        Memory(slug=slug, value=value),
        int(time.time()) - age,
        os.urandom(32),
        os.urandom(32),
    )
    await publish(url, event)
    return event.id


async def test_a_write_dated_far_behind_is_found_by_the_next_process(
    relay: RelayProcess, tmp_path: Path
) -> None:
    """Our relay serves NIP-77: a process's first call reconciles the cache's heads with
    it, so a write dated hours behind the newest event seen comes in (a `since` read
    from 600 s before the newest would never ask for it); with nothing new, one round."""
    keys = Keys.fresh()
    data_home = tmp_path / "data"
    cache = data_home / "engram-relay" / "recall"
    mem = await seeded(keys, relay.url, cache)
    await mem.recall("coffee", limit=1)
    await mem.close()
    old = await publish_old(
        keys, relay.url, "mem/garden/roses", "The user grows climbing roses on the balcony.", 7200
    )
    rows = recall_json(keys, relay.url, data_home, "which flowers does the user grow?")
    assert rows[0]["slug"] == "mem/garden/roses" and rows[0]["event_id"] == old
    later = api(keys, relay.url, cache)
    found = await later.recall("which flowers does the user grow?", limit=1)
    assert found.methods == {relay.url: "negentropy"} and found.changed == 0
    assert found.hits[0].event_id == old
    await later.close()


async def test_a_relay_without_nip77_is_read_whole_when_due(
    start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    """Without NIP-77 a first call asks from `slack` before the newest event seen: a write
    dated further behind is not asked for then, only by the whole read that is due every
    `full_every` seconds (the bound of that gap)."""
    plain = start_relay(env={"ENGRAM_NEGENTROPY_MAX_SESSIONS": "0"})
    keys = Keys.fresh()
    cache = tmp_path / "cache"
    mem = await seeded(keys, plain.url, cache)
    await mem.recall("coffee", limit=1)
    await mem.close()
    old = await publish_old(
        keys, plain.url, "mem/garden/roses", "The user grows climbing roses on the balcony.", 7200
    )

    def recaller(settings: RecallSettings) -> Recall:
        return Recall(
            api(keys, plain.url, cache).identity,
            [plain.url],
            60,
            cache_dir=cache,
            settings=settings,
            background=False,
        )

    not_due = recaller(RecallSettings())
    found = await not_due.recall("which flowers does the user grow?", limit=10)
    assert found.methods == {plain.url: "since"}
    assert old not in [h.event_id for h in found.hits]
    await not_due.close()
    due = recaller(RecallSettings(full_every=0))
    found = await due.recall("which flowers does the user grow?", limit=1)
    assert found.methods == {plain.url: "req"} and found.hits[0].event_id == old
    await due.close()


@asynccontextmanager
async def refusing_proxy() -> AsyncIterator[tuple[str, list[str]]]:
    """A proxy that refuses everything: it closes every connection at once and notes it."""
    tried: list[str] = []

    async def refuse(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tried.append("connection")
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", tried


def snapshot(root: Path, skip: frozenset[str] = frozenset()) -> dict[str, tuple[int, int]]:
    """Every file under `root` (but directories named in `skip`): size and mtime."""
    out = {}
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            path = Path(here, name)
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


async def test_recall_works_offline_and_writes_only_in_the_users_data_dir(
    relay: RelayProcess, tmp_path: Path
) -> None:
    """Done-when 3: every proxy variable points at a proxy that refuses everything (only
    the relay, on loopback, is reachable: NO_PROXY), HOME, TMPDIR and the XDG dirs are
    new: recall works, answers as it does online, contacts nothing else (the proxy sees
    no connection; without NO_PROXY it sees the relay's), and writes only under
    $XDG_DATA_HOME/engram-relay/ (PYTHONDONTWRITEBYTECODE: the interpreter's bytecode
    cache, which an editable install writes into the checkout on a first import, is not
    recall's)."""
    keys = Keys.fresh()
    await seeded(keys, relay.url, tmp_path / "writer-cache")
    user = tmp_path / "user"
    dirs = {
        "HOME": "home",
        "TMPDIR": "tmp",
        "XDG_DATA_HOME": "data",
        "XDG_CACHE_HOME": "cache",
        "XDG_CONFIG_HOME": "config",
        "XDG_STATE_HOME": "state",
        "XDG_RUNTIME_DIR": "run",
    }
    for sub in dirs.values():
        (user / sub).mkdir(parents=True, mode=0o700)
    base = cli_env(keys, relay.url, user / "data") | {
        var: str(user / sub) for var, sub in dirs.items()
    }
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    query = "which editor does the user prefer for Go?"
    skip = frozenset({"__pycache__", ".pytest_cache"})  # other test workers write these
    async with refusing_proxy() as (proxy, tried):
        offline = base | {
            name: proxy
            for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "WS_PROXY", "WSS_PROXY")
            for name in (var, var.lower())
        }
        offline |= {"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
        before_user, before_repo = snapshot(user), snapshot(ROOT, skip)
        runs = [await engram_async("mem", "recall", query, "--json", env=offline)]
        runs.append(await engram_async("mem", "recall", query, "--json", env=offline))
        after_user, after_repo = snapshot(user), snapshot(ROOT, skip)
    assert not tried, "something went past the relay to the network"
    runs.append(engram("mem", "recall", query, "--json", env=base))  # online, from the cache
    for run in runs:
        assert run.returncode == 0, run.stderr.decode()
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout
    assert json.loads(runs[0].stdout)[0]["slug"] == "mem/prefs/editor-go"
    written = {p for p in after_user if before_user.get(p) != after_user[p]}
    assert written and all(p.startswith("data/engram-relay/recall/") for p in written), written
    assert after_repo == before_repo


async def test_json_output_is_stable_and_documented(relay: RelayProcess, tmp_path: Path) -> None:
    keys = Keys.fresh()
    await seeded(keys, relay.url, tmp_path / "data" / "engram-relay" / "recall")
    env = cli_env(keys, relay.url, tmp_path / "data")
    first = engram("mem", "recall", "billing deadline", "--json", "--limit", "4", env=env)
    second = engram("mem", "recall", "billing deadline", "--json", "--limit", "4", env=env)
    assert first.returncode == 0, first.stderr.decode()
    assert first.stdout == second.stdout
    rows = json.loads(first.stdout)
    assert len(rows) == 4
    members = ["slug", "value", "snippet", "score", "created_at", "event_id"]
    members += ["trust", "role", "valid_from", "valid_until", "ended"]  # issue 39
    assert all(list(r) == members for r in rows)
    assert rows[0]["slug"] == "mem/projects/atlas"
    assert isinstance(rows[0]["created_at"], int) and len(rows[0]["event_id"]) == 64
    plain = engram("mem", "recall", "billing deadline", "--limit", "1", env=env)
    slug, score, created_at, snippet, trust, validity = (
        plain.stdout.decode().rstrip("\n").split("\t")
    )
    assert slug == "mem/projects/atlas" and float(score) > 0 and "deadline" in snippet
    assert (trust, validity) == (rows[0]["trust"] or "-", "-")
    assert created_at == str(rows[0]["created_at"])


async def test_a_corrupt_or_foreign_cache_is_rebuilt_never_trusted(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys, other = Keys.fresh(), Keys.fresh()
    cache = tmp_path / "cache"
    mem = await seeded(keys, relay.url, cache)
    await mem.recall("coffee", limit=1)
    (path,) = cache.glob("*.bin")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = path.read_bytes()
    assert b"Neovim" not in raw and b"prefs" not in raw  # nothing decrypted in the clear
    # a flipped byte: refused, rebuilt from the relay, results unchanged
    tampered = bytearray(raw)
    tampered[-40] ^= 1
    path.write_bytes(bytes(tampered))
    fresh = api(keys, relay.url, cache)
    found = await fresh.recall("which editor for Go?", limit=1)
    assert fresh.recaller().rebuilt is False  # rebuilt and saved by the call
    assert found.hits[0].slug == "mem/prefs/editor-go"
    assert path.read_bytes() != bytes(tampered)
    # another pair's cache put in this pair's place: never read
    theirs = await seeded(other, relay.url, tmp_path / "theirs")
    await theirs.set("secret/plan", "Their plan: move everything to Rotterdam.")
    await theirs.recall("plan", limit=1)
    (their_file,) = (tmp_path / "theirs").glob("*.bin")
    path.write_bytes(their_file.read_bytes())
    probe = api(keys, relay.url, cache)
    index = probe.recaller()._open()
    assert probe.recaller().rebuilt and len(index) == 0  # refused before anything was read
    found = await probe.recall("their plan to move", limit=10)
    assert "mem/secret/plan" not in [h.slug for h in found.hits]
    # a file sealed under another key but carrying this pair's header: refused as well
    ident = probe.identity
    forged = CacheFile(cache, ident.agent, ident.owner, "wordllama-256", os.urandom(32))
    forged.save(theirs.recaller().index, {}, {}, {})  # type: ignore[arg-type]
    again = api(keys, relay.url, cache)
    assert len(again.recaller()._open()) == 0 and again.recaller().rebuilt


async def test_set_names_similar_memories_without_refusing(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys = Keys.fresh()
    mem = await seeded(keys, relay.url, tmp_path / "cache")
    result = await mem.set(
        "prefs/go-editor", "The user writes Go in Neovim with gopls; VS Code only for notebooks!"
    )
    assert result.event_id and [s.slug for s in result.similar] == ["mem/prefs/editor-go"]
    assert result.similar[0].score >= SETTINGS.similar
    # the same fact said another way under a name that shares no word with the first
    again = await mem.set(
        "setup/ide", "For Go the user codes in Neovim (gopls); VS Code for notebooks."
    )
    assert "mem/prefs/editor-go" in [s.slug for s in again.similar]
    unrelated = await mem.set("prefs/tea", "Green tea after lunch, never in the evening.")
    assert unrelated.event_id and "mem/prefs/editor-go" not in [s.slug for s in unrelated.similar]
    out = engram(
        "mem",
        "set",
        "prefs/go-ide",
        "The user writes Go in Neovim with gopls, VS Code for notebooks.",
        env=cli_env(keys, relay.url, tmp_path / "data"),
    )
    assert out.returncode == 0 and len(out.stdout.decode().strip()) == 64
    assert "similar memory: mem/prefs/editor-go" in out.stderr.decode()


async def test_mcp_memory_recall_through_the_sdk_client(
    relay: RelayProcess, tmp_path: Path
) -> None:
    from test_mcp import stdio_server

    keys = Keys.fresh()
    await seeded(keys, relay.url, tmp_path / "data" / "engram-relay" / "recall")
    env = cli_env(keys, relay.url, tmp_path / "data")
    async with stdio_server(env, log_dir=tmp_path) as server:
        assert "memory_recall" in await server.tool_names()
        result = await server.call("memory_recall", query="when is the billing project due?")
        assert not result.is_error, result
        rows = result.structured_content["memories"]  # type: ignore[index]
        assert rows[0]["slug"] == "mem/projects/atlas" and len(rows) == len(FACTS)
        assert rows[0]["value"] == FACTS["projects/atlas"]
        # a tombstone written through the same server leaves its next answer
        gone = await server.call("memory_delete", slug="projects/atlas")
        assert not gone.is_error, gone
        again = await server.call("memory_recall", query="when is the billing project due?")
        slugs = [r["slug"] for r in again.structured_content["memories"]]  # type: ignore[index]
        assert "mem/projects/atlas" not in slugs and slugs
        # memory_set answers with the close memories it found
        near = await server.call(
            "memory_set", slug="prefs/coffee-2", value="Takes coffee black, no sugar, two cups."
        )
        assert not near.is_error, near
        similar = near.structured_content["similar"]  # type: ignore[index]
        assert similar[0]["slug"] == "mem/prefs/coffee"


async def test_acp_recall_injects_relevant_memories_and_nothing_when_the_relay_is_silent(
    relay: RelayProcess, tmp_path: Path
) -> None:
    from acp import text_block
    from cli_support import listening_never_accepting
    from test_acp_proxy import proxied, user_block

    from cli.memory.hook import RECALL_HEADER

    keys = Keys.fresh()
    await seeded(keys, relay.url, tmp_path / "data" / "engram-relay" / "recall")
    env = cli_env(keys, relay.url, tmp_path / "data")
    question = "Which editor should I set up for the user's Go work?"
    async with proxied(tmp_path, env, "--recall", "2", "--timeout", "60") as (conn, run):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.prompt(session_id=session.session_id, prompt=[text_block(question)])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("coffee?")])
    first, second = run.received("session/prompt")
    injected = first["prompt"][-2]["text"]
    assert injected.startswith(RECALL_HEADER) and first["prompt"][-1] == user_block(question)
    assert "[[mem/prefs/editor-go]]" in injected.splitlines()[2]  # the best one first
    assert len([x for x in injected.splitlines() if x.startswith("- [[")]) == 2
    assert "[[mem/prefs/coffee]]" in second["prompt"][-2]["text"]  # every prompt gets its own
    # a relay that never answers: the prompt goes through untouched, nothing injected
    with listening_never_accepting() as hanging:
        silent = keys.agent_env(hanging, XDG_DATA_HOME=str(tmp_path / "silent"))
        async with proxied(tmp_path, silent, "--recall", "3", "--timeout", "1") as (conn, run):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            await conn.prompt(session_id=session.session_id, prompt=[text_block(question)])
    [prompt] = run.received("session/prompt")
    assert prompt["prompt"] == [user_block(question)]
    assert "recall not injected" in run.diagnostics()


def owner_api(keys: Keys, url: str) -> AgentMemory:
    env = {"ENGRAM_PRIVATE_KEY": keys.owner_sk.hex()}
    return AgentMemory(load_identity(None, None, keys.agent, env=env), [url], timeout=60)


async def test_a_first_name_is_resolved_against_cores_people(
    relay: RelayProcess, tmp_path: Path
) -> None:
    """Issue 49: core says who Mel is; a question by her full name or relation finds the
    turn that calls her Mel, in this process, in the next (the cache) and in a fresh
    build. Core no longer naming her (rewritten, or denied by the owner) undoes it."""
    keys = Keys.fresh()
    cache = tmp_path / "cache"
    mem = api(keys, relay.url, cache)
    mel, priya = "mem/chat/2024-03-02/001", "mem/chat/2024-03-02/002"
    await mem.set(mel, "Mel: I got the job at the bakery on Dock Street!")
    await mem.set(priya, "Priya: Congrats! My cousin starts at the harbour in May.")

    async def lexical(m: AgentMemory, query: str) -> list[str]:
        return [h.slug for h in (await m.recaller().recall(query, 10, "lexical")).hits]

    assert await lexical(mem, "Melanie") == [] and await lexical(mem, "sister") == []
    await mem.set("core", "I assist Sam. Mel is my sister Melanie; she bakes.")
    # positive: the question names her as core does, the memory as the chat did
    found = await mem.recall("Where did my sister Melanie get a job?", limit=3)
    assert found.hits[0].slug == mel and "core" not in [h.slug for h in found.hits]
    assert await lexical(mem, "Melanie") == [mel] and await lexical(mem, "sister") == [mel]
    assert await lexical(mem, "Priya cousin") == [priya]  # a name core does not know
    for fresh in (api(keys, relay.url, cache), api(keys, relay.url, tmp_path / "fresh")):
        assert await lexical(fresh, "Melanie") == [mel]  # the cache's, and a new build's
        await fresh.close()
    # negative twins: core rewritten without her, then denied by the owner
    await mem.set("core", "I assist Sam.")
    assert await lexical(mem, "Melanie") == [] and await lexical(mem, "sister") == []
    await mem.set("core", "I assist Sam. Mel is my sister Melanie.")
    assert await lexical(mem, "Melanie") == [mel]
    await owner_api(keys, relay.url).deny("core", reason="not who I am")
    assert await lexical(mem, "Melanie") == [] and await lexical(mem, "sister") == []
    for fresh in (api(keys, relay.url, cache), api(keys, relay.url, tmp_path / "after")):
        assert await lexical(fresh, "Melanie") == []
        await fresh.close()
    await mem.close()


async def test_a_first_build_of_many_pages_indexes_every_page(
    relay: RelayProcess, tmp_path: Path
) -> None:
    """A page is indexed while the relay serves the next (`Recall._everything`): every
    page of a read longer than the relay's max_limit (500) still ends up indexed, each
    memory as written, and a second process reading the cache holds the same."""
    from cli.nostr.client import connect_relay

    keys = Keys.fresh()
    n, base = 1_201, int(time.time()) - 5_000

    def note(i: int) -> Memory:
        return Memory(slug=f"mem/notes/n{i}", value=f"note {i} w{i}x")

    events = [
        build_event(keys.agent_sk, keys.owner, note(i), base + i, os.urandom(32), os.urandom(32))
        for i in range(n)
    ]
    client = await connect_relay(relay.url, keys.agent_sk)
    try:
        assert all(ok for ok, _ in (await client.try_publish_many(events)).values())
    finally:
        await client.close()
    for cache in (tmp_path / "cache", tmp_path / "cache"):  # a build, then its cache
        mem = api(keys, relay.url, cache)
        for i in (0, 1, 499, 500, 777, n - 1):  # each page's first and last
            found = await mem.recall(f"w{i}x", limit=1)
            assert found.hits[0].slug == f"mem/notes/n{i}", i
        index = mem.recaller().index
        assert index is not None and len(index) == n
        await mem.close()
