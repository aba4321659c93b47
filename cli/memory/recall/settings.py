"""Recall's defaults, in one place."""

from __future__ import annotations

from dataclasses import dataclass

from cli.memory.recall.dense import DEFAULT_MODEL


@dataclass(frozen=True)
class RecallSettings:
    model: str = DEFAULT_MODEL
    limit: int = 10  # memories per recall
    snippet: int = 100  # characters of a value shown in plain output
    # Write-time hints: memories whose cosine similarity to the value written (slug words
    # included, as indexed) is at least this are named by `set`. On the tuning split of
    # `python -m bench recall quality --similarity`: 95% of near-duplicates (one fact said
    # another way) score >= 0.80, 95% of other facts about the same person < 0.77.
    similar: float = 0.80
    similar_limit: int = 3
    # A long-running process asks each relay only for events from `warm_slack` seconds
    # before the newest it has seen (`since`, one round trip: a write by another process in
    # the same second, or just behind a head whose created_at was bumped by the monotonic
    # rule, is still seen); every `reconcile_seconds` it checks exactly (NIP-77 against the
    # index where the relay serves it, else `since` paging from `slack` seconds before the
    # newest), which also catches writers whose clocks run behind.
    warm_slack: int = 5
    reconcile_seconds: float = 60.0
    slack: int = 600  # engram.FUTURE_SKEW_MAX: the clock skew a write may carry


SETTINGS = RecallSettings()
