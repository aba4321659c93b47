"""`engram sync`: copy the events two relays do not share, in one or both directions.

Reconciliation is NIP-77 negentropy where both relays serve it: this client holds
neither set and relays each relay's answers to the other (`engram.negentropy.Bridge`),
so only fingerprints and the differing ids cross the network. A relay that does not
serve it (it answers NEG-ERR, a NOTICE, or nothing in time) is paged with REQ instead
(`until`, then the ids already seen at that second: the (created_at, id) tie-break),
and the other side, if it serves negentropy, is reconciled against that list.

Events are copied exactly as stored and signed (fetched by id, published unchanged);
publishing an event twice is harmless, so running sync again only confirms. AUTH
(NIP-42) is answered when a relay asks for it, with the key given, if any.

`sync_relays` is the entry point other commands (agent memory sync) call.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from cli.client import AuthError, RelayClient, RelayError, fetch_nip11, open_relay
from cli.identity import ENV_KEY, InputError, read_secret_key
from engram.negentropy import (
    MIN_FRAME_SIZE,
    PROTOCOL_VERSION,
    Bridge,
    Items,
    Negentropy,
    NegentropyError,
)
from engram.nip01 import Event

DIRECTIONS = ("up", "down", "both")
DEFAULT_FRAME = 60_000  # negentropy bytes per message when a relay does not say (NIP-11)
MAX_FRAME = 400_000  # and never more: the client reads frames of at most 1 MiB
FETCH_CHUNK = 100  # ids per REQ when fetching events to copy
PUBLISH_WINDOW = 100  # EVENTs in flight to the destination before waiting for OKs
ROUND_TIMEOUT = 120.0  # seconds for any later negentropy answer


class Unsupported(Exception):
    """The relay at `url` does not (or will not) reconcile this filter with negentropy."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(reason)
        self.url = url


@dataclass
class SyncSummary:
    """What a sync found and did. `have`: ids on --from only; `need`: on --to only."""

    method: str = ""
    have: int = 0
    need: int = 0
    copied_up: int = 0
    copied_down: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    fallback_reasons: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "have": self.have,
            "need": self.need,
            "copied_up": self.copied_up,
            "copied_down": self.copied_down,
            "refused": dict(self.refused),
            "rounds": self.rounds,
            "fallback": self.fallback_reasons,
        }


Progress = Callable[[str, int, int], None]  # (phase, done, total)


def _quiet(_phase: str, _done: int, _total: int) -> None:
    return None


def _prefix(reason: str) -> str:
    """The NIP-01 machine-readable prefix of a refusal ("blocked", "restricted", ...)."""
    head, sep, _ = reason.partition(":")
    return head.strip() if sep and head.strip() and " " not in head.strip() else "other"


