"""What `bench flood`'s flooders send: costly REQs drawn from the corpus's own values.

Absent and rare words and tag values, many-valued absent tag lists, a common value or
word with a kind nobody publishes or a time span long past (every row of the value is
read and turned down), and 16 such filters in one REQ. A shape whose values the corpus
lacks at a size is left out.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import corpus
from bench.corpus import BASE_TIME, Picks

ABSENT_KIND = 5  # no corpus publishes kind 5 (corpus.KIND_MIX)
LIMIT = 10
MAX_FILTERS = 16  # relay.config.Limits.max_filters
MAX_VALUES = 256  # relay.config.Limits.max_filter_values

Draw = Callable[[random.Random], Any]


@dataclass
class FloodShape:
    name: str
    what: str  # the filter(s), for the report
    make: Callable[[random.Random], list[dict[str, Any]]]  # the filters of one REQ


def _absent(what: str) -> Callable[[random.Random], str]:
    return lambda rng: corpus.absent(what, rng.randrange(10**9))


def flood_shapes(picks: Picks) -> list[FloodShape]:
    """The costly REQs, from the values of this store size (a shape whose values the
    corpus lacks at this size is left out), then all of them 16 to a REQ."""
    singles = _absent_shapes() + _present_shapes(picks.values)
    every = FloodShape(
        f"{MAX_FILTERS} filters",
        f"{MAX_FILTERS} filters in one REQ, each of a shape above (drawn)",
        lambda rng: [rng.choice(singles).make(rng)[0] for _ in range(MAX_FILTERS)],
    )
    return [*singles, every]


def _absent_shapes() -> list[FloodShape]:
    """Words and tag values no event has: the index finds nothing, fast or not."""
    out = [
        FloodShape(
            "search absent",
            f"search a word no event has, limit {LIMIT}",
            lambda rng: [{"search": _absent("search")(rng), "limit": LIMIT}],
        )
    ]
    for tag in ("#e", "#p", "#t"):
        out.append(
            FloodShape(
                f"{tag} absent",
                f"`{tag}` a value no event has, limit {LIMIT}",
                lambda rng, tag=tag: [{tag: [_absent(tag)(rng)], "limit": LIMIT}],
            )
        )
    out.append(
        FloodShape(
            f"#t {MAX_VALUES} absent",
            f"`#t` {MAX_VALUES} values no event has, limit {LIMIT}",
            lambda rng: [{"#t": [_absent("#t")(rng) for _ in range(MAX_VALUES)], "limit": LIMIT}],
        )
    )
    return out


def _present_shapes(v: dict[str, Any]) -> list[FloodShape]:
    """Values the corpus has, asked so that every row of them is read and turned down."""

    def one_of(key: str) -> Draw | None:
        values = v.get(key) or []
        return (lambda rng: rng.choice(values)) if values else None

    out = []
    rare = one_of("search rare")
    if rare is not None:
        out.append(
            FloodShape(
                "search rare",
                f"search a word on 1-5 events, limit {LIMIT}",
                lambda rng: [{"search": rare(rng), "limit": LIMIT}],
            )
        )
    common_word = one_of("search common")
    if common_word is not None:
        out += _common_word_shapes(common_word)
    for tag in ("#t", "#p"):
        common = one_of(f"{tag} common")
        if common is not None:
            out.append(
                FloodShape(
                    f"{tag} common in kind {ABSENT_KIND}",
                    f"`{tag}` a top-5 value, kinds [{ABSENT_KIND}] (none), limit {LIMIT}",
                    lambda rng, tag=tag, common=common: [
                        {tag: [common(rng)], "kinds": [ABSENT_KIND], "limit": LIMIT}
                    ],
                )
            )
    known_t = [x for c in ("common", "mid", "rare") for x in v.get(f"#t {c}") or []]
    known_t = list(dict.fromkeys(known_t))[:MAX_VALUES]
    if known_t:
        out.append(
            FloodShape(
                f"#t known in kind {ABSENT_KIND}",
                f"`#t` the {len(known_t)} common, mid and rare values, kinds"
                f" [{ABSENT_KIND}] (none), limit {LIMIT}",
                lambda rng: [{"#t": list(known_t), "kinds": [ABSENT_KIND], "limit": LIMIT}],
            )
        )
    return out


def _common_word_shapes(common_word: Draw) -> list[FloodShape]:
    span = BASE_TIME + 3600  # the corpus's first hour
    return [
        FloodShape(
            f"search common in kind {ABSENT_KIND}",
            f"search a top-5 word in kind {ABSENT_KIND} (none), limit {LIMIT}",
            lambda rng: [{"search": common_word(rng), "kinds": [ABSENT_KIND], "limit": LIMIT}],
        ),
        FloodShape(
            "search common in first hour",
            f"search a top-5 word until the corpus's first hour, limit {LIMIT}",
            lambda rng: [{"search": common_word(rng), "until": span, "limit": LIMIT}],
        ),
        FloodShape(
            "search common + absent",
            f"search a top-5 word AND a word no event has, limit {LIMIT}",
            lambda rng: [
                {"search": f"{common_word(rng)} {_absent('search')(rng)}", "limit": LIMIT}
            ],
        ),
    ]
