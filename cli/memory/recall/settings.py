"""Recall's defaults, in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from cli.memory.recall.dense import DEFAULT_MODEL


def _model() -> str:
    """`ENGRAM_RECALL_MODEL` (e.g. minilm-l6-int8, from the recall-large extra), else the
    default: each model has its own cache file."""
    return os.environ.get("ENGRAM_RECALL_MODEL") or DEFAULT_MODEL


@dataclass(frozen=True)
class RecallSettings:
    model: str = field(default_factory=_model)
    limit: int = 10  # memories per recall
    snippet: int = 100  # characters of a value shown in plain output
    # Write-time hints: memories whose value's vector has a cosine of at least this with
    # the value written (values only: a near-duplicate is the same fact under another
    # slug) are named by `set`. On the tuning split of `python -m bench recall quality
    # --similarity`: 96% of near-duplicates (one fact said another way) score >= 0.60 and
    # 3% of other facts about the same person do (wordllama-256; minilm-l6-int8: 99% and
    # 2%).
    similar: float = 0.60
    similar_limit: int = 3
    # How the index follows the relays (cli.memory.recall.updater): a process's first
    # call reads each relay exactly with NIP-77 where it can (else asks from `slack`
    # seconds before the newest event it gave: engram.FUTURE_SKEW_MAX, the clock skew a
    # write may carry); later calls of a long-running process ask from `warm_slack`
    # before it (a write by another process in the same second, or just behind a head
    # whose created_at was bumped by the monotonic rule, is still seen) and check exactly
    # every `reconcile_seconds` in the background. A relay without NIP-77 is read whole
    # every `full_every` seconds: a write dated more than `slack` behind the newest (a
    # head copied in later by `engram mem sync`) is missed for at most that long there.
    warm_slack: int = 5
    reconcile_seconds: float = 60.0
    slack: int = 600
    full_every: float = 86_400.0
    seen_max: int = 50_000  # events seen that are no head, remembered for NIP-77
    # An event dated further ahead of this machine's clock than this is skipped as
    # absurd: a writer keeps within engram.FUTURE_SKEW_MAX (600 s) of its own clock and
    # relays refuse more than 900 s ahead by default; a day leaves room for any skew.
    future_max: int = 86_400
    save_delay: float = 5.0  # a long-running process saves the cache this long after a change


SETTINGS = RecallSettings()