class Peer:
    """One relay for sync: negentropy rounds, REQ paging, fetching and publishing.

    Requests run one at a time on the connection; frames for other subscriptions are
    skipped. An `auth-required:` answer is met with AUTH (once) when a key is known.
    """

    def __init__(
        self, client: RelayClient, seckey: bytes | None, nip11: dict[str, Any] | None
    ) -> None:
        self.client = client
        self.url = client.url
        self.seckey = seckey
        self.nip11 = nip11 or {}
        self.authed = False
        self._neg_sub: str | None = None
        self._counter = 0

    # -- limits from NIP-11 --------------------------------------------------------

    def _limitation(self, name: str) -> int | None:
        lim = self.nip11.get("limitation")
        value = lim.get(name) if isinstance(lim, dict) else None
        return value if isinstance(value, int) and value > 0 else None

    @property
    def frame_limit(self) -> int:
        """Negentropy bytes per message this relay takes (hex doubles them)."""
        max_len = self._limitation("max_message_length")
        if max_len is None:
            return DEFAULT_FRAME
        return max(MIN_FRAME_SIZE, min(MAX_FRAME, (max_len - 200) // 2))

    @property
    def page_size(self) -> int:
        return min(self._limitation("max_limit") or 500, 5_000)

    @property
    def serves_negentropy(self) -> bool | None:
        """From NIP-11: True or False if it lists its NIPs, None if unknown."""
        nips = self.nip11.get("supported_nips")
        return (77 in nips) if isinstance(nips, list) else None

    async def _auth_once(self, reason: str) -> bool:
        """AUTH after an `auth-required:` answer; False if it cannot help."""
        if not reason.startswith("auth-required:") or self.seckey is None or self.authed:
            return False
        await self.client.authenticate(self.seckey)
        self.authed = True
        return True

    def _next_sub(self, stem: str) -> str:
        self._counter += 1
        return f"sync-{stem}-{self._counter}"

    # -- negentropy ----------------------------------------------------------------

    async def neg_open(self, flt: dict[str, Any], message: bytes, timeout: float) -> bytes:
        """NEG-OPEN; the relay's first answer, or Unsupported."""
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
        return await self._neg_answer(self._neg_sub, ROUND_TIMEOUT, first=False)

    async def neg_close(self) -> None:
        if self._neg_sub is not None:
            sub, self._neg_sub = self._neg_sub, None
            await self.client.send(["NEG-CLOSE", sub])

    async def _neg_answer(self, sub: str, timeout: float, first: bool) -> bytes:
        try:
            async with asyncio.timeout(timeout):
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
                        if first and await self._auth_once(reason):
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
            raise Unsupported(self.url, f"no negentropy answer within {timeout:g} s") from exc

    # -- REQ -----------------------------------------------------------------------

    async def query(self, flt: dict[str, Any]) -> list[Event]:
        try:
            return await self.client.query(flt)
        except AuthError as exc:
            if await self._auth_once(str(exc).rpartition("read: ")[2]):
                return await self.client.query(flt)
            raise

    async def page_items(self, flt: dict[str, Any], progress: Progress) -> Items:
        """Every (created_at, id) matching `flt`, newest first by REQ pages.

        Pages go back with `until` = the oldest second seen, skipping the ids already
        seen at that second; a page that brings nothing new steps below that second.
        """
        seen: dict[str, int] = {}
        until = flt.get("until")
        since = flt.get("since", 0)
        while True:
            page = {**flt, "limit": self.page_size}
            if until is not None:
                page["until"] = until
            events = await self.query(page)
            fresh = [e for e in events if e.id not in seen]
            for e in fresh:
                seen[e.id] = e.created_at
            progress(f"listing {self.url}", len(seen), 0)
            if not events:
                break
            oldest = min(e.created_at for e in events)
            if fresh:
                until = oldest
            elif oldest > since:
                until = oldest - 1
            else:
                break
        return Items.from_pairs((ts, bytes.fromhex(i)) for i, ts in seen.items() if ts >= 0)

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

    async def publish_all(self, events: list[Event]) -> dict[str, tuple[bool, str]]:
        """Send events (a window at a time) and collect each OK: id -> (accepted, message)."""
        results: dict[str, tuple[bool, str]] = {}
        for k in range(0, len(events), PUBLISH_WINDOW):
            window = events[k : k + PUBLISH_WINDOW]
            want = {e.id for e in window}
            for e in window:
                await self.client.send(["EVENT", e])
            async with asyncio.timeout(ROUND_TIMEOUT):
                while want:
                    msg = await self.client.recv()
                    if msg[0] == "OK" and len(msg) >= 3 and msg[1] in want:
                        want.discard(msg[1])
                        results[msg[1]] = (bool(msg[2]), str(msg[3]) if len(msg) > 3 else "")
        return results


class _AuthRetry(Exception):
    """Authenticated after an auth-required answer: send the request again."""


# --- reconciliation -----------------------------------------------------------------


@dataclass
class Reconciliation:
    """Ids (hex) only on A, only on B; how they were found."""

    only_a: list[str]
    only_b: list[str]
    method: str
    rounds: int = 0
    fallback: dict[str, str] = field(default_factory=dict)


async def _bridge(
    a: Peer, b: Peer, flt: dict[str, Any], timeout: float, progress: Progress
) -> Reconciliation:
    """Negentropy between two relays through this client (both must serve it).

    Both sessions open at once, so the two relays read their sets in parallel; B's
    first answer (a split of its own set) is not needed and is dropped.
    """
    bridge = Bridge(a.frame_limit, b.frame_limit)
    opened = await asyncio.gather(
        a.neg_open(flt, bridge.initial(), timeout),
        b.neg_open(flt, bridge.initial(), timeout),
        return_exceptions=True,
    )
    for answer in opened:
        if isinstance(answer, BaseException):
            raise answer
    reply = opened[0]
    assert isinstance(reply, bytes)
    sender, receiver = a, b
    while True:
        progress("reconciling", bridge.rounds, 0)
        try:
            out = bridge.forward(reply, "a" if sender is a else "b")
        except NegentropyError as exc:
            raise Unsupported(sender.url, f"bad negentropy message: {exc}") from exc
        if out is None:
            break
        reply = await receiver.neg_msg(out)
        sender, receiver = receiver, sender
    await a.neg_close()
    await b.neg_close()
    return Reconciliation(
        [i.hex() for i in bridge.only_a],
        [i.hex() for i in bridge.only_b],
        "negentropy",
        bridge.rounds,
    )


async def reconcile_items(
    peer: Peer, items: Items, flt: dict[str, Any], timeout: float
) -> tuple[list[str], list[str], int]:
    """Our list as the initiator against one negentropy relay: (ours only, theirs only,
    rounds). Agent memory sync uses it too, with the events it has read."""
    neg = Negentropy(items, peer.frame_limit)
    reply = await peer.neg_open(flt, neg.initiate(), timeout)
    have: list[bytes] = []
    need: list[bytes] = []
    rounds = 1
    while True:
        try:
            nxt, h, n = neg.reconcile_initiator(reply)
        except NegentropyError as exc:
            raise Unsupported(peer.url, f"bad negentropy message: {exc}") from exc
        have.extend(h)
        need.extend(n)
        if nxt is None:
            break
        reply = await peer.neg_msg(nxt)
        rounds += 1
    await peer.neg_close()
    return [i.hex() for i in have], [i.hex() for i in need], rounds


def _diff(x: Items, y: Items) -> tuple[list[str], list[str]]:
    xs = {x.id_at(i) for i in range(len(x))}
    ys = {y.id_at(i) for i in range(len(y))}
    return sorted(i.hex() for i in xs - ys), sorted(i.hex() for i in ys - xs)


async def reconcile(
    a: Peer,
    b: Peer,
    flt: dict[str, Any],
    timeout: float = 10.0,
    progress: Progress = _quiet,
) -> Reconciliation:
    """The ids only A has and only B has: negentropy where it is served, else REQ."""
    fallback: dict[str, str] = {}
    neg = {p.url: p.serves_negentropy is not False for p in (a, b)}
    for p in (a, b):
        if not neg[p.url]:
            fallback[p.url] = "NIP-11 does not list 77"
    if neg[a.url] and neg[b.url]:
        try:
            return await _bridge(a, b, flt, timeout, progress)
        except Unsupported as exc:
            fallback[exc.url] = str(exc)
            neg[exc.url] = False
            for p in (a, b):
                await p.neg_close()
    if a.url == b.url:  # the same relay twice: nothing to reconcile
        return Reconciliation([], [], "none", 0, fallback)
    listed: dict[str, Items] = {}
    for p in (a, b):
        if not neg[p.url]:
            listed[p.url] = await p.page_items(flt, progress)
    for p, other in ((a, b), (b, a)):
        if neg[p.url] and other.url in listed:
            try:
                theirs_only, ours_only, rounds = await reconcile_items(
                    p, listed[other.url], flt, timeout
                )
            except Unsupported as exc:
                fallback[p.url] = str(exc)
                await p.neg_close()
                listed[p.url] = await p.page_items(flt, progress)
                break
            only_p, only_other = ours_only, theirs_only
            only_a, only_b = (only_p, only_other) if p is a else (only_other, only_p)
            return Reconciliation(only_a, only_b, "negentropy+req", rounds, fallback)
    for p in (a, b):
        if p.url not in listed:
            listed[p.url] = await p.page_items(flt, progress)
    only_a, only_b = _diff(listed[a.url], listed[b.url])
    return Reconciliation(only_a, only_b, "req", 0, fallback)


async def copy_events(
    src: Peer,
    dst: Peer,
    ids: list[str],
    refused: Counter[str],
    progress: Progress = _quiet,
    label: str = "copying",
) -> int:
    """Copy events by id from `src` to `dst` unchanged; returns how many `dst` accepted.

    Refusals are counted by their NIP-01 prefix; an id `src` no longer serves counts as
    "missing". An `auth-required:` refusal is retried once after AUTH, if a key is known.
    """
    copied = 0
    done = 0
    step = min(FETCH_CHUNK, src.page_size)
    for k in range(0, len(ids), step):
        chunk = ids[k : k + step]
        events = await src.fetch(chunk)
        missing = len(set(chunk) - {e.id for e in events})
        if missing:
            refused["missing"] += missing
        results = await dst.publish_all(events)
        retry = [e for e in events if not results[e.id][0] and results[e.id][1]]
        retry = [e for e in retry if results[e.id][1].startswith("auth-required:")]
        if retry and await dst._auth_once(results[retry[0].id][1]):
            results.update(await dst.publish_all(retry))
        for ok, message in results.values():
            if ok:
                copied += 1
            else:
                refused[_prefix(message)] += 1
        done += len(chunk)
        progress(label, done, len(ids))
    return copied


async def sync_relays(
    from_url: str,
    to_url: str,
    flt: dict[str, Any] | None = None,
    direction: str = "up",
    seckey: bytes | None = None,
    timeout: float = 10.0,
    progress: Progress = _quiet,
) -> SyncSummary:
    """Reconcile `from_url` and `to_url` over `flt`, then copy: `up` what only --from
    has to --to, `down` what only --to has to --from, or `both`."""
    if direction not in DIRECTIONS:
        raise InputError(f"--direction must be one of {', '.join(DIRECTIONS)}")
    flt = dict(flt or {})
    flt.pop("limit", None)  # a sync covers the whole match
    info = await asyncio.gather(
        *(_nip11_or_none(u, timeout) for u in (from_url, to_url)), return_exceptions=False
    )
    async with open_relay(from_url) as ca, open_relay(to_url) as cb:
        a, b = Peer(ca, seckey, info[0]), Peer(cb, seckey, info[1])
        rec = await reconcile(a, b, flt, timeout, progress)
        summary = SyncSummary(
            method=rec.method,
            have=len(rec.only_a),
            need=len(rec.only_b),
            rounds=rec.rounds,
            fallback_reasons=rec.fallback,
        )
        if direction in ("up", "both") and rec.only_a:
            summary.copied_up = await copy_events(
                a, b, rec.only_a, summary.refused, progress, "copying up"
            )
        if direction in ("down", "both") and rec.only_b:
            summary.copied_down = await copy_events(
                b, a, rec.only_b, summary.refused, progress, "copying down"
            )
    return summary


async def _nip11_or_none(url: str, timeout: float) -> dict[str, Any] | None:
    try:
        return await fetch_nip11(url, timeout)
    except RelayError:
        return None


# --- the command --------------------------------------------------------------------


class _Bar:
    """A one-line progress display on a terminal (stderr), nothing otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.shown = False

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if total:
            width = 30
            filled = width * done // total
            text = f"{phase} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        else:
            text = f"{phase} … {done}"
        sys.stderr.write("\r\x1b[2K" + text)
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()


def _print_summary(s: SyncSummary, from_url: str, to_url: str) -> None:
    typer.echo(f"method: {s.method} ({s.rounds} rounds)" if s.rounds else f"method: {s.method}")
    for url, why in s.fallback_reasons.items():
        typer.echo(f"fallback: {url}: {why}")
    typer.echo(f"have: {s.have} (only on {from_url})")
    typer.echo(f"need: {s.need} (only on {to_url})")
    typer.echo(f"copied: {s.copied_up} up, {s.copied_down} down")
    refused = ", ".join(f"{k}: {v}" for k, v in sorted(s.refused.items())) or "none"
    typer.echo(f"refused: {refused}")


def sync_command(
    from_url: Annotated[str, typer.Option("--from", help="Relay URL to copy from (ws:// wss://).")],
    to_url: Annotated[str, typer.Option("--to", help="Relay URL to copy to.")],
    filter_json: Annotated[
        str, typer.Option("--filter", help="NIP-01 filter as JSON (default {}: everything).")
    ] = "{}",
    direction: Annotated[
        str,
        typer.Option(
            "--direction", help="up: --from to --to (default); down: --to to --from; both."
        ),
    ] = "up",
    key_file: Annotated[
        Path | None,
        typer.Option("--key-file", help=f"Key for AUTH when a relay asks (else env {ENV_KEY})."),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for a relay's first answer.")
    ] = 15.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Copy the events two relays do not share (NIP-77 negentropy, else REQ paging)."""
    try:
        flt = json.loads(filter_json)
        if not isinstance(flt, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        typer.echo(f"engram: --filter must be a JSON object: {exc}", err=True)
        raise typer.Exit(1) from exc
    seckey: bytes | None = None
    try:
        if key_file is not None or _env_key():
            seckey = read_secret_key(key_file)
        for url in (from_url, to_url):
            if not url.startswith(("ws://", "wss://")):
                raise InputError(f"relay URL must start with ws:// or wss://: {url!r}")
    except InputError as exc:
        typer.echo(f"engram: {exc}", err=True)
        raise typer.Exit(1) from exc
    bar = _Bar(sys.stderr.isatty() and not as_json)
    try:
        summary = asyncio.run(sync_relays(from_url, to_url, flt, direction, seckey, timeout, bar))
    except InputError as exc:
        bar.close()
        typer.echo(f"engram: {exc}", err=True)
        raise typer.Exit(1) from exc
    except AuthError as exc:
        bar.close()
        typer.echo(f"engram: {exc}", err=True)
        raise typer.Exit(3) from exc
    except (RelayError, TimeoutError, OSError) as exc:
        bar.close()
        typer.echo(f"engram: {exc or 'timed out waiting for a relay'}", err=True)
        raise typer.Exit(2) from exc
    bar.close()
    if as_json:
        typer.echo(msgspec.json.encode(summary.as_dict()).decode())
    else:
        _print_summary(summary, from_url, to_url)


def _env_key() -> bool:
    return bool(os.environ.get(ENV_KEY))
