"""`engram review`: the owner's review page for an agent's memory, in a local browser.

The command only: the same key, owner, agent and relay options as `engram mem`, then
`cli.memory.review.server.serve`. The URL it prints carries the session's token; nothing
else on stdout. A browser it opens (`--open`) gets a one-time launch link instead, never
the token: a browser's command line is readable by every account on the machine; stderr
names another one-time link to click. Exit codes as `engram mem`: 1 bad input, 4
anything unexpected.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import webbrowser
from collections.abc import Callable
from typing import Annotated

import typer

from cli.commands.mem_common import Agent, KeyFile, Owner, Relay, Timeout, fail, memory
from cli.nostr.errors import AgentMemoryError

DEFAULT_IDLE = 3600.0
REVIEW_TIMEOUT = 60.0  # a page reads the whole memory: as `engram mem ls`


def review_command(
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = REVIEW_TIMEOUT,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Also open the URL in the default browser.")
    ] = False,
    idle_timeout: Annotated[
        float,
        typer.Option(
            "--idle-timeout",
            min=0,
            help="Stop after this many seconds without a request (0: never).",
        ),
    ] = DEFAULT_IDLE,
) -> None:
    """Review an agent's memory in the browser: read it with its history, find, correct,
    confirm, deny, restore and forget.

    Serves on 127.0.0.1 (a free port) and prints a URL with a fresh token; every request
    without that token is refused. A browser started by --open gets a link that works
    once (it sets a cookie), never the token. With --agent NPUB the key held is the
    owner's and every action is an owner verdict; without it the key is the agent's and
    the page acts as the agent. Stops on Ctrl-C, or after --idle-timeout seconds without
    a request.
    """
    from cli.memory.review.guard import LAUNCH_TTL
    from cli.memory.review.server import serve

    try:
        mem = memory(relay, owner, key_file, agent, timeout, one_shot=False)
    except AgentMemoryError as exc:
        fail(str(exc), exc.exit_code)

    def announce(url: str, launch: Callable[[], str]) -> None:
        typer.echo(url)
        sys.stdout.flush()
        once = f"works once, within {LAUNCH_TTL:g} s"
        typer.echo(
            "engram review: open the URL above (paste it: a browser started with a URL shows "
            f"it to every account on this machine), or click this link ({once}): {launch()}",
            err=True,
        )
        if open_browser:  # a thread: a BROWSER command may wait until the browser exits
            link = launch()
            threading.Thread(target=webbrowser.open, args=(link,), daemon=True).start()
            typer.echo(f"engram review: opened the browser with a link that {once}", err=True)
        typer.echo("engram review: Ctrl-C stops the server", err=True)

    stopped = asyncio.run(serve(mem, announce, idle_timeout or None))
    if stopped.reason == "idle":
        typer.echo(f"engram review: stopped after {idle_timeout:g} s without a request", err=True)
    else:
        typer.echo("engram review: stopped", err=True)
