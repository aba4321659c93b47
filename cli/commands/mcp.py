"""`engram mcp`: the command. The server itself is `cli.memory.mcp_server`, imported only here at
run time, so the MCP SDK's import cost is paid by this command alone, not by every
`engram` invocation (the ACP hook runs `engram mem` often).

Identity and relays are resolved exactly as for `engram mem`; a bad key, owner, relay URL
or `--http` value ends the command with one line on stderr and exit code 1.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Any

import typer

from cli.commands.mem_common import DEFAULT_TIMEOUT
from cli.commands.mem_common import Agent as AgentOpt
from cli.commands.mem_common import KeyFile as KeyFileOpt
from cli.commands.mem_common import Owner as OwnerOpt
from cli.commands.mem_common import Relay as RelayOpt
from cli.commands.mem_common import Timeout as TimeoutOpt
from cli.nostr.identity import InputError, load_identity, relay_urls

DEFAULT_HTTP_HOST = "127.0.0.1"
MCP_PATH = "/mcp"

log = logging.getLogger("engram.mcp")


def parse_http(value: str) -> tuple[str, int]:
    """`PORT`, `HOST:PORT` or `[IPv6]:PORT`; the host defaults to loopback."""
    host, sep, port_text = value.rpartition(":")
    if not sep:
        host = DEFAULT_HTTP_HOST
    host = host.removeprefix("[").removesuffix("]") or DEFAULT_HTTP_HOST
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InputError(f"--http takes [HOST:]PORT with a port from 1 to 65535: {value!r}")
    return host, int(port_text)


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="ENGRAM_MCP_TOKEN",
        show_envvar=True,
        metavar="TOKEN",
        help="With --http: the bearer token clients must send (default: the one kept in "
        "~/.config/engram/mcp-token, made and printed at the first start).",
    ),
]

HttpOpt = Annotated[
    str | None,
    typer.Option(
        "--http",
        metavar="[HOST:]PORT",
        help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio "
        "(HOST defaults to 127.0.0.1).",
    ),
]


def mcp_command(
    relay: RelayOpt = None,
    owner: OwnerOpt = None,
    key_file: KeyFileOpt = None,
    agent: AgentOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    http: HttpOpt = None,
    token: TokenOpt = None,
) -> None:
    """Serve the agent's memory as MCP tools (stdio, or streamable HTTP with --http).

    Tools memory_get, memory_hash, memory_list, memory_search, memory_recall, memory_refs,
    memory_log, memory_set, memory_patch, memory_revert and memory_delete; with --agent
    (the owner's key) memory_confirm and memory_deny instead of memory_delete, and the
    writes are corrections. The core profile as resource engram://core and prompt
    core_profile. Keys and relays as for `engram mem`.
    Over HTTP every request must carry `Authorization: Bearer TOKEN` (see --token).
    """
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="engram mcp: %(message)s")
    try:
        ident = load_identity(key_file, owner, agent)
        relays = relay_urls(relay)
        bind = parse_http(http) if http is not None else None
        bearer = _bearer(token) if bind is not None else None
    except InputError as exc:
        typer.echo(f"engram: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(1) from None

    import anyio

    from cli.memory.api import AgentMemory
    from cli.memory.mcp_server import build_server, inner_timeout

    memory = AgentMemory(ident, relays, timeout=inner_timeout(timeout))
    if bind is None:
        server = build_server(memory, timeout)
    else:
        host, port = bind
        shown = f"[{host}]" if ":" in host else host
        server = build_server(memory, timeout, bearer, f"http://{shown}:{port}")

    async def then_close(serve: Any) -> None:
        try:
            await serve()
        finally:
            await memory.close()  # the recall cache's waiting change, if any

    try:
        if bind is None:
            anyio.run(then_close, server.run_stdio_async)
            return
        if not _is_loopback(host):
            log.warning(
                "serving on %s: reachable from other hosts over plain HTTP; only the bearer "
                "token guards this memory (keep it on loopback, or behind TLS)",
                host,
            )
        typer.echo(f"engram mcp: serving http://{shown}:{port}{MCP_PATH}", err=True)
        anyio.run(then_close, lambda: server.run_streamable_http_async(host=host, port=port))
    except KeyboardInterrupt:
        pass


def _bearer(given: str | None) -> str:
    """The HTTP server's bearer token: `--token`/`ENGRAM_MCP_TOKEN`, else the one kept in
    the config directory (made now, and printed this once, if there is none)."""
    from cli.memory.mcp_auth import TOKEN_FILE, check_token, config_dir, stored_token

    if given is not None:
        return check_token(given, "--token (ENGRAM_MCP_TOKEN)")
    path = config_dir() / TOKEN_FILE
    token, made = stored_token(path)
    if made:
        typer.echo(
            f"engram mcp: new bearer token, kept in {path} (mode 0600); configure your MCP"
            f" host to send the header\n  Authorization: Bearer {token}",
            err=True,
        )
    else:
        typer.echo(f"engram mcp: clients must send the bearer token kept in {path}", err=True)
    return token
