"""One relay as `engram sync` and agent-memory sync see it: NIP-77 negentropy rounds,
REQ paging, fetching by id and publishing, every step with a deadline.

Requests run one at a time on the connection; frames for other subscriptions are
skipped. AUTH (NIP-42) follows the client library's one policy
(`RelayClient.answer_auth_required`).

Every step (a negentropy answer, a REQ up to EOSE, a window of OKs) has `step_timeout`
seconds, and no step runs past the run's `deadline` (event-loop time): a relay that
accepts the connection and then says nothing is named in a `Stalled` error instead of
hanging the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cli.nostr.client import RelayClient, limitation
from cli.nostr.errors import RelayError
from cli.nostr.paging import Fetched, fetch_all
from engram.negentropy import MIN_FRAME_SIZE, PROTOCOL_VERSION, Items
from engram.nip01 import Event

T = TypeVar("T")

DEFAULT_FRAME = 60_000  # negentropy bytes per message when a relay does not say (NIP-11)
MAX_FRAME = 400_000  # and never more: the client reads frames of at most 1 MiB
MAX_PAGE = 5_000  # REQ page size asked for at most, whatever max_limit says
FETCH_CHUNK = 100  # ids per REQ when fetching events to copy
PUBLISH_WINDOW = 100  # EVENTs in flight to the destination before waiting for OKs
ROUND_TIMEOUT = 120.0  # default seconds for any one step (a negentropy answer, EOSE, OKs)

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def quiet(_phase: str, _done: int, _total: int) -> None:
    return None


class Unsupported(Exception):
    """The relay at `url` does not (or will not) reconcile this filter with negentropy."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(reason)
        self.url = url


