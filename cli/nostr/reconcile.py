"""Reconciling two relays and copying what one lacks: the library behind `engram sync`.

Reconciliation is NIP-77 negentropy where both relays serve it: this client holds
neither set and relays each relay's answers to the other (`engram.negentropy.Bridge`),
so only fingerprints and the differing ids cross the network. A relay that does not
serve it (it answers NEG-ERR, a NOTICE, or nothing in time) is paged with REQ instead
(`cli.nostr.paging.fetch_all`), and the other side, if it serves negentropy, is reconciled
against that list.

Events are copied exactly as stored and signed (fetched by id, published unchanged);
publishing an event twice is harmless, so running sync again only confirms. AUTH
(NIP-42) is answered when a relay asks for it, with the key given, if any.

Bounded in time: the run has one deadline (`timeout`), each step its own
(`step_timeout`, see `cli.nostr.peer`), and negentropy at most `MAX_ROUNDS` rounds. A relay
that stalls is named in a `Stalled` error; a run stopped part-way says what it had
copied and that it is not complete.

`sync_relays` is the entry point; agent-memory sync uses `reconcile_items` and `Peer`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cli.nostr.client import RelayError, fetch_nip11, open_relay
from cli.nostr.errors import BadInputError
from cli.nostr.peer import FETCH_CHUNK, Peer, Progress, Stalled, Unsupported, quiet
from engram.negentropy import Bridge, Items, Negentropy, NegentropyError

DIRECTIONS = ("up", "down", "both")
DEFAULT_TIMEOUT = 600.0  # seconds for a whole `engram sync` run
DEFAULT_STEP_TIMEOUT = 30.0  # seconds for any one answer (NEG-MSG, EOSE, OKs, connecting)
MAX_ROUNDS = 1_000  # negentropy rounds (a set of a billion needs a few dozen)
BACKSTOP_GRACE = 2.0  # seconds past --timeout before the run is cut off without a name

__all__ = [
    "DIRECTIONS",
    "Peer",
    "Reconciliation",
    "Stalled",
    "SyncSummary",
    "Unsupported",
    "copy_events",
    "reconcile",
    "reconcile_items",
    "sync_relays",
]


def _prefix(reason: str) -> str:
    """The NIP-01 machine-readable prefix of a refusal ("blocked", "restricted", ...)."""
    head, sep, _ = reason.partition(":")
    return head.strip() if sep and head.strip() and " " not in head.strip() else "other"


@dataclass
class SyncSummary:
    """What a sync found and did. `have`: ids on --from only; `need`: on --to only.
    `incomplete`: relay -> why its REQ listing may be partial (so may the copy be)."""

    method: str = ""
    have: int = 0
    need: int = 0
    copied_up: int = 0
    copied_down: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    incomplete: dict[str, str] = field(default_factory=dict)

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
            "incomplete": self.incomplete,
        }


@dataclass
class Reconciliation:
    """Ids (hex) only on A, only on B; how they were found."""

    only_a: list[str]
    only_b: list[str]
    method: str
    rounds: int = 0
    fallback: dict[str, str] = field(default_factory=dict)
    incomplete: dict[str, str] = field(default_factory=dict)


def _too_many_rounds(peer: Peer) -> Unsupported:
    return Unsupported(peer.url, f"negentropy did not converge within {MAX_ROUNDS} rounds")


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
        if bridge.rounds > MAX_ROUNDS:
            raise _too_many_rounds(receiver)
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
        if rounds >= MAX_ROUNDS:
            raise _too_many_rounds(peer)
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
    progress: Progress = quiet,
) -> Reconciliation:
    """The ids only A has and only B has: negentropy where it is served, else REQ.

    `timeout`: seconds for a relay's first negentropy answer before REQ is tried."""
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
    rec: Reconciliation | None = None
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
            rec = Reconciliation(only_a, only_b, "negentropy+req", rounds, fallback)
            break
    if rec is None:
        for p in (a, b):
            if p.url not in listed:
                listed[p.url] = await p.page_items(flt, progress)
        only_a, only_b = _diff(listed[a.url], listed[b.url])
        rec = Reconciliation(only_a, only_b, "req", 0, fallback)
    rec.incomplete = {p.url: p.incomplete for p in (a, b) if p.incomplete}
    return rec


