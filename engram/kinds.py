"""Kind classes (NIP-01): what a relay keeps of an event depends on its kind alone.

- regular: every event is kept (1, 2, 4-44, 1000-9999, and anything not below);
- replaceable (0, 3, 10000-19999): only the latest per (pubkey, kind);
- ephemeral (20000-29999): passed on to subscribers, never stored;
- addressable (30000-39999): only the latest per (pubkey, kind, `d` tag value).

The relay (validation, storage, metrics), the CLI and the bench all ask here; nobody
restates a range. Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

KIND_MAX = 65_535  # kinds are 0..65535 (NIP-01)
KIND_DELETION = 5  # NIP-09 deletion request

KindClass = Literal["regular", "replaceable", "ephemeral", "addressable"]


def is_replaceable(kind: int) -> bool:
    return kind in (0, 3) or 10000 <= kind < 20000


def is_ephemeral(kind: int) -> bool:
    return 20000 <= kind < 30000


def is_addressable(kind: int) -> bool:
    return 30000 <= kind < 40000


def is_regular(kind: int) -> bool:
    """Neither replaceable, ephemeral nor addressable: every event of it is kept."""
    return not (is_replaceable(kind) or 20000 <= kind < 40000)


def kind_class(kind: int) -> KindClass:
    if is_replaceable(kind):
        return "replaceable"
    if is_ephemeral(kind):
        return "ephemeral"
    if is_addressable(kind):
        return "addressable"
    return "regular"
