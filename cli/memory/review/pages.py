"""Pages of rows: every long view of the review app (the list, the changes, a memory's
history) shows a bounded page of its rows at a time, with links to the others."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
MAX_DIGITS = 6  # a page number from the URL


def number(raw: str | None) -> int:
    """A page number from the URL: a positive integer, else 1."""
    if raw is None or not raw.isdigit() or len(raw) > MAX_DIGITS:
        return 1
    return max(1, int(raw))


@dataclass(frozen=True)
class Paged(Generic[T]):
    """Page `page` (1-based) of `size` rows: the rows, where they start (0-based), how
    many there are in all and how many pages."""

    rows: list[T]
    start: int
    total: int
    page: int
    pages: int

    @classmethod
    def of(cls, rows: Sequence[T], page: int, size: int) -> Paged[T]:
        """Page `page` of `rows`, clamped to the pages there are."""
        pages = max(1, -(-len(rows) // size))
        page = min(max(page, 1), pages)
        start = (page - 1) * size
        return cls(list(rows[start : start + size]), start, len(rows), page, pages)