async def copy_events(
    src: Peer,
    dst: Peer,
    ids: list[str],
    refused: Counter[str],
    progress: Progress = quiet,
    label: str = "copying",
    on_copied: Callable[[int], None] | None = None,
) -> int:
    """Copy events by id from `src` to `dst` unchanged; returns how many `dst` accepted.

    Refusals are counted by their NIP-01 prefix; an id `src` no longer serves counts as
    "missing". AUTH is answered as the client library's policy says. `on_copied` hears
    each chunk's count as it lands, so a run stopped part-way can say what it copied.
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
        landed = 0
        for ok, message in results.values():
            if ok:
                landed += 1
            else:
                refused[_prefix(message)] += 1
        copied += landed
        if on_copied is not None:
            on_copied(landed)
        done += len(chunk)
        progress(label, done, len(ids))
    return copied


async def sync_relays(
    from_url: str,
    to_url: str,
    flt: dict[str, Any] | None = None,
    direction: str = "up",
    seckey: bytes | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Progress = quiet,
    *,
    step_timeout: float = DEFAULT_STEP_TIMEOUT,
) -> SyncSummary:
    """Reconcile `from_url` and `to_url` over `flt`, then copy: `up` what only --from
    has to --to, `down` what only --to has to --from, or `both`.

    The whole run ends within `timeout` seconds, each step within `step_timeout`; a relay
    that misses either is named in a `Stalled` (a RelayError, exit code 2).
    """
    if direction not in DIRECTIONS:
        raise BadInputError(f"--direction must be one of {', '.join(DIRECTIONS)}")
    if timeout <= 0 or step_timeout <= 0:
        raise BadInputError("--timeout and --step-timeout must be positive")
    flt = dict(flt or {})
    flt.pop("limit", None)  # a sync covers the whole match
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    summary = SyncSummary()
    try:
        # the backstop: every step ends by `deadline` on its own, naming its relay
        async with asyncio.timeout(timeout + BACKSTOP_GRACE):
            await _sync(
                from_url, to_url, flt, direction, seckey, step_timeout, deadline, progress, summary
            )
    except TimeoutError as exc:
        raise RelayError(
            f"the sync of {from_url} and {to_url} did not finish within --timeout {timeout:g} s"
            + _partial(summary)
        ) from exc
    except RelayError as exc:
        if summary.copied_up or summary.copied_down or summary.method:
            raise RelayError(f"{exc}{_partial(summary)}") from exc
        raise
    return summary


def _partial(s: SyncSummary) -> str:
    if not s.method:
        return ""
    return (
        f"; stopped after reconciling ({s.have} only on --from, {s.need} only on --to) and "
        f"copying {s.copied_up} up, {s.copied_down} down: the sync is NOT complete, run it again"
    )


async def _sync(
    from_url: str,
    to_url: str,
    flt: dict[str, Any],
    direction: str,
    seckey: bytes | None,
    step_timeout: float,
    deadline: float,
    progress: Progress,
    summary: SyncSummary,
) -> None:
    # NIP-11 is optional (limits, NIP-77): it never takes more than half the run's time
    wait = min(step_timeout, max(deadline - asyncio.get_running_loop().time(), 0.2) / 2)
    info = await asyncio.gather(*(_nip11_or_none(u, wait) for u in (from_url, to_url)))
    loop = asyncio.get_running_loop()
    wait = min(step_timeout, max(deadline - loop.time(), 0.1))
    async with (
        open_relay(from_url, seckey, open_timeout=wait) as ca,
        open_relay(to_url, seckey, open_timeout=wait) as cb,
    ):
        a, b = (
            Peer(c, seckey, doc, step_timeout=step_timeout, deadline=deadline)
            for c, doc in ((ca, info[0]), (cb, info[1]))
        )
        rec = await reconcile(a, b, flt, step_timeout, progress)
        summary.method = rec.method
        summary.have, summary.need = len(rec.only_a), len(rec.only_b)
        summary.rounds = rec.rounds
        summary.fallback_reasons = rec.fallback
        summary.incomplete = rec.incomplete

        def up(n: int) -> None:
            summary.copied_up += n

        def down(n: int) -> None:
            summary.copied_down += n

        if direction in ("up", "both") and rec.only_a:
            await copy_events(a, b, rec.only_a, summary.refused, progress, "copying up", up)
        if direction in ("down", "both") and rec.only_b:
            await copy_events(b, a, rec.only_b, summary.refused, progress, "copying down", down)


async def _nip11_or_none(url: str, timeout: float) -> dict[str, Any] | None:
    try:
        return await fetch_nip11(url, timeout)
    except RelayError:
        return None


__all__ += ["DEFAULT_STEP_TIMEOUT", "DEFAULT_TIMEOUT", "MAX_ROUNDS"]
