"""Helpers for the `engram review` tests: the server as a real process, its printed URL,
every page a person can reach on it, and a relay that refuses every write (a proxy to a
real relay that answers EVENTs itself)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import msgspec
import websockets
from cli_support import ENGRAM, ROOT, both_ways, fake_relay
from websockets.asyncio.server import ServerConnection

START_BOUND = 120.0  # outer bound for a process to start on a loaded machine
REFUSAL = "blocked: this test relay takes no writes"


@dataclass
class ReviewProcess:
    """One `engram review` process and the URL it printed."""

    proc: asyncio.subprocess.Process
    url: str
    log_path: Path
    state_dir: Path

    @property
    def origin(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def host(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 0)

    @property
    def token(self) -> str:
        return urlsplit(self.url).path.split("/")[2]

    def at(self, path: str) -> str:
        """The URL of `path` (e.g. "m/mem/x") under the token."""
        return self.url + path.lstrip("/")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait(self, bound: float = START_BOUND) -> int:
        return await asyncio.wait_for(self.proc.wait(), bound)

    async def stop(self) -> int:
        """Ctrl-C, as a person would; the exit code."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return await self.wait(60)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        return self.proc.returncode if self.proc.returncode is not None else -9


async def start_review(
    env: dict[str, str], *args: str, log_dir: Path, state_dir: Path
) -> ReviewProcess:
    """`engram review ARGS` with its data dir at `state_dir`; waits for the printed URL."""
    log_path = log_dir / f"review-{os.urandom(4).hex()}.log"
    full = env | {"XDG_DATA_HOME": str(state_dir)}
    with open(log_path, "wb") as errlog:
        proc = await asyncio.create_subprocess_exec(
            *ENGRAM,
            "review",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=errlog,
            env=full,
            cwd=ROOT,
        )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), START_BOUND)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    url = line.decode().strip()
    if not url.startswith("http://127.0.0.1:"):
        await proc.wait()
        raise RuntimeError(f"engram review printed {line!r}:\n{log_path.read_text()}")
    return ReviewProcess(proc, url, log_path, state_dir)


@contextlib.asynccontextmanager
async def review_server(
    env: dict[str, str], *args: str, log_dir: Path, state_dir: Path
) -> AsyncIterator[ReviewProcess]:
    review = await start_review(env, *args, log_dir=log_dir, state_dir=state_dir)
    try:
        yield review
    finally:
        await review.stop()


async def every_page(review: ReviewProcess) -> dict[str, str]:
    """Every page a person can reach without acting: the lists (live, and not live), each
    memory either links to, its confirmation pages, core and the changes. URL -> HTML."""
    pages: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=120) as http:

        async def get(path: str) -> str:
            r = await http.get(review.at(path))
            assert r.status_code in (200, 404), (path, r.status_code)
            pages[path] = r.text
            return r.text

        lists = await get("") + await get("?show=gone")
        for slug in sorted(set(re.findall(r'href="[^"]*/m/([^"?#]+)"', lists))):
            page = await get(f"m/{slug}")
            for action in re.findall(r'href="[^"]*/(act/[a-z]+/[^"]+)"', page):
                await get(action.replace("&amp;", "&"))
        for path in ("core", "changes"):
            await get(path)
    return pages


def stand_in_browser(where: Path) -> tuple[Path, Path]:
    """An executable for `BROWSER` that records its argv (one argument a line) and exits:
    what every account on the machine could read in /proc/PID/cmdline. (script, record)."""
    record = where / "browser-argv"
    script = where / "stand-in-browser"
    script.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' \"$0\" \"$@\" > '{record}.tmp' && mv '{record}.tmp' '{record}'\n"
    )
    script.chmod(0o700)
    return script, record


def launch_links(text: str) -> list[str]:
    """The one-time launch links in `text` (an argv record, the server's stderr)."""
    return re.findall(r"http://127\.0\.0\.1:\d+/launch/[A-Za-z0-9_-]+", text)


@contextlib.asynccontextmanager
async def refusing_relay(upstream: str, port: int = 0) -> AsyncIterator[str]:
    """A relay in front of `upstream` that answers every EVENT `OK false` (REFUSAL) and
    passes everything else (AUTH, REQ, COUNT) through: reads work, writes are refused.
    On `port`, which `upstream` knows as one of its public URLs (AUTH goes through)."""

    async def handler(client: ServerConnection) -> None:
        async with websockets.connect(upstream, max_size=None) as relay:

            async def up() -> None:
                async for raw in client:
                    msg = msgspec.json.decode(raw)
                    if isinstance(msg, list) and msg[:1] == ["EVENT"] and len(msg) == 2:
                        answer = ["OK", msg[1]["id"], False, REFUSAL]
                        await client.send(msgspec.json.encode(answer).decode())
                        continue
                    await relay.send(raw)

            async def down() -> None:
                async for raw in relay:
                    await client.send(raw)

            await both_ways(up(), down())

    async with fake_relay(handler, port) as url:
        yield url


@contextlib.asynccontextmanager
async def truncating_relay(upstream: str, keep: int, port: int = 0) -> AsyncIterator[str]:
    """A relay in front of `upstream` that answers each REQ with at most `keep` events and
    ignores `until` (the same newest events again): a listing that cannot be paged to the
    end. Everything else (AUTH, EVENT) passes through. On `port`, as `refusing_relay`."""

    async def handler(client: ServerConnection) -> None:
        async with websockets.connect(upstream, max_size=None) as relay:

            async def up() -> None:
                async for raw in client:
                    msg = msgspec.json.decode(raw)
                    if isinstance(msg, list) and msg[:1] == ["REQ"]:
                        filters = [
                            {k: v for k, v in f.items() if k != "until"} | {"limit": keep}
                            for f in msg[2:]
                        ]
                        raw = msgspec.json.encode([*msg[:2], *filters]).decode()
                    await relay.send(raw)

            async def down() -> None:
                async for raw in relay:
                    await client.send(raw)

            await both_ways(up(), down())

    async with fake_relay(handler, port) as url:
        yield url


@dataclass
class Counted:
    """A relay in front of a real one that passes everything through and counts the
    websocket connections made to it: one per relay for each read of a memory."""

    url: str
    connections: int = 0


@contextlib.asynccontextmanager
async def counting_relay(upstream: str, port: int = 0) -> AsyncIterator[Counted]:
    """A `Counted` relay in front of `upstream`, on `port` (as `refusing_relay`)."""
    counted = Counted("")

    async def handler(client: ServerConnection) -> None:
        counted.connections += 1
        async with websockets.connect(upstream, max_size=None) as relay:

            async def up() -> None:
                async for raw in client:
                    await relay.send(raw)

            async def down() -> None:
                async for raw in relay:
                    await client.send(raw)

            await both_ways(up(), down())

    async with fake_relay(handler, port) as url:
        counted.url = url
        yield counted
