"""`engram mcp` end to end: the `mcp` SDK's own client against
`python -m cli.commands.main mcp` as a real process (stdio and streamable HTTP), on a real
relay process on real PostgreSQL.

Every test uses a fresh agent/owner pair. Tool errors are the contract: `isError`, one line
`CODE: message`, and `{"code", "message"}` as structured content.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import socket
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from cli_support import (
    ENGRAM,
    ROOT,
    Keys,
    clean_env,
    closed_port,
    engram,
    listening_never_accepting,
    ok_dropping_proxy,
    shared_relay,
    stalling_relays,
)
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult
from nostr_client import Client as NostrClient
from relay_fixtures import RelayProcess, free_port, proxied_env

from cli.commands.mcp import parse_http
from cli.nostr.identity import InputError
from engram.nip01 import Event, pubkey_of
from engram.nip19 import nsec

READ_TOOLS = {
    "memory_get",
    "memory_hash",
    "memory_list",
    "memory_search",
    "memory_recall",
    "memory_refs",
    "memory_log",
}
WRITE_TOOLS = {"memory_set", "memory_patch", "memory_delete", "memory_revert"}
OWNER_TOOLS = {"memory_set", "memory_patch", "memory_revert", "memory_confirm", "memory_deny"}
CALL_BOUND = 120.0  # generous outer bound for one MCP call on a loaded machine
TOKEN = secrets.token_urlsafe(24)  # the HTTP servers' bearer token (ENGRAM_MCP_TOKEN)


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("mcp-relay")))


@pytest.fixture
def keys() -> Keys:
    return Keys.fresh()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def secrets_of(*seckeys: bytes) -> list[str]:
    """Every form a secret key could leak in: hex (both cases) and nsec."""
    return [form for sk in seckeys for form in (sk.hex(), sk.hex().upper(), nsec(sk))]


# --- running the server -----------------------------------------------------------------------


class Server:
    """One `engram mcp` process seen through the SDK's client, plus its captured output."""

    def __init__(self, client: Client, log_path: Path) -> None:
        self.client = client
        self.log_path = log_path
        self.results: list[str] = []  # every result received, as JSON, for the secret check

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def call(self, tool: str, **arguments: Any) -> CallToolResult:
        result = await asyncio.wait_for(self.client.call_tool(tool, arguments), CALL_BOUND)
        self.results.append(result.model_dump_json())
        return result

    async def ok(self, tool: str, **arguments: Any) -> CallToolResult:
        result = await self.call(tool, **arguments)
        assert not result.is_error, result.content
        return result

    async def error(self, tool: str, code: str, **arguments: Any) -> str:
        """The call fails with `code`; returns its one-line message."""
        result = await self.call(tool, **arguments)
        assert result.is_error, result
        assert len(result.content) == 1
        text = result.content[0].text  # type: ignore[union-attr]
        assert "\n" not in text and text.startswith(f"{code}: "), text
        assert result.structured_content == {"code": code, "message": text[len(code) + 2 :]}
        return text

    async def tool_names(self) -> set[str]:
        listed = await asyncio.wait_for(self.client.list_tools(), CALL_BOUND)
        return {tool.name for tool in listed.tools}

    async def core_resource(self) -> str:
        read = await asyncio.wait_for(self.client.read_resource("engram://core"), CALL_BOUND)
        self.results.append(read.model_dump_json())
        assert len(read.contents) == 1
        return read.contents[0].text  # type: ignore[union-attr]

    async def core_prompt(self) -> list[str]:
        prompt = await asyncio.wait_for(self.client.get_prompt("core_profile"), CALL_BOUND)
        self.results.append(prompt.model_dump_json())
        return [m.content.text for m in prompt.messages]  # type: ignore[union-attr]


@contextlib.asynccontextmanager
async def stdio_server(env: dict[str, str], *args: str, log_dir: Path) -> AsyncIterator[Server]:
    """`engram mcp ARGS` on stdio; its stderr goes to a file the test can read."""
    log_path = log_dir / f"mcp-stdio-{os.urandom(4).hex()}.log"
    params = StdioServerParameters(
        command=ENGRAM[0], args=[*ENGRAM[1:], "mcp", *args], env=env, cwd=ROOT
    )
    with open(log_path, "w") as errlog:
        transport = stdio_client(params, errlog=errlog)
        async with Client(transport, read_timeout_seconds=CALL_BOUND) as client:
            yield Server(client, log_path)


