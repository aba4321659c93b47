"""`engram acp`: the real proxy process between an editor (the `acp` SDK's client side,
here) and a small real ACP agent (tests/acp_agent_fixture.py), against a real relay.

The agent logs every request it receives, so each test checks what actually reached it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
from acp_support import BOUND, FIXTURE, Editor, proxied, user_block
from cli_support import (
    ENGRAM,
    ROOT,
    Keys,
    closed_port,
    corrupt_core,
    listening_never_accepting,
    publish,
    shared_relay,
)
from relay_fixtures import RelayProcess

from cli.memory.acp_proxy import Inject, Interceptor, add_system_prompt
from cli.memory.hook import HEADER, NUDGE, Nothing, Profile
from engram import Core, build_event

PROFILE = "I am the proxy test agent. My user likes short answers."


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("acp-relay")))


async def with_core(relay: RelayProcess) -> Keys:
    keys = Keys.fresh()
    event = build_event(
        keys.agent_sk, keys.owner, Core(PROFILE), int(time.time()), os.urandom(32), os.urandom(32)
    )
    await publish(relay.url, event)
    return keys


async def test_prompt_mode_injects_core_before_the_first_prompt_only(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys = await with_core(relay)
    async with proxied(tmp_path, keys.agent_env(relay.url)) as (conn, run):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("hello")])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("again")])
    [new] = run.received("session/new")
    assert "systemPrompt" not in new["meta"]
    first, second = run.received("session/prompt")
    assert first["prompt"] == [user_block(Profile(PROFILE).text), user_block("hello")]
    assert first["prompt"][0]["text"].startswith(f"{HEADER}\n\n{PROFILE}")
    assert second["prompt"] == [user_block("again")]
    assert any(
        getattr(u, "session_update", "") == "agent_message_chunk" for u in run.editor.updates
    )


async def test_meta_mode_appends_core_to_the_system_prompt(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys = await with_core(relay)
    env = keys.agent_env(relay.url)
    async with proxied(tmp_path, env, "--inject", "meta") as (conn, run):
        session = await conn.new_session(
            cwd=str(tmp_path), mcp_servers=[], systemPrompt={"append": "from the editor"}
        )
        await conn.prompt(session_id=session.session_id, prompt=[text_block("hello")])
    [new] = run.received("session/new")
    assert new["meta"]["systemPrompt"] == {"append": "from the editor\n\n" + Profile(PROFILE).text}
    [prompt] = run.received("session/prompt")
    assert prompt["prompt"] == [user_block("hello")]


async def test_empty_relay_injects_the_nudge(relay: RelayProcess, tmp_path: Path) -> None:
    async with proxied(tmp_path, Keys.fresh().agent_env(relay.url)) as (conn, run):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("hello")])
    [prompt] = run.received("session/prompt")
    assert prompt["prompt"] == [user_block(NUDGE), user_block("hello")]


async def test_session_load_injects_before_the_next_first_prompt(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys = await with_core(relay)
    async with proxied(tmp_path, keys.agent_env(relay.url)) as (conn, run):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("one")])
        await conn.load_session(cwd=str(tmp_path), session_id=session.session_id, mcp_servers=[])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("two")])
    first, second = run.received("session/prompt")
    assert first["prompt"][0]["text"].startswith(HEADER)
    assert second["prompt"] == [user_block(Profile(PROFILE).text), user_block("two")]


@pytest.mark.parametrize("inject", ["prompt", "meta"])
@pytest.mark.parametrize("failure", ["down", "hanging", "corrupt"])
async def test_failed_reads_inject_nothing_and_never_delay_past_the_timeout(
    relay: RelayProcess, tmp_path: Path, failure: str, inject: str
) -> None:
    keys = Keys.fresh()
    timeout = 1.0
    with listening_never_accepting() as hanging:
        url = {"down": f"ws://127.0.0.1:{closed_port()}", "hanging": hanging}.get(failure)
        if failure == "corrupt":
            await publish(relay.url, corrupt_core(keys))
        env = keys.agent_env(url or relay.url)
        options = ("--inject", inject, "--timeout", str(timeout))
        async with proxied(tmp_path, env, *options) as (conn, run):
            start = time.monotonic()
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            await conn.prompt(session_id=session.session_id, prompt=[text_block("hello")])
            elapsed = time.monotonic() - start
    # The hook ran with the configured timeout and gave up on it: a hanging relay would
    # otherwise hold the request until the websocket open timeout (10 s) or forever.
    reasons = run.diagnostics()
    assert "memory not injected" in reasons, reasons
    if failure == "hanging":
        assert f"within {timeout:g} s" in reasons, reasons
    assert elapsed < BOUND, reasons
    [new] = run.received("session/new")
    assert "systemPrompt" not in new["meta"]
    [prompt] = run.received("session/prompt")
    assert prompt["prompt"] == [user_block("hello")]


async def test_default_timeout_bounds_session_creation(tmp_path: Path) -> None:
    with listening_never_accepting() as hanging:
        async with proxied(tmp_path, Keys.fresh().agent_env(hanging), "--inject", "meta") as (
            conn,
            run,
        ):
            start = time.monotonic()
            await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            elapsed = time.monotonic() - start
    reasons = run.diagnostics()
    assert "within 3 s" in reasons, reasons  # the default timeout is what bounded it
    assert elapsed < BOUND, reasons
    assert "systemPrompt" not in run.received("session/new")[0]["meta"]


@pytest.mark.parametrize("switch", ["flag", "env"])
async def test_memory_switched_off(relay: RelayProcess, tmp_path: Path, switch: str) -> None:
    keys = await with_core(relay)
    env = keys.agent_env(relay.url)
    options: tuple[str, ...] = ("--inject", "meta")
    if switch == "flag":
        options += ("--no-memory",)
    else:
        env["ENGRAM_ACP_NO_MEMORY"] = "1"
    async with proxied(tmp_path, env, *options) as (conn, run):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("hello")])
    assert "systemPrompt" not in run.received("session/new")[0]["meta"]
    assert run.received("session/prompt")[0]["prompt"] == [user_block("hello")]


async def test_agent_arguments_after_its_name_are_not_ours(tmp_path: Path) -> None:
    """Without `--`, everything after the agent's name still belongs to the agent."""
    env = Keys.fresh().agent_env(f"ws://127.0.0.1:{closed_port()}")
    editor = Editor()
    async with spawn_agent_process(
        editor,
        ENGRAM[0],
        *ENGRAM[1:],
        "acp",
        "--no-memory",
        sys.executable,
        FIXTURE,
        "--timeout",
        "x",
        env=env,
        cwd=ROOT,
        transport_kwargs={"stderr": None},
    ) as (conn, _proc):
        response = await conn.initialize(protocol_version=PROTOCOL_VERSION)
    assert response.protocol_version == PROTOCOL_VERSION


