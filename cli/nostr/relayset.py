"""A relay set: one connection per relay, every step run on all of them in parallel.

The whole operation has one deadline. A relay that fails or misses it is dropped from
the remaining steps and remembered with its reason, so the caller can go on with the
relays that answered and name the others; only when none is left is it an error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from cli.nostr.client import RelayClient, connect_relay, fetch_nip11, max_limit_of
from cli.nostr.errors import AuthError, BadInputError, RelayError

T = TypeVar("T")
CLOSE_WAIT = 2.0  # seconds to wait for close handshakes, within the operation's deadline
# Share of a step's remaining time every relay gets before the ones that have not answered
# are dropped, provided another relay did answer (see RelaySession._wait).
STRAGGLER_SHARE = 0.5


def parse_relays(value: str | Sequence[str]) -> list[str]:
    """Comma-separated (or listed) ws:// or wss:// URLs, duplicates dropped, order kept."""
    items = value.split(",") if isinstance(value, str) else list(value)
    urls = list(dict.fromkeys(u.strip() for u in items if u.strip()))
    if not urls:
        raise BadInputError("no relay URL given")
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise BadInputError(f"relay URL must look like ws://host:port or wss://host: {url!r}")
    return urls


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | asyncio.CancelledError):
        return "timed out"
    return " ".join(str(exc).split()) or type(exc).__name__


class RelaySession:
    """Connections to a set of relays for one operation, bounded by one deadline."""

    def __init__(self, urls: Sequence[str], seckey: bytes, timeout: float) -> None:
        self.urls = list(urls)
        self._seckey = seckey
        self._deadline = asyncio.get_running_loop().time() + timeout
        self.clients: dict[str, RelayClient] = {}
        self.failed: dict[str, BaseException] = {}

    @property
    def live(self) -> list[str]:
        """Relays still in the operation, in set order."""
        return [u for u in self.urls if u in self.clients and u not in self.failed]

    def reasons(self) -> dict[str, str]:
        return {u: _reason(e) for u, e in self.failed.items()}

    async def run(
        self, step: Callable[[str], Awaitable[T]], urls: Sequence[str] | None = None
    ) -> dict[str, T]:
        """Run `step(url)` for every live relay (or `urls`) at once; url -> result.

        Failures and relays still running at the deadline move to `failed`.
        """
        targets = [u for u in (self.urls if urls is None else urls) if u not in self.failed]
        tasks = {u: asyncio.ensure_future(step(u)) for u in targets}
        if not tasks:
            return {}
        try:
            pending = await self._wait(set(tasks.values()))
        except BaseException:  # the caller gave up: leave nothing running behind it
            for task in tasks.values():
                task.cancel()
                task.add_done_callback(_retrieve)
            raise
        results: dict[str, T] = {}
        for url, task in tasks.items():
            if task in pending:
                task.cancel()
                task.add_done_callback(_retrieve)
                self.failed[url] = TimeoutError()
            elif (exc := task.exception()) is not None:
                self.failed[url] = exc
            else:
                results[url] = task.result()
        return results

    async def _wait(self, pending: set[asyncio.Future[T]]) -> set[asyncio.Future[T]]:
        """Wait for the step on every relay; the ones still pending when it gives up.

        All relays get `STRAGGLER_SHARE` of the time left. Past that, once one relay has
        answered, the rest are cut off: a relay that hangs must not use up the whole
        deadline of every step while the others wait to go on. With no answer yet, the
        step keeps waiting (to the deadline) for the first one.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        cutoff = now + max(self._deadline - now, 0) * STRAGGLER_SHARE
        done, pending = await asyncio.wait(pending, timeout=max(cutoff - now, 0))
        while pending and not any(_succeeded(t) for t in done):
            remaining = self._deadline - loop.time()
            if remaining <= 0:
                break
            more, pending = await asyncio.wait(
                pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            done |= more
        return pending

    async def connect(self) -> None:
        async def one(url: str) -> RelayClient:
            left = self._deadline - asyncio.get_running_loop().time()
            client = await connect_relay(url, self._seckey, max(left, 0.1))
            self.clients[url] = client
            return client

        await self.run(one)

    async def on_each(
        self, step: Callable[[RelayClient], Awaitable[T]], urls: Sequence[str] | None = None
    ) -> dict[str, T]:
        """`step(client)` on every live relay (or those of `urls` still live)."""
        chosen = self.live if urls is None else [u for u in urls if u in self.live]
        return await self.run(lambda u: step(self.clients[u]), chosen)

    async def max_limits(self) -> dict[str, int | None]:
        """NIP-11 `max_limit` of every live relay; None when unknown (and why, in notes)."""
        self.nip11_notes: dict[str, str] = {}
        self.nip11_docs: dict[str, dict[str, Any]] = {}

        async def one(url: str) -> int | None:
            try:
                remaining = self._deadline - asyncio.get_running_loop().time()
                self.nip11_docs[url] = doc = await fetch_nip11(url, max(remaining, 0.1))
                return max_limit_of(doc)
            except RelayError as exc:
                self.nip11_notes[url] = str(exc)
                return None

        limits = await self.run(one, self.live)
        for url in self.live:
            if limits.get(url) is None and url not in self.nip11_notes:
                self.nip11_notes[url] = "the relay does not publish max_limit (NIP-11)"
        return limits

    def raise_if_none(self, answered: Sequence[str] | dict[str, object]) -> None:
        """No relay left: one error naming every relay and why (auth if all were auth)."""
        if answered:
            return
        errors = [self.failed[u] for u in self.urls if u in self.failed]
        if len(self.urls) == 1 and errors:
            exc = errors[0]
            if isinstance(exc, TimeoutError):
                raise RelayError("timed out waiting for the relay")
            if isinstance(exc, AuthError | RelayError):
                raise type(exc)(str(exc))
            raise RelayError(_reason(exc))
        detail = "; ".join(f"{u}: {r}" for u, r in self.reasons().items())
        cls = AuthError if errors and all(isinstance(e, AuthError) for e in errors) else RelayError
        raise cls(f"no relay answered ({detail})")

    async def close(self) -> None:
        """Close every connection without waiting past the operation (closing is best effort)."""
        clients, self.clients = list(self.clients.values()), {}
        tasks = [asyncio.ensure_future(client.close()) for client in clients]
        for task in tasks:
            task.add_done_callback(_retrieve)
        if tasks:
            remaining = self._deadline - asyncio.get_running_loop().time()
            with contextlib.suppress(Exception):
                await asyncio.wait(tasks, timeout=min(max(remaining, 0.05), CLOSE_WAIT))


def _succeeded(task: asyncio.Future[object]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


def _retrieve(task: asyncio.Future[object]) -> None:
    """Consume an abandoned task's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