def _wait_port(port: int, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 120  # outer bound for start-up under load
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engram mcp exited {proc.returncode}:\n{log_path.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"engram mcp --http did not listen:\n{log_path.read_text()}")


def bearer_client(token: str | None) -> httpx2.AsyncClient:
    """The HTTP client under the SDK's: sends `Authorization: Bearer token` when given."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))


@contextlib.asynccontextmanager
async def http_process(
    env: dict[str, str], *args: str, log_dir: Path
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """`engram mcp --http 127.0.0.1:PORT ARGS` listening: (its URL, the process, its log)."""
    port = free_port()
    log_path = log_dir / f"mcp-http-{port}.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [*ENGRAM, "mcp", "--http", f"127.0.0.1:{port}", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    try:
        await asyncio.to_thread(_wait_port, port, proc, log_path)
        yield f"http://127.0.0.1:{port}/mcp", proc, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.asynccontextmanager
async def http_server(env: dict[str, str], *args: str, log_dir: Path) -> AsyncIterator[Server]:
    """`engram mcp --http 127.0.0.1:PORT ARGS` (the bearer token from ENGRAM_MCP_TOKEN,
    TOKEN unless `env` sets one); stdout and stderr go to one file."""
    env = {"ENGRAM_MCP_TOKEN": TOKEN, **env}
    async with (
        http_process(env, *args, log_dir=log_dir) as (url, _, log_path),
        bearer_client(env["ENGRAM_MCP_TOKEN"]) as http,
        Client(
            streamable_http_client(url, http_client=http), read_timeout_seconds=CALL_BOUND
        ) as client,
    ):
        yield Server(client, log_path)


SERVERS = {"stdio": stdio_server, "http": http_server}


async def stored_events(relay: RelayProcess, keys: Keys) -> list[Event]:
    """Everything the relay holds for this pair, fetched as the agent (not via the server)."""
    async with await NostrClient.connect(relay.url) as c:
        await c.auth(keys.agent_sk, relay.url, int(time.time()))
        raw = await c.query({"kinds": [30174], "authors": [keys.agent], "#p": [keys.owner]})
    return [Event(**e) for e in raw]


# --- tests ------------------------------------------------------------------------------------


async def test_tools_and_input_schemas(relay: RelayProcess, keys: Keys, tmp_path: Path) -> None:
    async with stdio_server(keys.agent_env(relay.url), log_dir=tmp_path) as server:
        listed = await server.client.list_tools()
        tools = {tool.name: tool for tool in listed.tools}
        assert set(tools) == READ_TOOLS | WRITE_TOOLS

        def schema(name: str) -> tuple[set[str], set[str]]:
            s = tools[name].input_schema
            assert s["type"] == "object"
            return set(s.get("properties", {})), set(s.get("required", []))

        assert schema("memory_get") == ({"slug", "as_of", "rev", "valid_at"}, {"slug"})
        assert schema("memory_hash") == ({"slug"}, {"slug"})
        assert schema("memory_set") == (
            {"slug", "value", "trust", "source", "valid_from", "valid_until", "force"},
            {"slug", "value"},
        )
        assert schema("memory_patch") == (
            {"slug", "diff", "base_hash", "force"},
            {"slug", "diff", "base_hash"},
        )
        assert schema("memory_delete") == ({"slug", "reason"}, {"slug"})
        assert schema("memory_revert") == ({"slug", "rev", "force"}, {"slug", "rev"})
        assert schema("memory_log") == ({"slug"}, {"slug"})
        assert schema("memory_list") == ({"valid_now"}, set())
        assert schema("memory_search") == ({"query", "limit", "regex", "valid_now"}, {"query"})
        assert schema("memory_recall") == ({"query", "limit", "valid_now"}, {"query"})
        assert schema("memory_refs") == (set(), set())
        base_hash = tools["memory_patch"].input_schema["properties"]["base_hash"]
        assert base_hash["type"] == "string" and "64" in base_hash["pattern"]
        for name in ("memory_get", "memory_set", "memory_patch", "memory_delete"):
            prop = tools[name].input_schema["properties"]["slug"]
            assert prop["type"] == "string" and prop["description"]

        # the descriptions teach the conventions
        assert "core" in tools["memory_get"].description
        assert "[[mem/" in tools["memory_get"].description
        assert "base_hash" in tools["memory_set"].description
        assert "memory_patch" in tools["memory_set"].description
        assert "conflict" in tools["memory_patch"].description
        assert all(tools[n].annotations.read_only_hint for n in READ_TOOLS)
        assert not any(tools[n].annotations.read_only_hint for n in WRITE_TOOLS)
        assert tools["memory_delete"].annotations.destructive_hint

        resources = await server.client.list_resources()
        assert [str(r.uri) for r in resources.resources] == ["engram://core"]
        prompts = await server.client.list_prompts()
        assert [p.name for p in prompts.prompts] == ["core_profile"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_every_tool_round_trips(
    relay: RelayProcess, keys: Keys, tmp_path: Path, transport: str
) -> None:
    env = keys.agent_env(relay.url)
    async with SERVERS[transport](env, log_dir=tmp_path) as server:
        # no core yet: the relay confirmed it, so the nudge (never an error)
        assert "no core profile" in await server.core_resource()
        [nudge] = await server.core_prompt()
        assert "memory_set" in nudge and "core" in nudge

        value = "one\ntwo\nthree\n"
        saved = await server.ok("memory_set", slug="notes/x", value=value)
        assert saved.structured_content["slug"] == "mem/notes/x"
        assert saved.structured_content["sha256"] == sha(value)

        got = await server.ok("memory_get", slug="notes/x")
        assert got.content[0].text == value  # exact bytes, nothing added
        expected = {"slug": "mem/notes/x", "value": value, "sha256": sha(value)}
        assert expected.items() <= got.structured_content.items()
        assert got.structured_content["relays"]["answered"] == [relay.url]
        assert sha(value) in got.content[1].text
        same = await server.ok("memory_get", slug="mem/notes/x")
        assert same.content[0].text == value

        hashed = await server.ok("memory_hash", slug="notes/x")
        assert hashed.content[0].text == sha(value)

        diff = "--- a\n+++ b\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
        patched = await server.ok("memory_patch", slug="notes/x", diff=diff, base_hash=sha(value))
        new = "one\nTWO\nthree\n"
        assert patched.structured_content["sha256"] == sha(new)
        assert (await server.ok("memory_get", slug="notes/x")).content[0].text == new
        # written through MCP, read by the CLI: the same memory, the same format
        assert engram("mem", "get", "notes/x", env=env).stdout == new.encode()

        profile = "I am the test agent. Notes: [[mem/notes/x]] and [[mem/gone]]."
        await server.ok("memory_set", slug="core", value=profile)
        await server.ok("memory_set", slug="loose", value="nobody links here")
        listed = await server.ok("memory_list")
        slugs = [row["slug"] for row in listed.structured_content["memories"]]
        assert slugs == ["mem/loose", "mem/notes/x"]
        assert "mem/notes/x" in listed.content[0].text

        refs = await server.ok("memory_refs")
        assert (
            refs.structured_content.items()
            >= {
                "core": True,
                "reachable": ["mem/notes/x"],
                "orphans": ["mem/loose"],
                "dangling": [{"from": "core", "to": "mem/gone"}],
            }.items()
        )

        found = await server.ok("memory_search", query="NOBODY")
        assert [m["slug"] for m in found.structured_content["matches"]] == ["mem/loose"]
        assert "nobody links here" in found.content[0].text
        found = await server.ok("memory_search", query="t[wW]o", regex=True, limit=5)
        assert [m["slug"] for m in found.structured_content["matches"]] == ["mem/notes/x"]
        await server.error("memory_search", "bad_input", query="")
        await server.error("memory_search", "bad_input", query="(", regex=True)

        resource = await server.core_resource()
        assert profile in resource and "memory_patch" in resource
        [message] = await server.core_prompt()
        assert profile in message

        deleted = await server.ok("memory_delete", slug="loose")
        assert deleted.structured_content["slug"] == "mem/loose"
        await server.error("memory_get", "not_found", slug="loose")
        await server.error("memory_delete", "not_found", slug="loose")
        listed = await server.ok("memory_list")
        assert [r["slug"] for r in listed.structured_content["memories"]] == ["mem/notes/x"]

        # exact bytes both ways, up to the size limit
        for odd in ("héllo\r\nwörld 🎉\n\n", "", "x" * 65_000):
            await server.ok("memory_set", slug="odd", value=odd)
            got = await server.ok("memory_get", slug="odd")
            assert got.content[0].text == odd and got.structured_content["sha256"] == sha(odd)

        # bad input: refused before anything is sent, one coded line each
        await server.error("memory_delete", "bad_input", slug="core")
        await server.error("memory_get", "bad_input", slug="Not A Slug")
        await server.error("memory_set", "bad_input", slug="big", value="x" * 70_000)
        await server.error("memory_set", "bad_input", slug="big", value="é" * 40_000)
        await server.error("memory_get", "bad_input")
        await server.error("memory_patch", "bad_input", slug="notes/x", diff=diff, base_hash="ab")
        bad_diff = "--- a\n+++ b\n@@ -1 +1 @@\n-nope\n+yes\n"
        await server.error(
            "memory_patch", "bad_input", slug="notes/x", diff=bad_diff, base_hash=sha(new)
        )
        await server.error("memory_nope", "bad_input")
        assert (await server.ok("memory_get", slug="notes/x")).content[0].text == new


async def test_stale_base_hash_is_a_conflict_and_changes_nothing(
    relay: RelayProcess, keys: Keys, tmp_path: Path
) -> None:
    async with stdio_server(keys.agent_env(relay.url), log_dir=tmp_path) as server:
        await server.ok("memory_set", slug="plan", value="a\nb\n")
        stale = (await server.ok("memory_hash", slug="plan")).content[0].text
        await server.ok("memory_set", slug="plan", value="a\nB\n")  # someone else's edit
        before = sorted(e.id for e in await stored_events(relay, keys))

        diff = "--- a\n+++ b\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
        message = await server.error(
            "memory_patch", "conflict", slug="plan", diff=diff, base_hash=stale
        )
        assert sha("a\nB\n") in message  # says what the value hashes to now

        assert sorted(e.id for e in await stored_events(relay, keys)) == before
        assert (await server.ok("memory_get", slug="plan")).content[0].text == "a\nB\n"


async def test_relay_down_is_a_relay_error_and_the_server_keeps_serving(
    start_relay: Any, keys: Keys, tmp_path: Path
) -> None:
    own = start_relay()
    # the deadline is for the first call, to a live relay on a loaded machine; once it is
    # stopped, connections are refused at once
    async with stdio_server(keys.agent_env(own.url), "--timeout", "10", log_dir=tmp_path) as server:
        await server.ok("memory_set", slug="core", value="profile")
        own.stop()
        for tool, args in [
            ("memory_get", {"slug": "core"}),
            ("memory_set", {"slug": "x", "value": "y"}),
            ("memory_list", {}),
        ]:
            await server.error(tool, "relay", **args)
        # a failed read is never the nudge: no prompt message, an empty resource
        assert await server.core_prompt() == []
        assert await server.core_resource() == ""
        assert await server.tool_names() == READ_TOOLS | WRITE_TOOLS


async def test_hanging_relay_times_out_as_a_relay_error(keys: Keys, tmp_path: Path) -> None:
    with listening_never_accepting() as url:
        env = keys.agent_env(url)
        async with stdio_server(env, "--timeout", "1", log_dir=tmp_path) as server:
            for _ in range(2):  # the second call proves the server still answers
                message = await server.error("memory_get", "relay", slug="notes/x")
                assert "timed out" in message
            await server.error("memory_set", "relay", slug="notes/x", value="v")
            assert await server.core_prompt() == []
            assert await server.tool_names() == READ_TOOLS | WRITE_TOOLS

    env = keys.agent_env(f"ws://127.0.0.1:{closed_port()}")
    async with http_server(env, "--timeout", "1", log_dir=tmp_path) as server:
        await server.error("memory_list", "relay")
        await server.error("memory_refs", "relay")


EVERY_CALL = [
    ("memory_get", {"slug": "notes/x"}),
    ("memory_hash", {"slug": "notes/x"}),
    ("memory_list", {}),
    ("memory_search", {"query": "x"}),
    ("memory_recall", {"query": "x"}),
    ("memory_refs", {}),
    ("memory_set", {"slug": "notes/x", "value": "v"}),
    ("memory_patch", {"slug": "notes/x", "diff": "", "base_hash": "0" * 64}),
    ("memory_delete", {"slug": "notes/x"}),
    ("memory_log", {"slug": "notes/x"}),
    ("memory_revert", {"slug": "notes/x", "rev": "0" * 64}),
]


async def test_every_tool_errors_when_the_relay_accepts_and_never_answers(
    keys: Keys, tmp_path: Path
) -> None:
    """A server that accepts the TCP connection and says nothing (before or after the
    websocket handshake): every tool, the resource and the prompt end at the deadline."""
    assert {tool for tool, _ in EVERY_CALL} == READ_TOOLS | WRITE_TOOLS

    async def every_call_ends(url: str) -> None:
        env = keys.agent_env(url)
        async with stdio_server(env, "--timeout", "2", log_dir=tmp_path) as server:
            # all at once: each waits out its own deadline, none waits behind another's
            messages = await asyncio.gather(
                *(server.error(tool, "relay", **args) for tool, args in EVERY_CALL)
            )
            for message in messages:
                assert "timed out" in message or "no answer" in message, message
            assert await server.core_prompt() == []
            assert await server.core_resource() == ""

    async with stalling_relays() as stalled:
        await asyncio.gather(*(every_call_ends(url) for url in stalled))


async def test_a_catastrophic_regex_is_bad_input_and_the_server_keeps_serving(
    relay: RelayProcess, keys: Keys, tmp_path: Path
) -> None:
    """`(a|aa)+$` against 60 a's and a `!` backtracks for longer than anyone waits: it is
    matched with a time limit, off the event loop."""
    async with stdio_server(keys.agent_env(relay.url), log_dir=tmp_path) as server:
        await server.ok("memory_set", slug="notes/aaa", value="a" * 60 + "!")
        message = await server.error("memory_search", "bad_input", query="(a|aa)+$", regex=True)
        assert "regular expression" in message and "simplify" in message
        found = await server.ok("memory_search", query="a+!$", regex=True)
        assert [m["slug"] for m in found.structured_content["matches"]] == ["mem/notes/aaa"]


HOSTILE_PATTERNS = {
    # pattern: words of the refusal (the limit it names)
    "((a{200}){200}){100}": "10,000 elements",  # 4 million nodes: seconds and a gigabyte
    "(?:x{65535}){1000}": "10,000 elements",  # 65 million: more memory than the machine has
    "(" * 30 + "x" + ")" * 30: "20 deep",
    "x" * 1_001: "at most 1000 characters",  # the tool's argument schema says so first
}


def rss_bytes(pid: int) -> int:
    """The resident set of process `pid`, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def test_a_hostile_pattern_is_refused_and_another_client_is_answered(
    relay: RelayProcess, keys: Keys, tmp_path: Path
) -> None:
    """Issue 46 item 7: a pattern whose compiled form would be enormous is refused before
    anything is compiled, naming the limit it passed, while a second client of the same
    HTTP server is answered; the server does not grow by what compiling it would take."""
    env = {"ENGRAM_MCP_TOKEN": TOKEN, **keys.agent_env(relay.url)}
    # written by another process: the server's own writes would load recall's model, whose
    # memory would blur what the server's growth below measures
    written = engram("mem", "set", "notes/xs", "x" * 50, env=keys.agent_env(relay.url))
    assert written.returncode == 0, written.stderr
    async with (
        http_process(env, log_dir=tmp_path) as (url, proc, log_path),
        bearer_client(TOKEN) as first_http,
        bearer_client(TOKEN) as second_http,
        Client(
            streamable_http_client(url, http_client=first_http), read_timeout_seconds=CALL_BOUND
        ) as first_client,
        Client(
            streamable_http_client(url, http_client=second_http), read_timeout_seconds=CALL_BOUND
        ) as second_client,
    ):
        hostile, other = Server(first_client, log_path), Server(second_client, log_path)
        found = await hostile.ok("memory_search", query="x{50}", regex=True)
        assert [m["slug"] for m in found.structured_content["matches"]] == ["mem/notes/xs"]
        before = rss_bytes(proc.pid)
        for pattern, limit in HOSTILE_PATTERNS.items():
            refused, answered = await asyncio.gather(
                hostile.error("memory_search", "bad_input", query=pattern, regex=True),
                other.ok("memory_get", slug="notes/xs"),
            )
            assert limit in refused, refused
            assert answered.content[0].text == "x" * 50  # type: ignore[union-attr]
        grown = rss_bytes(proc.pid) - before
        assert grown < 100 * 2**20, f"the server grew by {grown / 2**20:.0f} MiB"
        # a pattern inside the limits still compiles and matches (the same server)
        again = await hostile.ok("memory_search", query="(?:x{5}){10}", regex=True)
        assert [m["slug"] for m in again.structured_content["matches"]] == ["mem/notes/xs"]


async def test_a_write_cut_off_at_its_deadline_may_have_been_written(
    start_relay: Any, keys: Keys, tmp_path: Path
) -> None:
    """The relay stores the event but its OK never arrives: the error must not read as
    "nothing was written"."""
    proxy_port = free_port()  # the relay's public URLs: its own and the proxy's
    relay = start_relay(env=proxied_env(proxy_port))
    async with ok_dropping_proxy(relay.url, port=proxy_port) as mute:
        env = keys.agent_env(mute)
        # long enough to read the head and send the EVENT through the proxy when loaded
        async with stdio_server(env, "--timeout", "8", log_dir=tmp_path) as server:
            message = await server.error("memory_set", "relay", slug="notes/x", value="kept")
            assert "MAY have been written" in message, message
    async with stdio_server(keys.agent_env(relay.url), log_dir=tmp_path) as server:
        assert (await server.ok("memory_get", slug="notes/x")).content[0].text == "kept"


async def test_a_relay_set_in_engram_relay(start_relay: Any, keys: Keys, tmp_path: Path) -> None:
    """ENGRAM_RELAY as a set: writes go to every relay, a failed relay is named, not fatal."""
    first, second = start_relay(), start_relay()
    env = keys.agent_env(f"{first.url},{second.url}")
    async with stdio_server(env, "--timeout", "5", log_dir=tmp_path) as server:
        saved = await server.ok("memory_set", slug="notes/x", value="on both")
        assert saved.structured_content["relays"]["answered"] == [first.url, second.url]
        second.stop()
        got = await server.ok("memory_get", slug="notes/x")
        assert got.content[0].text == "on both"
        assert list(got.structured_content["relays"]["failed"]) == [second.url]
        assert got.content[-1].text.startswith("note: ") and second.url in got.content[-1].text
        saved = await server.ok("memory_set", slug="notes/y", value="on one")
        assert list(saved.structured_content["refused"]) == [second.url]
        listed = await server.ok("memory_list")
        slugs = [r["slug"] for r in listed.structured_content["memories"]]
        assert slugs == ["mem/notes/x", "mem/notes/y"]


async def test_a_third_key_cannot_read_the_agents_memory(
    relay: RelayProcess, keys: Keys, tmp_path: Path
) -> None:
    secret = "the agent's secret plan"
    async with stdio_server(keys.agent_env(relay.url), log_dir=tmp_path) as agent:
        await agent.ok("memory_set", slug="plan", value=secret)
        await agent.ok("memory_set", slug="core", value=f"profile [[mem/plan]] {secret}")

    third = os.urandom(32)
    as_agent = clean_env(
        ENGRAM_PRIVATE_KEY=third.hex(), ENGRAM_OWNER=keys.owner, ENGRAM_RELAY=relay.url
    )
    as_owner = clean_env(ENGRAM_PRIVATE_KEY=third.hex(), ENGRAM_RELAY=relay.url)
    for env, args in [(as_agent, ()), (as_owner, ("--agent", keys.agent))]:
        async with stdio_server(env, *args, log_dir=tmp_path) as server:
            await server.error("memory_get", "not_found", slug="plan")
            await server.error("memory_get", "not_found", slug="core")
            listed = await server.ok("memory_list")
            assert listed.structured_content["memories"] == []
            found = await server.ok("memory_search", query="secret")
            assert found.structured_content["matches"] == []
            await server.ok("memory_refs")
            await server.core_resource()
            await server.core_prompt()
            everything = "".join(server.results) + server.log()
            assert secret not in everything


async def test_owner_session_reads_and_offers_verdicts_not_deletion(
    relay: RelayProcess, keys: Keys, tmp_path: Path
) -> None:
    async with stdio_server(keys.agent_env(relay.url), log_dir=tmp_path) as agent:
        await agent.ok("memory_set", slug="notes/x", value="for the owner")
        await agent.ok("memory_set", slug="core", value="agent profile [[mem/notes/x]]")

    env = keys.owner_env(relay.url)
    for transport in ("stdio", "http"):
        async with SERVERS[transport](env, "--agent", keys.agent, log_dir=tmp_path) as owner:
            assert await owner.tool_names() == READ_TOOLS | OWNER_TOOLS
            listed = await owner.ok("memory_list")
            assert [r["slug"] for r in listed.structured_content["memories"]] == ["mem/notes/x"]
            got = await owner.ok("memory_get", slug="notes/x")
            assert got.content[0].text == "for the owner"
            assert (await owner.ok("memory_refs")).structured_content["reachable"] == [
                "mem/notes/x"
            ]
            assert "agent profile" in await owner.core_resource()
            message = await owner.error("memory_delete", "bad_input", slug="notes/x")
            assert "memory_deny" in message  # the owner denies; it never deletes
    async with stdio_server(keys.agent_env(relay.url), log_dir=tmp_path) as agent:
        got = await agent.ok("memory_get", slug="notes/x")
        assert got.content[0].text == "for the owner"  # nothing was written
        assert "memory_confirm" not in await agent.tool_names()


async def test_no_private_key_in_anything_the_server_prints(
    relay: RelayProcess, keys: Keys, tmp_path: Path
) -> None:
    keyfile = tmp_path / "agent.nsec"
    keyfile.write_text(nsec(keys.agent_sk) + "\n")
    env = clean_env(ENGRAM_OWNER=keys.owner, ENGRAM_RELAY=relay.url)
    down = keys.agent_env(f"ws://127.0.0.1:{closed_port()}")
    runs = [
        ("stdio", keys.agent_env(relay.url), ()),
        ("http", env, ("--key-file", str(keyfile))),
        ("stdio", down, ()),
        ("stdio", keys.owner_env(relay.url), ("--agent", keys.agent)),
    ]
    captured: list[str] = []
    for transport, run_env, args in runs:
        async with SERVERS[transport](run_env, *args, log_dir=tmp_path) as server:
            await server.call("memory_set", slug="core", value="profile")
            await server.call("memory_set", slug="notes/x", value="v")
            await server.call("memory_get", slug="notes/x")
            await server.call("memory_get", slug="Bad Slug")
            await server.call("memory_patch", slug="x", diff="junk", base_hash="0" * 64)
            await server.call("memory_list")
            await server.call("memory_refs")
            await server.call("memory_delete", slug="core")
            await server.core_resource()
            await server.core_prompt()
        captured += [*server.results, server.log()]

    # start-up errors are one line on stderr, and name no key either
    bad_owner = keys.agent_env(relay.url, ENGRAM_OWNER="not-a-key")
    failed = engram("mcp", env=bad_owner)
    assert failed.returncode == 1 and failed.stderr.count(b"\n") == 1, failed.stderr
    bad_key = clean_env(ENGRAM_PRIVATE_KEY=keys.agent_sk.hex()[:-2], ENGRAM_OWNER=keys.owner)
    failed = engram("mcp", env=bad_key)
    assert failed.returncode == 1 and failed.stderr.count(b"\n") == 1, failed.stderr
    captured += [failed.stdout.decode(), failed.stderr.decode()]

    everything = "\n".join(captured)
    assert pubkey_of(keys.agent_sk) not in secrets_of(keys.agent_sk)  # sanity of the check
    for form in [*secrets_of(keys.agent_sk, keys.owner_sk), keys.agent_sk.hex()[:-2]]:
        assert form not in everything


async def test_errors_name_the_slug_and_reason_never_a_value_and_the_log_nothing_decrypted(
    relay: RelayProcess, keys: Keys, tmp_path: Path
) -> None:
    """Issue 46 item 10, as docs/AGENT-MEMORY.md now says: an error goes to the caller, who
    holds the key, so a refusal names the slug and quotes the recorded reason; it never
    quotes a value, and nothing decrypted reaches the server's log."""
    slug, value, reason = "notes/whereabouts", "lives at 12 Elm Street", "moved away in May"
    async with stdio_server(keys.agent_env(relay.url), log_dir=tmp_path) as server:
        await server.ok("memory_set", slug=slug, value=value)
        await server.ok("memory_delete", slug=slug, reason=reason)
        refused = await server.error("memory_set", "refused", slug=slug, value=value)
        assert f"mem/{slug}" in refused and reason in refused and value not in refused
        gone = await server.error("memory_get", "not_found", slug=slug)
        assert f"mem/{slug}" in gone and value not in gone
        await server.error("memory_search", "bad_input", query="((a{200}){200}){100}", regex=True)
        assert await server.core_resource() != ""  # no core: the nudge
        log = server.log()
    for decrypted in (slug, value, reason):
        assert decrypted not in log, log


def test_http_address_forms() -> None:
    assert parse_http("8765") == ("127.0.0.1", 8765)
    assert parse_http("0.0.0.0:80") == ("0.0.0.0", 80)
    assert parse_http("[::1]:8765") == ("::1", 8765)
    assert parse_http(":8765") == ("127.0.0.1", 8765)
    for bad in ("", "host", "host:", "host:0", "host:65536", "host:http"):
        with pytest.raises(InputError):
            parse_http(bad)


def test_start_up_errors_are_one_line_exit_1(keys: Keys) -> None:
    env = keys.agent_env("ws://127.0.0.1:1")
    for args, env_ in [
        (("--http", "nope"), env),
        (("--relay", "http://not-a-relay"), env),
        ((), clean_env(ENGRAM_OWNER=keys.owner)),  # no key at all
    ]:
        failed = engram("mcp", *args, env=env_)
        assert failed.returncode == 1, failed.stderr
        assert failed.stdout == b""
        assert failed.stderr.startswith(b"engram: ") and failed.stderr.count(b"\n") == 1


# --- the HTTP transport's bearer token (issue 37, item 4) -----------------------------------


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or `exc` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


async def test_http_answers_only_the_bearer_of_its_token(
    relay: RelayProcess, keys: Keys, tmp_path: Path
) -> None:
    """Any local account could call the HTTP server's tools with the key it holds: now a
    request without the token, or with another, is refused 401 before any MCP message
    is read (the SDK's own client and a bare POST alike), and the token works."""
    env = {**keys.agent_env(relay.url), "ENGRAM_MCP_TOKEN": TOKEN}
    async with http_process(env, log_dir=tmp_path) as (url, _, log_path):
        for token in (None, "wrong-" + TOKEN, TOKEN[:-1]):
            async with bearer_client(token) as http:
                transport = streamable_http_client(url, http_client=http)
                with pytest.raises(BaseException) as refused:
                    async with Client(transport, read_timeout_seconds=CALL_BOUND) as client:
                        await client.call_tool("memory_set", {"slug": "x", "value": "stolen"})
                assert any(isinstance(e, MCPError) for e in leaves(refused.value)), refused
                initialize = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "curl", "version": "1"},
                    },
                }
                answer = await http.post(
                    url,
                    json=initialize,
                    headers={"Accept": "application/json, text/event-stream"},
                )
                assert answer.status_code == 401, answer.text
                assert answer.headers["www-authenticate"].startswith("Bearer ")
        async with bearer_client(TOKEN) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, read_timeout_seconds=CALL_BOUND) as client:
                server = Server(client, log_path)
                await server.error("memory_get", "not_found", slug="x")  # nothing got through
                await server.ok("memory_set", slug="notes/guarded", value="mine")
                got = await server.ok("memory_get", slug="notes/guarded")
                assert got.content[0].text == "mine"
        assert TOKEN not in log_path.read_text()  # a given token is never printed