# --- the interceptor on its own: everything else passes byte for byte --------------------


async def test_other_messages_pass_through_byte_for_byte() -> None:
    async def hook() -> Nothing:
        return Nothing("unused")

    interceptor = Interceptor(hook, Inject.prompt)
    lines = [
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n',
        b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}\n',
        b'{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s",'
        b'"prompt":[{"type":"text","text":"hi  \\u00e9"}]}}\n',
        b'{"jsonrpc":"2.0", "id":3, "result":{}}\n',
        b"not json at all\n",
        b"[1,2,3]\n",
    ]
    for line in lines:
        assert await interceptor.from_editor(line) is line
        interceptor.from_agent(line)


def test_add_system_prompt_keeps_what_the_editor_sent() -> None:
    params: dict[str, Any] = {}
    add_system_prompt(params, "M")
    assert params == {"_meta": {"systemPrompt": {"append": "M"}}}
    params = {"_meta": {"other": 1, "systemPrompt": {"append": "E", "preset": "p"}}}
    add_system_prompt(params, "M")
    assert params == {"_meta": {"other": 1, "systemPrompt": {"append": "E\n\nM", "preset": "p"}}}
    params = {"_meta": {"systemPrompt": "replace"}}
    add_system_prompt(params, "M")
    assert params == {"_meta": {"systemPrompt": "replace\n\nM"}}
