"""TIME arguments of the CLI: unix seconds, or ISO 8601 (UTC where no zone is given).

One parser for every command that takes a time (`engram export --since`, `engram mem get
--as-of`, `--valid-from`, ...), so they all accept the same forms."""

from __future__ import annotations

import re
from datetime import UTC, datetime


def parse_time(text: str) -> int:
    """Unix seconds, or an ISO 8601 date/time (no zone = UTC); ValueError otherwise."""
    t = text.strip()
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    dt = datetime.fromisoformat(t)  # 2024-05-01, 2024-05-01T12:00, ...Z, ...+02:00
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp())


def format_time(t: int) -> str:
    """Unix seconds as ISO 8601 UTC (`2024-05-01T12:00:00Z`), for people reading output."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