async def test_http_token_is_made_once_kept_0600_and_refused_if_others_can_read_it(
    relay: RelayProcess, keys: Keys, tmp_path: Path
) -> None:
    """Without --token: a token is made at the first start, written with mode 0600 in the
    config directory and printed once; later starts use it and do not print it; a token
    file other users could read is refused, as is a token too short to be secret."""
    env = {**keys.agent_env(relay.url), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    path = tmp_path / "config" / "engram" / "mcp-token"
    async with http_process(env, log_dir=tmp_path) as (url, _, log_path):
        token = path.read_text().strip()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert log_path.read_text().count(token) == 1
        async with bearer_client(token) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, read_timeout_seconds=CALL_BOUND) as client:
                assert await Server(client, log_path).tool_names() == READ_TOOLS | WRITE_TOOLS
    async with http_process(env, log_dir=tmp_path) as (url, _, log_path):
        assert path.read_text().strip() == token and token not in log_path.read_text()
        assert str(path) in log_path.read_text()
    path.chmod(0o644)
    failed = engram("mcp", "--http", str(free_port()), env=env)
    assert failed.returncode == 1 and b"chmod 600" in failed.stderr, failed.stderr
    assert failed.stderr.count(b"\n") == 1 and token.encode() not in failed.stderr
    failed = engram("mcp", "--http", str(free_port()), "--token", "short", env=env)
    assert failed.returncode == 1 and b"at least 16 characters" in failed.stderr, failed.stderr
