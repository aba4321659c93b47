"""The exit-code contract for failures a well-behaved relay will not produce on demand:
refused AUTH (3), gated reads (3), silence (2, timeout), refusals (2), lost races (5),
and anything unexpected (4). Scripted websocket servers stand in for misbehaving relays."""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import typer
from cli_support import (
    ENGRAM,
    PROCESS_BOUND,
    ROOT,
    Keys,
    engram_async,
    fake_relay,
    listening_never_accepting,
    silent_relay,
    stalling_relays,
)
from typer.testing import CliRunner

from cli.commands.mem_common import MemGroup
from cli.memory.api import AgentMemory
from cli.nostr.identity import load_identity

Frames = list[list[Any]]


def scripted(
    auth: Callable[[str], Frames] = lambda eid: [["OK", eid, True, ""]],
    req: Callable[[str], Frames] = lambda sub: [["EOSE", sub]],
    event: Callable[[str], Frames] = lambda eid: [["OK", eid, True, ""]],
) -> Any:
    """A relay that sends a challenge, then answers each AUTH/REQ/EVENT with fixed frames."""

    async def handler(ws: Any) -> None:
        await ws.send('["AUTH","c"]')
        async for raw in ws:
            msg = msgspec.json.decode(raw)
            if msg[0] == "AUTH":
                replies = auth(msg[1]["id"])
            elif msg[0] == "REQ":
                replies = req(msg[1])
            elif msg[0] == "EVENT":
                replies = event(msg[1]["id"])
            else:
                replies = []
            for frame in replies:
                await ws.send(msgspec.json.encode(frame).decode())

    return handler


async def run(url: str, *args: str) -> Any:
    return await engram_async(*args, env=Keys.fresh().agent_env(url))


@pytest.mark.parametrize(
    ("relay", "args", "code", "words"),
    [
        (
            scripted(auth=lambda e: [["OK", e, False, "restricted: not you"]]),
            ("get", "x"),
            3,
            "refused AUTH",
        ),
        (
            scripted(req=lambda s: [["CLOSED", s, "auth-required: please"]]),
            ("get", "x"),
            3,
            "auth-required",
        ),
        (
            scripted(req=lambda s: [["CLOSED", s, "restricted: not yours"]]),
            ("hash", "x"),
            3,
            "restricted",
        ),
        (
            scripted(req=lambda s: [["CLOSED", s, "error: database down"]]),
            ("get", "x"),
            2,
            "database down",
        ),
        (
            scripted(event=lambda e: [["OK", e, False, "invalid: nope"]]),
            ("set", "x", "v"),
            2,
            "invalid: nope",
        ),
        (
            scripted(event=lambda e: [["OK", e, False, "auth-required: sign in"]]),
            ("set", "x", "v"),
            3,
            "auth-required",
        ),
        (
            scripted(event=lambda e: [["OK", e, True, "duplicate: have a newer one"]]),
            ("set", "x", "v"),
            5,
            "conflict",
        ),
        (scripted(), ("set", "x", "v"), 5, "conflict"),  # OK, but the re-read shows no head
        (scripted(), ("get", "x"), 1, "not found"),
    ],
)
async def test_relay_answers_map_to_exit_codes(
    relay: Any, args: tuple[str, ...], code: int, words: str
) -> None:
    async with fake_relay(relay) as url:
        result = await run(url, "mem", *args, "--timeout", "5")
    err = result.stderr.decode()
    assert result.returncode == code, err
    assert words in err and err.count("\n") == 1


async def test_ls_without_nip11_still_lists_and_warns() -> None:
    async with fake_relay(scripted()) as url:
        result = await run(url, "mem", "ls", "--timeout", "5")
    assert (result.returncode, result.stdout) == (0, b"")
    assert b"NIP-11" in result.stderr and b"may be partial" in result.stderr


