"""Durations written by people (`90s`, `15m`, `12h`, `30d`, `4w`), for settings and the CLI.

A leaf module: `relay.config` validates `[retention]` with it and `relay.retention` runs
with it, so neither has to import the other.
"""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*(\d+)\s*([smhdw])\s*", re.IGNORECASE)


def parse_duration(text: str) -> int:
    """Seconds in a duration like `90s`, `15m`, `12h`, `30d`, `4w`; ValueError otherwise."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 12h, 30d or 4w)")
    seconds = int(m[1]) * _UNITS[m[2].lower()]
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return seconds
