"""`engram acp`: the command. The proxy itself is `cli.memory.acp_proxy`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from cli.memory.acp_proxy import (
    ENV_NO_MEMORY,
    STREAM_LIMIT,
    Hook,
    Inject,
    Interceptor,
    log,
    run_proxy,
)
from cli.memory.api import AgentMemory
from cli.memory.hook import DEFAULT_HOOK_TIMEOUT, RecallHook, fetch_core
from cli.nostr.identity import InputError, load_identity, relay_urls


def _hook(
    no_memory: bool, relay: str | None, owner: str | None, key_file: Path | None, timeout: float
) -> Hook | None:
    if no_memory:
        return None
    try:
        ident = load_identity(key_file, owner, None)
        url = relay_urls(relay)
    except InputError as exc:
        log(f"memory disabled: {exc}")
        return None
    return lambda: fetch_core(ident, url, timeout)


def _recall(
    n: int, relay: str | None, owner: str | None, key_file: Path | None, timeout: float
) -> RecallHook | None:
    if n <= 0:
        return None
    try:
        memory = AgentMemory(load_identity(key_file, owner, None), relay_urls(relay))
    except InputError as exc:
        log(f"recall disabled: {exc}")
        return None
    return RecallHook(memory, n, timeout)


# Everything after the agent's name belongs to the agent: `engram acp my-agent --its-flag`.
ACP_CONTEXT_SETTINGS = {"allow_interspersed_args": False}


def acp_command(
    agent_command: Annotated[
        list[str], typer.Argument(metavar="-- AGENT_COMMAND [ARGS]...", show_default=False)
    ],
    no_memory: Annotated[
        bool,
        typer.Option("--no-memory", envvar=ENV_NO_MEMORY, help="Proxy only; fetch no memory."),
    ] = False,
    inject: Annotated[
        Inject,
        typer.Option(help="prompt: before the first prompt; meta: _meta.systemPrompt.append."),
    ] = Inject.prompt,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for core (and recall).")
    ] = DEFAULT_HOOK_TIMEOUT,
    recall: Annotated[
        int,
        typer.Option(
            "--recall",
            min=0,
            max=100,
            metavar="N",
            help="Before each prompt, inject the N memories most relevant to it (0: off).",
        ),
    ] = 0,
    relay: Annotated[
        str | None,
        typer.Option("--relay", help="Relay URL(s), comma-separated (env ENGRAM_RELAY)."),
    ] = None,
    owner: Annotated[
        str | None, typer.Option("--owner", help="Owner public key (env ENGRAM_OWNER).")
    ] = None,
    key_file: Annotated[
        Path | None,
        typer.Option("--key-file", help="Agent secret key file (else env ENGRAM_PRIVATE_KEY)."),
    ] = None,
) -> None:
    """Run an ACP agent behind a proxy that injects its core memory into each new session."""
    interceptor = Interceptor(
        _hook(no_memory, relay, owner, key_file, timeout),
        inject,
        None if no_memory else _recall(recall, relay, owner, key_file, timeout),
    )

    async def main() -> int:
        from acp import stdio_streams

        editor_in, editor_out = await stdio_streams(limit=STREAM_LIMIT)
        return await run_proxy(agent_command, interceptor, editor_in, editor_out)

    try:
        code = asyncio.run(main())
    except FileNotFoundError as exc:
        log(f"cannot start the agent: {exc}")
        raise typer.Exit(127) from exc
    raise typer.Exit(code)