async def test_silent_relay_times_out_with_exit_2() -> None:
    async with fake_relay(silent_relay) as url:
        start = time.monotonic()
        result = await run(url, "mem", "get", "x", "--timeout", "0.5")
        elapsed = time.monotonic() - start
    assert result.returncode == 2
    assert b"timed out" in result.stderr
    # an outer bound (process start-up on a loaded machine included): the point is that it
    # does not hang; "timed out" above shows the 0.5 s timeout is what ended it
    assert elapsed < 45


async def test_hanging_tcp_times_out_with_exit_2() -> None:
    with listening_never_accepting() as url:
        result = await run(url, "mem", "ls", "--timeout", "0.5")
    assert result.returncode == 2
    assert b"timed out" in result.stderr or b"NIP-11" in result.stderr


async def test_relays_that_accept_and_never_answer_end_mem_at_its_deadline() -> None:
    """Silent before the websocket handshake, and after it: `engram mem ls` (and a read
    and a write) end at --timeout with exit 2, naming no result."""
    commands = [("ls",), ("get", "x"), ("set", "x", "v")]
    async with stalling_relays() as stalled:
        # all six wait out their deadlines at once (each is its own process and client)
        cases = [(url, args) for url in stalled for args in commands]
        results = await asyncio.gather(
            *(run(url, "mem", *args, "--timeout", "2") for url, args in cases)
        )
    for (url, args), result in zip(cases, results, strict=True):
        err = result.stderr.decode()
        assert result.returncode == 2, (url, args, err)
        assert "timed out" in err and err.count("\n") == 1, err
        assert result.stdout == b""


def test_unexpected_errors_are_exit_4_on_one_line() -> None:
    app = typer.Typer(cls=MemGroup)

    @app.command()
    def boom() -> None:
        raise RuntimeError("something odd\nwith two lines")

    @app.command()
    def other() -> None:
        pass

    result = CliRunner().invoke(app, ["boom"])
    assert result.exit_code == 4
    assert result.output == "engram: unexpected error: RuntimeError: something odd with two lines\n"


def _audit_through_a_pipe(env: dict[str, str], read_all: bool) -> tuple[int, bytes, bytes]:
    """`engram mem audit` with stdout a 4 KiB pipe: read to the end, or read one byte and
    close the read end while the command still has findings to print."""
    r, w = os.pipe()
    fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, 4096)  # its output (~13 KB) cannot all fit
    proc = subprocess.Popen(
        [*ENGRAM, "mem", "audit", "--timeout", "120"],
        stdin=subprocess.DEVNULL,
        stdout=w,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    os.close(w)
    with os.fdopen(r, "rb") as out:
        got = out.read() if read_all else out.read(1)
    _, err = proc.communicate(timeout=PROCESS_BOUND)
    return proc.returncode, got, err


async def test_a_closed_pipe_keeps_the_commands_exit_code(start_relay) -> None:
    """`engram mem audit | head` (issue 46): the reader leaving early is not bad input, so
    the audit's own exit 6 stands, with no traceback; read whole, the same exit 6."""
    keys = Keys.fresh()
    lone, empty = start_relay(), start_relay()
    me = load_identity(None, keys.owner, None, env={"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()})
    memory = AgentMemory(me, [lone.url], timeout=60)
    for i in range(40):  # on one relay only: each is a version the other relay misses
        await memory.set(f"notes/{'long-' * 10}{i}", f"value {i}")
    await memory.close()
    env = keys.agent_env(f"{lone.url},{empty.url}")
    code, everything, err = await asyncio.to_thread(_audit_through_a_pipe, env, True)
    assert code == 6, err.decode()
    assert everything.count(b"\n") >= 40 and len(everything) > 3 * 4096, everything[:300]
    code, _, err = await asyncio.to_thread(_audit_through_a_pipe, env, False)
    assert code == 6, err.decode()
    assert b"Traceback" not in err and b"Broken pipe" not in err, err.decode()
