"""`engram mcp`: the command. The server itself is `cli.memory.mcp_server`, imported only here at
run time, so the MCP SDK's import cost is paid by this command alone, not by every
`engram` invocation (the ACP hook runs `engram mem` often).

Identity and relays are resolved exactly as for `engram mem`; a bad key, owner, relay URL
or `--http` value ends the command with one line on stderr and exit code 1.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from cli.identity import InputError, load_identity, relay_urls
from cli.mem import DEFAULT_TIMEOUT
from cli.mem import Agent as AgentOpt
from cli.mem import KeyFile as KeyFileOpt
from cli.mem import Owner as OwnerOpt
from cli.mem import Relay as RelayOpt
from cli.mem import Timeout as TimeoutOpt

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
) -> None:
    """Serve the agent's memory as MCP tools (stdio, or streamable HTTP with --http).

    Tools memory_get, memory_hash, memory_list, memory_refs, and memory_set, memory_patch,
    memory_delete unless --agent makes it an owner's read-only session; the core profile as
    resource engram://core and prompt core_profile. Keys and relays as for `engram mem`.
    """
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="engram mcp: %(message)s")
    try:
        ident = load_identity(key_file, owner, agent)
        relays = relay_urls(relay)
        bind = parse_http(http) if http is not None else None
    except InputError as exc:
        typer.echo(f"engram: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(1) from None

    import anyio

    from cli.memory.api import AgentMemory
    from cli.memory.mcp_server import build_server, inner_timeout

    memory = AgentMemory(ident, relays, timeout=inner_timeout(timeout))
    server = build_server(memory, timeout)
    try:
        if bind is None:
            anyio.run(server.run_stdio_async)
            return
        host, port = bind
        if not _is_loopback(host):
            log.warning(
                "serving on %s: anyone who can reach this port can use this memory with the "
                "held key (this server has no MCP authentication)",
                host,
            )
        shown = f"[{host}]" if ":" in host else host
        typer.echo(f"engram mcp: serving http://{shown}:{port}{MCP_PATH}", err=True)
        anyio.run(lambda: server.run_streamable_http_async(host=host, port=port))
    except KeyboardInterrupt:
        pass
