"""Checking the events a relay set returned for one agent's memory: each distinct event is
validated (and decrypted) at most once, invalid ones are counted by reason. The head
rule is `engram.head`'s (`first_valid_heads`, `merge_heads`) and the version rules are
`engram.versions`'s, never restated here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec

from cli.memory.results import SKIP_REASONS
from cli.nostr.identity import Identity
from engram import KIND_ENGRAM, Head, InvalidEngramError, first_valid_heads
from engram.envelope import open_engram
from engram.nip01 import Event
from engram.versions import KIND_REVISION, KIND_VERDICT, Version, head_version, validate_version


def memory_filters(
    ident: Identity, d: str | None = None, *, history: bool = False
) -> list[dict[str, Any]]:
    """The REQ filters of one agent's memory: [the agent's heads (and revisions, for
    history), the owner's verdicts], for one slug's `d` tag or all."""
    # `#d` first: a relay may drive a limited scan by the first tag a filter names (this
    # one did before it preferred `d`: relay.store.sqlread._driving_tag), and one slug's
    # `d` is a handful of events where the owner's `p` is on every one of the memory's (a
    # paged read of one slug ran into the relay's 10 s query timeout at 10,000 memories)
    by_d = {"#d": [d]} if d is not None else {}
    kinds = [KIND_ENGRAM, KIND_REVISION] if history else [KIND_ENGRAM]
    return [
        {"kinds": kinds, "authors": [ident.agent], **by_d, "#p": [ident.owner]},
        {"kinds": [KIND_VERDICT], "authors": [ident.owner], **by_d, "#p": [ident.agent]},
    ]


class HeadChecker:
    """Validates each distinct event once (a tampered copy is a distinct event) and
    counts the invalid ones by reason. Heads (kind 30174) come back as `Head` for the
    head rule and as `Version` for the history extension; revisions and verdicts as
    `Version`."""

    def __init__(self, ident: Identity) -> None:
        self._ident = ident
        self._seen: dict[bytes, tuple[Head | None, Version | None]] = {}
        self.skipped: Counter[str] = Counter()

    def _check(self, event: Event) -> tuple[Head | None, Version | None]:
        key = msgspec.json.encode(event)
        if key in self._seen:
            return self._seen[key]
        ident = self._ident
        head: Head | None = None
        version: Version | None = None
        try:
            if event.kind == KIND_ENGRAM:
                body, obj = open_engram(event, ident.agent, ident.owner, ident.conversation_key)
                head, version = Head(event, body), head_version(event, body, obj)
            else:
                version = validate_version(event, ident.agent, ident.owner, ident.conversation_key)
        except InvalidEngramError as exc:
            self.skipped[SKIP_REASONS.get(exc.rule, "invalid")] += 1
        self._seen[key] = (head, version)
        return head, version

    def head(self, event: Event) -> Head | None:
        return self._check(event)[0] if event.kind == KIND_ENGRAM else None

    def version(self, event: Event) -> Version | None:
        """Any event of the memory as a version (a head as its version), or None."""
        return self._check(event)[1]

    def heads(self, events: Iterable[Event]) -> dict[str, Head]:
        """slug -> head among the kind-30174 `events` (spec: *Head selection*), older
        versions of a slug never decrypted once a newer valid one is found."""
        return first_valid_heads((e for e in events if e.kind == KIND_ENGRAM), self.head)

    def versions(self, events: Iterable[Event]) -> list[Version]:
        """Every valid version among `events` (heads included, as versions)."""
        return [v for e in events if (v := self.version(e)) is not None]


def as_version(checker: HeadChecker, head: Head) -> Version:
    """A head chosen by the head rule, as its version."""
    version = checker.version(head.event)
    assert version is not None  # a Head was valid, so its version is
    return version


def behind(views: dict[str, dict[str, Head]], merged: dict[str, Head]) -> dict[str, int]:
    """relay -> how many slugs it holds an older head for (or none), against `merged`."""
    out: dict[str, int] = {}
    for url, view in views.items():
        n = sum(
            1
            for slug, h in merged.items()
            if (v := view.get(slug)) is None or v.event.id != h.event.id
        )
        if n:
            out[url] = n
    return out
