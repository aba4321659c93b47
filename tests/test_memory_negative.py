"""Negative evaluations (issue 39): what must NOT come back, on every read path, each
beside a positive twin that proves the same path returns live memory.

Hidden: a tombstoned value, a value refused as rejected, a value the owner denied, a
forgotten value, the memories of another owner (same agent) and of another agent (same
owner), and a fact whose validity has ended where the reader asked to hide it. The paths:
`engram mem` get/ls/search/recall/refs/log/diff/get --as-of/--rev as real processes, the
Python API, every MCP read tool through the `mcp` SDK's client, the ACP injections
(core, and `--recall`) through the real `engram acp` proxy, and every page of the
owner's review app (`engram review`).

History is history: a value that was live before its tombstone is what `get --as-of`
returns for that earlier time (the positive twin of the history paths); after the
tombstone no path returns it. A denied or forgotten value never comes back, whatever
time is asked for.

Every value carries a marker word; a path leaks when a hidden marker appears anywhere in
what it returns (stdout, stderr, tool results).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from acp import text_block
from acp_support import proxied
from cli_support import Keys, engram_async, put, shared_relay
from relay_fixtures import RelayProcess
from review_support import every_page, review_server
from test_mcp import stdio_server

from cli.memory.api import AgentMemory
from cli.memory.hook import NUDGE
from cli.nostr.errors import NotFoundError, RefusedError
from cli.nostr.identity import load_identity
from engram import Memory, build_event

LIVE = ["LIVEMARK", "ACCEPTEDMARK", "OURSMARK", "NOWMARK", "ENDEDMARK"]
HIDDEN = ["TOMBMARK", "REJECTMARK", "DENYMARK", "FORGETMARK", "OTHEROWNERMARK", "OTHERAGENTMARK"]
HIDDEN_SLUGS = ["mem/gone/tomb", "mem/gone/denied", "mem/gone/forgot"]
LIVE_SLUGS = ["mem/gone/rejected", "mem/live/city", "mem/shared/slug", "mem/valid/ended",
              "mem/valid/now"]  # fmt: skip
LIVE_MARKERS = {
    "mem/gone/rejected": "ACCEPTEDMARK",
    "mem/live/city": "LIVEMARK",
    "mem/shared/slug": "OURSMARK",
    "mem/valid/ended": "ENDEDMARK",
    "mem/valid/now": "NOWMARK",
}
PROFILE = "PROFILEMARK " + " ".join(f"[[{s}]]" for s in HIDDEN_SLUGS + LIVE_SLUGS)


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("negative-relay")))


def agent_api(keys: Keys, url: str, recall_dir: Path | None = None) -> AgentMemory:
    env = {"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()}
    ident = load_identity(None, keys.owner, None, env=env)
    return AgentMemory(ident, [url], timeout=60, recall_dir=recall_dir)


def owner_api(keys: Keys, url: str) -> AgentMemory:
    env = {"ENGRAM_PRIVATE_KEY": keys.owner_sk.hex()}
    return AgentMemory(load_identity(None, None, keys.agent, env=env), [url], timeout=60)


@dataclass
class World:
    keys: Keys
    url: str
    times: dict[str, int]  # when each removed value was still live
    ids: dict[str, str]  # version ids of those values
    data: Path  # XDG_DATA_HOME of every process here (recall's cache)


@pytest.fixture(scope="module")
async def world(relay: RelayProcess, tmp_path_factory: pytest.TempPathFactory) -> World:
    keys = Keys.fresh()
    url = relay.url
    a, o = agent_api(keys, url), owner_api(keys, url)
    now = int(time.time())
    times: dict[str, int] = {}
    ids: dict[str, str] = {}
    await a.set("live/city", "Lisbon LIVEMARK", trust="stated")
    tomb = await a.set("gone/tomb", "TOMBMARK old")
    await a.rm("gone/tomb", reason="wrong")
    await a.set("gone/rejected", "REJECTMARK")
    await a.rm("gone/rejected", reason="not true")
    with pytest.raises(RefusedError):
        await a.set("gone/rejected", "REJECTMARK")
    await a.set("gone/rejected", "ACCEPTEDMARK")
    denied = await a.set("gone/denied", "DENYMARK")
    await o.deny("gone/denied", reason="false")
    forgot = await a.set("gone/forgot", "FORGETMARK")
    await a.forget("gone/forgot")
    for name, result in (("tomb", tomb), ("denied", denied), ("forgot", forgot)):
        times[name], ids[name] = result.created_at, result.event_id
    # the same slug in another owner's and another agent's memory, and in ours
    other_owner = Keys(keys.agent_sk, os.urandom(32))
    other_agent = Keys(os.urandom(32), keys.owner_sk)
    await agent_api(other_owner, url).set("shared/slug", "OTHEROWNERMARK")
    await agent_api(other_owner, url).set("core", "OTHEROWNERMARK profile")
    await agent_api(other_agent, url).set("shared/slug", "OTHERAGENTMARK")
    await agent_api(other_agent, url).set("core", "OTHERAGENTMARK profile")
    await a.set("shared/slug", "OURSMARK")
    await a.set("valid/ended", "ENDEDMARK", valid_until=now - 3600)
    await a.set("valid/now", "NOWMARK", valid_from=now - 3600, valid_until=now + 10**8)
    await a.set("core", PROFILE)
    return World(keys, url, times, ids, tmp_path_factory.mktemp("negative-data"))


def leaks(text: str, markers: list[str] = HIDDEN) -> list[str]:
    return [m for m in markers if m in text]


def env_of(world: World, owner: bool = False) -> dict[str, str]:
    keys, data = world.keys, str(world.data)
    if owner:
        return keys.owner_env(world.url) | {"XDG_DATA_HOME": data}
    return keys.agent_env(world.url, XDG_DATA_HOME=data)


async def cli(world: World, *args: str, owner: bool = False) -> Any:
    if owner:
        args = (*args, "--agent", world.keys.agent)
    return await engram_async("mem", *args, env=env_of(world, owner))


def said(result: Any) -> str:
    return str(result.stdout.decode() + result.stderr.decode())


# --- engram mem, as real processes ---------------------------------------------------------


async def test_cli_current_reads(world: World) -> None:
    listed = await cli(world, "ls", "--json")
    assert sorted(r["slug"] for r in json.loads(listed.stdout)) == LIVE_SLUGS
    assert not leaks(said(listed))
    ended = {r["slug"]: r["ended"] for r in json.loads(listed.stdout)}
    assert ended["mem/valid/ended"] and not ended["mem/valid/now"]  # marked, not hidden
    now_only = await cli(world, "ls", "--valid-now", "--json")
    slugs = {r["slug"] for r in json.loads(now_only.stdout)}
    assert "mem/valid/ended" not in slugs and "mem/valid/now" in slugs

    found = await cli(world, "search", "MARK", "--limit", "100")
    assert not leaks(said(found))
    assert all(m in found.stdout.decode() for m in LIVE)
    found = await cli(world, "search", "MARK", "--limit", "100", "--valid-now")
    assert "ENDEDMARK" not in said(found) and "NOWMARK" in found.stdout.decode()

    recalled = await cli(world, "recall", "MARK memory", "--limit", "100", "--json")
    assert sorted(r["slug"] for r in json.loads(recalled.stdout)) == LIVE_SLUGS
    assert not leaks(said(recalled)) and all(m in said(recalled) for m in LIVE)
    recalled = await cli(world, "recall", "MARK memory", "--limit", "100", "--valid-now")
    assert "ENDEDMARK" not in said(recalled) and "NOWMARK" in said(recalled)

    refs = json.loads((await cli(world, "refs", "--json")).stdout)
    assert sorted(refs["reachable"]) == LIVE_SLUGS
    assert sorted(d["to"] for d in refs["dangling"]) == sorted(HIDDEN_SLUGS)

    for slug in HIDDEN_SLUGS:
        gone = await cli(world, "get", slug)
        assert gone.returncode == 1 and gone.stdout == b"" and not leaks(said(gone)), slug
    for slug, marker in LIVE_MARKERS.items():
        got = await cli(world, "get", slug)
        assert got.returncode == 0 and marker in got.stdout.decode() and not leaks(said(got))
    now = str(int(time.time()))
    assert (await cli(world, "get", "valid/ended", "--valid-at", now)).returncode == 1
    assert (await cli(world, "get", "valid/now", "--valid-at", now)).stdout == b"NOWMARK"


async def test_cli_history_reads(world: World) -> None:
    later = str(int(time.time()) + 1)
    # tombstoned: gone after the tombstone; its earlier value is history (the twin)
    after = await cli(world, "get", "gone/tomb", "--as-of", later)
    assert after.returncode == 1 and not leaks(said(after))
    before = await cli(world, "get", "gone/tomb", "--as-of", str(world.times["tomb"]))
    assert before.stdout == b"TOMBMARK old"
    # denied and forgotten: never, whatever time or version is asked for
    for name in ("denied", "forgot"):
        slug = f"gone/{name}"
        for args in (
            ("--as-of", str(world.times[name])),
            ("--as-of", later),
            ("--rev", world.ids[name]),
        ):
            got = await cli(world, "get", slug, *args)
            assert got.returncode == 1 and not leaks(said(got)), (slug, args)
            with pytest.raises(NotFoundError):  # the owner neither
                await owner_api(world.keys, world.url).get(
                    slug, as_of=int(args[1]) if args[0] == "--as-of" else None,
                    rev=args[1] if args[0] == "--rev" else None,
                )  # fmt: skip
        history = await cli(world, "log", slug, "--json")
        assert history.returncode == 0 and not leaks(said(history))
        diff = await cli(world, "diff", slug)
        assert not leaks(said(diff))
    forgot = json.loads((await cli(world, "log", "gone/forgot", "--json")).stdout)
    assert [v["state"] for v in forgot] == ["forgotten"]
    denied = json.loads((await cli(world, "log", "gone/denied", "--json")).stdout)
    assert [v["state"] for v in denied] == ["denied", "withheld"]
    # another owner's and another agent's memory: ours only, at any time
    got = await cli(world, "get", "shared/slug", "--as-of", later)
    assert got.stdout == b"OURSMARK" and not leaks(said(got))
    live = await cli(world, "log", "live/city")
    assert live.returncode == 0 and len(live.stdout.splitlines()) == 1  # the twin of log


# --- the Python API ---------------------------------------------------------------------------


async def test_python_api(world: World) -> None:
    mem = agent_api(world.keys, world.url)
    for slug in HIDDEN_SLUGS:
        with pytest.raises(NotFoundError):
            await mem.get(slug)
    assert (await mem.get("live/city")).value == "Lisbon LIVEMARK"
    assert (await mem.get("live/city")).trust == "stated"
    views = (await mem.live()).views
    assert sorted(s for s in views if s != "core") == LIVE_SLUGS
    assert not leaks(json.dumps([v.value for v in views.values()]))
    assert "mem/valid/ended" not in (await mem.live(valid_now=True)).views
    assert [e.slug for e in (await mem.ls()).entries] == LIVE_SLUGS
    hits = await mem.search("MARK", limit=100)
    assert not leaks(json.dumps([h.snippet for h in hits]))
    assert {h.slug for h in hits} == {*LIVE_SLUGS, "core"}
    refs = await mem.refs()
    assert sorted(refs.reachable) == LIVE_SLUGS
    for name in ("denied", "forgot"):
        with pytest.raises(NotFoundError):
            await mem.get(f"gone/{name}", as_of=world.times[name])
        with pytest.raises(NotFoundError):
            await mem.get(f"gone/{name}", rev=world.ids[name])
    assert (await mem.get("gone/tomb", as_of=world.times["tomb"])).value == "TOMBMARK old"
    with pytest.raises(NotFoundError):
        await mem.get("gone/tomb", as_of=int(time.time()) + 1)
    owner = owner_api(world.keys, world.url)
    assert [e.slug for e in (await owner.ls()).entries] == LIVE_SLUGS  # the owner sees alike
    # views(): every slug with its state (what the review page lists), values only if live
    lives, _ = await owner.views()
    states = {slug: lives[slug].state for slug in HIDDEN_SLUGS}
    assert states == {
        "mem/gone/tomb": "removed",
        "mem/gone/denied": "denied",
        "mem/gone/forgot": "forgotten",
    }
    assert lives["mem/gone/denied"].denial is not None  # the verdict, with its reason
    assert not leaks(json.dumps([lv.text for lv in lives.values()]))
    assert all(m in (lives[s].text or "") for s, m in LIVE_MARKERS.items())  # the twins
    # log(): the values a history shows, never a withheld or forgotten one
    for slug in ("gone/denied", "gone/forgot"):
        assert not leaks(json.dumps((await owner.log(slug)).values))
    assert list((await owner.log("gone/tomb")).values.values()) == ["TOMBMARK old"]  # history
    assert list((await mem.log("live/city")).values.values()) == ["Lisbon LIVEMARK"]
    recall = agent_api(world.keys, world.url, world.data / "api")
    found = await recall.recall("MARK memory", limit=100)
    assert sorted(h.slug for h in found) == LIVE_SLUGS
    assert not leaks(json.dumps([h.value for h in found]))
    later = await recall.recall("MARK memory", limit=100, valid_now=True)
    assert "mem/valid/ended" not in {h.slug for h in later}
    await recall.close()


async def test_recall_follows_verdicts_made_after_its_index(
    relay: RelayProcess, tmp_path: Path
) -> None:
    """Recall keeps an index between calls and runs: a verdict written after it was built
    still decides, warm (the same object) and cold (a new one, from the cache file)."""
    keys = Keys.fresh()
    agent = agent_api(keys, relay.url, tmp_path)
    await agent.set("diet", "RECALLDENIED vegan")
    await agent.set("city", "RECALLOLD Berlin")
    assert {h.slug for h in await agent.recall("vegan Berlin", limit=10)} == {
        "mem/diet", "mem/city",
    }  # fmt: skip
    owner = owner_api(keys, relay.url)
    await owner.deny("diet", reason="eats fish")
    await owner.set("city", "RECALLNEW Lisbon")
    for mem in (agent, agent_api(keys, relay.url, tmp_path)):
        hits = list(await mem.recall("vegan Berlin Lisbon", limit=10))
        assert [h.slug for h in hits] == ["mem/city"]
        assert (hits[0].value, hits[0].role, hits[0].trust) == (
            "RECALLNEW Lisbon", "owner", "confirmed",
        )  # fmt: skip
        await mem.close()
    # the agent's key writing the denied value without the extension: withheld all the same
    plain = build_event(
        keys.agent_sk, keys.owner, Memory("mem/diet", "RECALLDENIED vegan"),
        int(time.time()) + 1, os.urandom(32), os.urandom(32),
    )  # fmt: skip
    await put(relay.url, [plain], keys.agent_sk)
    assert "mem/diet" not in {h.slug for h in await agent.recall("vegan", limit=10)}
    await agent.close()


# --- MCP, through the official SDK's client -----------------------------------------------------


async def test_mcp_tools(world: World, tmp_path: Path) -> None:
    keys = world.keys
    sessions = [env_of(world), env_of(world, owner=True)]
    for env, args in zip(sessions, [(), ("--agent", keys.agent)], strict=True):
        async with stdio_server(env, *args, log_dir=tmp_path) as server:
            for slug in HIDDEN_SLUGS:
                await server.error("memory_get", "not_found", slug=slug)
            got = await server.ok("memory_get", slug="live/city")
            assert got.content[0].text == "Lisbon LIVEMARK"
            assert got.structured_content["trust"] == "stated"
            listed = await server.ok("memory_list")
            rows = listed.structured_content["memories"]
            assert [r["slug"] for r in rows] == LIVE_SLUGS
            now = await server.ok("memory_list", valid_now=True)
            assert "mem/valid/ended" not in {r["slug"] for r in now.structured_content["memories"]}
            found = await server.ok("memory_search", query="MARK", limit=100)
            assert {m["slug"] for m in found.structured_content["matches"]} == {*LIVE_SLUGS, "core"}
            refs = await server.ok("memory_refs")
            assert sorted(refs.structured_content["reachable"]) == LIVE_SLUGS
            recalled = await server.ok("memory_recall", query="MARK memory", limit=100)
            slugs = sorted(r["slug"] for r in recalled.structured_content["memories"])
            assert slugs == LIVE_SLUGS
            for name in ("denied", "forgot"):
                slug = f"gone/{name}"
                await server.error("memory_get", "not_found", slug=slug, rev=world.ids[name])
                await server.error(
                    "memory_get", "not_found", slug=slug, as_of=str(world.times[name])
                )
                await server.ok("memory_log", slug=slug)
            assert "PROFILEMARK" in await server.core_resource()
            assert not leaks("\n".join(server.results))
            old = await server.ok("memory_get", slug="gone/tomb", as_of=str(world.times["tomb"]))
            assert old.content[0].text == "TOMBMARK old"  # history before the tombstone


# --- the ACP injection, through the real proxy --------------------------------------------------


async def acp_injected(env: dict[str, str], tmp_path: Path, *options: str) -> str:
    """Every block the proxy put in front of the first prompt, joined."""
    async with proxied(tmp_path, env, *options) as (conn, run):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("MARK memory")])
    [prompt] = run.received("session/prompt")
    return "\n\n".join(str(b["text"]) for b in prompt["prompt"][:-1])


async def test_acp_injection(world: World, relay: RelayProcess, tmp_path: Path) -> None:
    # the twin: a live core is injected, with its trust; nothing hidden rides along
    text = await acp_injected(world.keys.agent_env(relay.url), tmp_path)
    assert "PROFILEMARK" in text and "Profile trust: guess" in text
    assert not leaks(text)
    # --recall: the live memories most relevant to the prompt, never a hidden one
    options = ("--recall", "20", "--timeout", "60")
    text = await acp_injected(env_of(world), tmp_path, *options)
    assert all(f"[[{s}]]" in text for s in LIVE_SLUGS) and not leaks(text)
    # a core the owner denied reads as absent: the onboarding nudge, never the profile
    denied = Keys.fresh()
    await agent_api(denied, relay.url).set("core", "DENIEDCORE profile")
    await owner_api(denied, relay.url).deny("core", reason="not who I am")
    text = await acp_injected(denied.agent_env(relay.url), tmp_path)
    assert text == NUDGE and "DENIEDCORE" not in text
    # a core the owner corrected: the owner's value, marked as the owner's
    corrected = Keys.fresh()
    await agent_api(corrected, relay.url).set("core", "AGENTCORE old")
    await owner_api(corrected, relay.url).set("core", "OWNERCORE new")
    text = await acp_injected(corrected.agent_env(relay.url), tmp_path)
    assert "OWNERCORE new" in text and "AGENTCORE" not in text and "your owner" in text


# --- the review page (engram review), as the owner opens it ----------------------------------


async def test_review_pages(world: World, tmp_path: Path) -> None:
    """Every page a person reaches on the owner's review app (the lists, each memory with
    its history, the confirmation pages its links lead to, core, changes): a denied or
    forgotten value, another owner's or agent's, is on none; a removed one is shown only
    as history (never as a live value); the not-live list names them without a value."""
    keys = world.keys
    async with review_server(
        env_of(world, owner=True), "--agent", keys.agent, log_dir=tmp_path, state_dir=tmp_path
    ) as server:
        pages = await every_page(server)
    current = {p: h for p, h in pages.items() if not p.startswith(("m/", "act/restore/"))}
    values = "\n".join(re.findall(r'id="value">(.*?)</pre>', "\n".join(pages.values()), re.S))
    assert not leaks("\n".join(pages.values()), HIDDEN[2:])  # denied, forgotten, others
    assert not leaks("\n".join(current.values()) + values)  # removed: not as live either
    assert all(m in pages[""] for m in LIVE_MARKERS.values())  # the positive twins
    assert "TOMBMARK old" in pages["m/mem/gone/tomb"]  # its history: restorable
    gone = pages["?show=gone"]
    for slug, state in (
        ("mem/gone/tomb", "removed"),
        ("mem/gone/denied", "denied by the owner"),
        ("mem/gone/forgot", "forgotten"),
    ):
        row = gone[gone.index(f">{slug}<") :].split("</tr>")[0]
        assert state in row, (slug, row)
    listed = re.findall(r'<td class="slug"><a [^>]*>([^<]+)</a>', pages[""])
    assert sorted(s for s in listed if s != "core") == LIVE_SLUGS
