"""Kind classes at every NIP-01 boundary, and each kind in exactly one class."""

from __future__ import annotations

import pytest

from engram.kinds import (
    KIND_MAX,
    is_addressable,
    is_ephemeral,
    is_regular,
    is_replaceable,
    kind_class,
)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (0, "replaceable"),
        (1, "regular"),
        (2, "regular"),
        (3, "replaceable"),
        (4, "regular"),
        (9999, "regular"),
        (10000, "replaceable"),
        (19999, "replaceable"),
        (20000, "ephemeral"),
        (29999, "ephemeral"),
        (30000, "addressable"),
        (30174, "addressable"),
        (39999, "addressable"),
        (40000, "regular"),
        (KIND_MAX, "regular"),
    ],
)
def test_kind_class_at_the_boundaries(kind: int, expected: str) -> None:
    assert kind_class(kind) == expected


def test_every_kind_is_in_exactly_one_class() -> None:
    for kind in range(KIND_MAX + 1):
        flags = (is_regular(kind), is_replaceable(kind), is_ephemeral(kind), is_addressable(kind))
        assert sum(flags) == 1, kind
