"""Helpers for the CLI and ACP tests: keys, running `engram` as a real process, and small
misbehaving servers (silent, refusing) that a real relay cannot be made to imitate."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import websockets
from nostr_client import Client
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from engram import CORE_SLUG, d_tag
from engram.nip01 import Event, pubkey_of, sign_event
from engram.nip44 import conversation_key, encrypt

ROOT = Path(__file__).resolve().parent.parent
ENGRAM = [sys.executable, "-m", "cli.commands.main"]


def tenant_cli(db_url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`engram tenant ARGS --database-url DB_URL` as a real process; asserts success if `check`."""
    proc = subprocess.run(
        [*ENGRAM, "tenant", *args, "--database-url", db_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@dataclass(frozen=True)
class Keys:
    """A fresh agent/owner pair; every test gets its own memory this way."""

    agent_sk: bytes
    owner_sk: bytes

    @classmethod
    def fresh(cls) -> Keys:
        return cls(os.urandom(32), os.urandom(32))

    @property
    def agent(self) -> str:
        return pubkey_of(self.agent_sk)

    @property
    def owner(self) -> str:
        return pubkey_of(self.owner_sk)

    def agent_env(self, relay: str, **extra: str) -> dict[str, str]:
        """Environment of the agent side: its key, its owner, the relay."""
        return (
            clean_env(
                ENGRAM_PRIVATE_KEY=self.agent_sk.hex(), ENGRAM_OWNER=self.owner, ENGRAM_RELAY=relay
            )
            | extra
        )

    def owner_env(self, relay: str) -> dict[str, str]:
        """Environment of the owner side: the owner's key; pass `--agent` to read."""
        return clean_env(ENGRAM_PRIVATE_KEY=self.owner_sk.hex(), ENGRAM_RELAY=relay)


def clean_env(**values: str) -> dict[str, str]:
    """os.environ without any ENGRAM_* variable, plus `values`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    return env | values


# An outer bound for one `engram` process (start-up included) on a loaded 2-core machine:
# it catches a hang; a command's own --timeout is what a test asserts on.
PROCESS_BOUND = 180.0


def engram(
    *args: str, env: dict[str, str], stdin: bytes | None = None, timeout: float = PROCESS_BOUND
) -> subprocess.CompletedProcess[bytes]:
    """Run `engram ARGS…` as a real process; stdout and stderr are captured as bytes."""
    return subprocess.run(
        [*ENGRAM, *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


async def engram_async(
    *args: str, env: dict[str, str], stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`engram` without blocking the event loop (for tests that also serve sockets)."""
    proc = await asyncio.create_subprocess_exec(
        *ENGRAM,
        *args,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin or b""), PROCESS_BOUND)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(list(args), proc.returncode, out, err)


def closed_port() -> int:
    """A port nothing listens on (bound, then released): "relay down"."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def listening_never_accepting() -> Iterator[str]:
    """A TCP port whose backlog completes the handshake but never answers: "relay hanging"."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"ws://127.0.0.1:{s.getsockname()[1]}"


@contextlib.asynccontextmanager
async def fake_relay(handler: Any, port: int = 0) -> AsyncIterator[str]:
    """A websocket server running `handler(ws)` (on `port`, or any free one); yields its
    ws:// URL. A proxy to a real relay listens on the port given to that relay as a
    public URL (relay_fixtures.proxied_env): clients AUTH for the proxy's URL."""
    async with serve(handler, "127.0.0.1", port) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def accepting_silent_tcp() -> AsyncIterator[str]:
    """A TCP server that accepts every connection, reads what comes and never answers a
    byte (no HTTP, no websocket handshake): "relay hanging after accept"."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        server.close()


@contextlib.asynccontextmanager
async def stalling_relays() -> AsyncIterator[list[str]]:
    """Two relays that accept the connection and then never answer: a raw TCP server
    (silent before the websocket handshake) and a websocket server (silent after it)."""
    async with accepting_silent_tcp() as tcp, fake_relay(silent_relay) as ws:
        yield [tcp, ws]


@contextlib.asynccontextmanager
async def ok_dropping_proxy(upstream: str, port: int = 0) -> AsyncIterator[str]:
    """A websocket proxy to a real relay that forwards everything but the `OK` answers to
    EVENTs (AUTH is answered): EVENTs are stored, and the client never hears so."""

    async def handler(ws: ServerConnection) -> None:
        sent: set[str] = set()
        async with websockets.connect(upstream, max_size=None) as up:

            async def client_to_relay() -> None:
                async for frame in ws:
                    if (event_id := _frame_id(frame, "EVENT")) is not None:
                        sent.add(event_id)
                    await up.send(frame)

            async def relay_to_client() -> None:
                async for frame in up:
                    if _frame_id(frame, "OK") not in sent:
                        await ws.send(frame)

            pumps = [asyncio.create_task(p()) for p in (client_to_relay, relay_to_client)]
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()

    async with fake_relay(handler, port) as url:
        yield url


async def silent_relay(ws: ServerConnection) -> None:
    """Completes the websocket handshake, then says nothing at all."""
    await ws.wait_closed()


def _frame_id(raw: str | bytes, verb: str) -> str | None:
    """The event id of an `["EVENT", {...}]` or `["OK", id, …]` frame, else None."""
    if not raw.startswith(f'["{verb}"' if isinstance(raw, str) else f'["{verb}"'.encode()):
        return None
    msg = msgspec.json.decode(raw)
    return str(msg[1]["id"] if verb == "EVENT" else msg[1])


@contextlib.asynccontextmanager
async def barrier_proxy(upstream: str, writers: int, port: int = 0) -> AsyncIterator[str]:
    """A websocket proxy that makes `writers` clients' writes truly concurrent.

    Each client's EVENT is held until all of them have sent one, and each OK is held until
    every event was answered: so every write is stored before any client re-reads its head.
    Everything else (AUTH, REQ, EOSE) passes through at once.
    """
    events_in = asyncio.Barrier(writers)
    oks_in = asyncio.Barrier(writers)
    ids: set[str] = set()

    async def handler(client: ServerConnection) -> None:
        async with connect(upstream, max_size=None) as relay:

            async def up() -> None:
                async for raw in client:
                    if (eid := _frame_id(raw, "EVENT")) is not None:
                        ids.add(eid)
                        await events_in.wait()
                    await relay.send(raw)

            async def down() -> None:
                async for raw in relay:
                    if (eid := _frame_id(raw, "OK")) is not None and eid in ids:
                        await oks_in.wait()
                    await client.send(raw)

            await both_ways(up(), down())

    async with fake_relay(handler, port) as url:
        yield url


async def both_ways(up: Coroutine[Any, Any, None], down: Coroutine[Any, Any, None]) -> None:
    """A proxy's two directions, until either ends (a side closed): the other is cancelled."""
    tasks = [asyncio.ensure_future(up), asyncio.ensure_future(down)]
    with contextlib.suppress(websockets.ConnectionClosed):
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()


def shared_relay(pg_server_url: str, tmp_dir: str, env: dict[str, str] | None = None) -> Any:
    """Generator for a module-scoped relay fixture: one real relay on a fresh database."""
    from relay_fixtures import create_database_sync, launch_relay

    rp = launch_relay(create_database_sync(pg_server_url), tmp_dir, env)
    try:
        yield rp
    finally:
        rp.stop()


async def publish(url: str, event: Event) -> None:
    async with await Client.connect(url) as c:
        ok = await c.publish(event)
        assert ok[2] is True, ok


def corrupt_core(keys: Keys) -> Event:
    """Addressed like core and signed by the agent, but encrypted under the wrong key:
    the relay stores it (it cannot decrypt); a reader must reject it at rule 3."""
    ck = conversation_key(keys.agent_sk, keys.owner)
    wrong = conversation_key(keys.agent_sk, Keys.fresh().owner)
    content = encrypt('{"slug":"core","profile":"forged"}', wrong, os.urandom(32))
    tags = [["d", d_tag(ck, CORE_SLUG)], ["p", keys.owner]]
    return sign_event(keys.agent_sk, int(time.time()), 30174, tags, content, os.urandom(32))


def shared_local_relay(tmp_dir: str) -> Any:
    """Generator for a module-scoped fixture: nostr-sdk's LocalRelay (Rust, in memory, an
    implementation nobody here wrote) in its own process, rate limit lifted."""
    from relay_fixtures import free_port

    from bench.peers import _LOCAL_RELAY_SCRIPT, Running, _spawn, _ws_handshake_ok, wait_ready

    workdir = Path(tmp_dir)
    script = workdir / "local_relay.py"
    script.write_text(_LOCAL_RELAY_SCRIPT)
    port = free_port()
    run = Running(
        "nostr-sdk LocalRelay",
        f"ws://127.0.0.1:{port}",
        _spawn([sys.executable, str(script), str(port)], workdir),
        workdir,
    )
    wait_ready(run, port, _ws_handshake_ok)
    try:
        yield run.url
    finally:
        run.stop()


@contextlib.asynccontextmanager
async def deletion_ignoring_proxy(upstream: str) -> AsyncIterator[str]:
    """A relay that ignores NIP-09: a proxy to a real relay that answers every deletion
    request (kind 5) `OK true` itself and never passes it on; everything else passes."""

    async def handler(client: ServerConnection) -> None:
        async with connect(upstream, max_size=None) as relay:

            async def up() -> None:
                async for raw in client:
                    if _frame_id(raw, "EVENT") is not None:
                        event = msgspec.json.decode(raw)[1]
                        if event.get("kind") == 5:
                            await client.send(
                                msgspec.json.encode(["OK", event["id"], True, ""]).decode()
                            )
                            continue
                    await relay.send(raw)

            async def down() -> None:
                async for raw in relay:
                    await client.send(raw)

            await both_ways(up(), down())

    async with fake_relay(handler) as url:
        yield url


async def put(url: str, events: list[Event], seckey: bytes) -> None:
    """Publish straight to one relay (not through a set): to make relays disagree."""
    from cli.nostr.client import connect_relay

    client = await connect_relay(url, seckey)
    try:
        results = await client.try_publish_many(events)
    finally:
        await client.close()
    assert all(ok for ok, _ in results.values()), results