class Stalled(RelayError):
    """The relay at `url` did not answer a step within its deadline (exit code 2)."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url


class Peer:
    """One relay for sync: negentropy rounds, REQ paging, fetching and publishing."""

    def __init__(
        self,
        client: RelayClient,
        seckey: bytes | None,
        nip11: dict[str, Any] | None,
        *,
        step_timeout: float = ROUND_TIMEOUT,
        deadline: float | None = None,
    ) -> None:
        self.client = client
        self.url = client.url
        self.seckey = seckey
        self.nip11 = nip11 or {}
        self.step_timeout = step_timeout
        self.deadline = deadline  # event-loop time the whole run must end by, if any
        self.incomplete: str | None = None  # why REQ paging may have missed events
        self._neg_sub: str | None = None
        self._counter = 0

    # -- limits from NIP-11 --------------------------------------------------------

    @property
    def frame_limit(self) -> int:
        """Negentropy bytes per message this relay takes (hex doubles them)."""
        max_len = limitation(self.nip11, "max_message_length")
        if max_len is None:
            return DEFAULT_FRAME
        return max(MIN_FRAME_SIZE, min(MAX_FRAME, (max_len - 200) // 2))

    @property
    def max_limit(self) -> int | None:
        """The page size to ask for when the relay says its max_limit, else None."""
        known = limitation(self.nip11, "max_limit")
        return min(known, MAX_PAGE) if known else None

    @property
    def page_size(self) -> int:
        return self.max_limit or 500

    @property
    def serves_negentropy(self) -> bool | None:
        """From NIP-11: True or False if it lists its NIPs, None if unknown."""
        nips = self.nip11.get("supported_nips")
        return (77 in nips) if isinstance(nips, list) else None

    # -- deadlines -----------------------------------------------------------------

    def _budget(self, seconds: float) -> tuple[float, bool]:
        """(seconds this step may take, whether the run's deadline is what limits it)."""
        if self.deadline is None:
            return seconds, False
        left = max(self.deadline - asyncio.get_running_loop().time(), 0.0)
        return (left, True) if left < seconds else (seconds, False)

    def _stalled(self, what: str, seconds: float, whole: bool) -> Stalled:
        limit = "before the run's deadline (--timeout)" if whole else f"within {seconds:.3g} s"
        return Stalled(self.url, f"{self.url} stalled: no answer to {what} {limit}")

    async def step(self, what: str, work: Awaitable[T], seconds: float | None = None) -> T:
        """`work` bounded by the step's deadline; past it, `Stalled` naming this relay."""
        budget, whole = self._budget(self.step_timeout if seconds is None else seconds)
        try:
            async with asyncio.timeout(budget):
                return await work
        except TimeoutError as exc:
            raise self._stalled(what, budget, whole) from exc

    def _next_sub(self, stem: str) -> str:
        self._counter += 1
        return f"sync-{stem}-{self._counter}"

    # -- negentropy ----------------------------------------------------------------

    async def neg_open(self, flt: dict[str, Any], message: bytes, timeout: float) -> bytes:
        """NEG-OPEN; the relay's first answer, or Unsupported (NEG-ERR, a NOTICE, or
        nothing within `timeout`: then REQ paging is tried instead)."""
        while True:
            sub = self._next_sub("neg")
            self._neg_sub = sub
            await self.client.send(["NEG-OPEN", sub, flt, message.hex()])
            try:
                return await self._neg_answer(sub, timeout, first=True)
            except _AuthRetry:
                continue

    async def neg_msg(self, message: bytes) -> bytes:
        assert self._neg_sub is not None
        await self.client.send(["NEG-MSG", self._neg_sub, message.hex()])
        return await self._neg_answer(self._neg_sub, self.step_timeout, first=False)

    async def neg_close(self) -> None:
        if self._neg_sub is not None:
            sub, self._neg_sub = self._neg_sub, None
            await self.client.send(["NEG-CLOSE", sub])

    async def _neg_answer(self, sub: str, timeout: float, first: bool) -> bytes:
        budget, whole = self._budget(timeout)
        try:
            async with asyncio.timeout(budget):
                while True:
                    msg = await self.client.recv()
                    verb = msg[0]
                    if verb == "NOTICE" and first:
                        self._neg_sub = None
                        raise Unsupported(self.url, f"NOTICE {str(msg[1:2])[:120]}")
                    if len(msg) < 3 or msg[1] != sub:
                        continue
                    if verb == "NEG-ERR":
                        self._neg_sub = None
                        reason = str(msg[2])
                        if first and await self.client.answer_auth_required(reason):
                            raise _AuthRetry
                        raise Unsupported(self.url, f"NEG-ERR {reason}")
                    if verb == "NEG-MSG":
                        try:
                            data = bytes.fromhex(str(msg[2]))
                        except ValueError as exc:
                            raise Unsupported(self.url, "NEG-MSG that is not hex") from exc
                        if data[:1] != bytes((PROTOCOL_VERSION,)):
                            raise Unsupported(self.url, f"negentropy version {data[:1].hex()} only")
                        return data
        except TimeoutError as exc:
            self._neg_sub = None
            if whole:  # no time left to fall back to REQ paging either
                raise self._stalled("a negentropy message", budget, whole) from exc
            raise Unsupported(self.url, f"no negentropy answer within {budget:.3g} s") from exc

    # -- REQ -----------------------------------------------------------------------

    async def query(self, flt: dict[str, Any]) -> list[Event]:
        """Stored events matching `flt`, up to EOSE, within one step."""
        return await self.step("a REQ (no EOSE)", self.client.query(flt))

    async def page_items(self, flt: dict[str, Any], progress: Progress = quiet) -> Items:
        """Every (created_at, id) matching `flt` by REQ pages (`cli.nostr.paging.fetch_all`);
        why the listing may be partial, if it may, is left in `incomplete`."""
        fetched = await self.page(flt, progress)
        pairs = ((e.created_at, bytes.fromhex(i)) for i, e in fetched.events.items())
        return Items.from_pairs((ts, i) for ts, i in pairs if ts >= 0)

    async def page(self, flt: dict[str, Any], progress: Progress = quiet) -> Fetched:
        def shown(f: Fetched) -> None:
            progress(f"listing {self.url}", len(f.events), 0)

        fetched = await fetch_all(self, flt, self.max_limit, on_page=shown)
        self.incomplete = fetched.why_incomplete(self.max_limit is not None)
        return fetched

    # -- copying -------------------------------------------------------------------

    async def fetch(self, ids: list[str]) -> list[Event]:
        """The events with these ids that the relay serves (asked again for the rest
        while answers keep coming: a relay may cap a REQ below the number asked)."""
        wanted = set(ids)
        found: dict[str, Event] = {}
        while wanted:
            answer = await self.query({"ids": sorted(wanted), "limit": len(wanted)})
            got = [e for e in answer if e.id in wanted]
            if not got:
                break
            for e in got:
                found[e.id] = e
                wanted.discard(e.id)
        return list(found.values())

    async def fetch_ids(self, ids: list[str]) -> list[Event]:
        """`fetch`, a chunk of ids at a time."""
        out: list[Event] = []
        for k in range(0, len(ids), FETCH_CHUNK):
            out += await self.fetch(ids[k : k + FETCH_CHUNK])
        return out

    async def publish_all(self, events: list[Event]) -> dict[str, tuple[bool, str]]:
        """Send events (a window at a time, each window one step) and collect each OK:
        id -> (accepted, message), AUTH answered as the client library does."""
        results: dict[str, tuple[bool, str]] = {}
        for k in range(0, len(events), PUBLISH_WINDOW):
            window = events[k : k + PUBLISH_WINDOW]
            sent = self.client.try_publish_many(window, PUBLISH_WINDOW)
            results.update(await self.step("EVENTs (no OK)", sent))
        return results


class _AuthRetry(Exception):
    """Authenticated after an auth-required answer: send the request again."""
