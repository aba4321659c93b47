"""Relative dates in a memory, resolved when it is indexed: "I signed up yesterday" written
on 21 May 2023 is indexed with "20 May 2023" too, so "what did she do on 20 May 2023?"
finds it (and "in May 2023", and "last Saturday" as the Saturday it was).

The anchor is the memory's own day: the ISO date its slug names, when it names one (an
agent keeping a conversation files each session under its date:
`mem/chat/2023-05-21/014`), else its created_at (UTC). Only what the memory says is
resolved, and only expressions whose meaning does not depend on anything but that day;
the words added are the date as `normalise` writes dates ("20 May 2023"), the month
("May 2023") for a week or a month, and the weekday for a day.
"""

from __future__ import annotations

import datetime as dt
import re

from cli.memory.recall.text import MONTHS

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS = {
    "a": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "a couple of": 2,
}
_ISO_IN_SLUG = re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})(?!\d)")
_DAY = r"monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_COUNT = r"a couple of|a|one|two|three|four|five|six|\d{1,2}"
_EXPRESSION = re.compile(
    rf"\b(?:(?P<today>today|this morning|this afternoon|this evening|tonight)"
    rf"|(?P<yesterday>yesterday|last night)"
    rf"|(?P<tomorrow>tomorrow)"
    rf"|(?P<ago>{_COUNT}) (?P<unit>days?|weeks?|months?|years?) ago"
    rf"|(?P<rel>last|next|this) (?P<what>week|weekend|month|year|{_DAY})"
    rf"|on (?P<on>{_DAY}))\b"
)  # matched against the lower-cased text (IGNORECASE made each search twice as slow)
# every expression holds one of these: a text without any is not searched at all (most
# memories; the search was a tenth of a first build's indexing)
_CLUES = (
    "tomorrow", "night", "ago", "morning", "afternoon", "evening", "day", "week", "month", "year",
)  # fmt: skip


def anchor(slug: str, created_at: int) -> dt.date:
    """The day a memory was written: its slug's ISO date, else its created_at's."""
    m = _ISO_IN_SLUG.search(slug)
    if m:
        try:
            return dt.date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            pass
    return dt.datetime.fromtimestamp(max(created_at, 0), dt.UTC).date()


def _day(d: dt.date) -> str:
    return f"{d.day} {MONTHS[d.month - 1]} {d.year} {WEEKDAYS[d.weekday()]}"


def _month(d: dt.date) -> str:
    return f"{MONTHS[d.month - 1]} {d.year}"


def _add_months(d: dt.date, n: int) -> dt.date:
    month = d.month - 1 + n
    return dt.date(d.year + month // 12, month % 12 + 1, 1)


def _count(text: str) -> int:
    text = text.lower()
    return int(text) if text.isdigit() else _NUMBERS.get(text, 1)


def _resolve(m: re.Match[str], day: dt.date) -> str | None:
    if m["today"]:
        return _day(day)
    if m["yesterday"]:
        return _day(day - dt.timedelta(days=1))
    if m["tomorrow"]:
        return _day(day + dt.timedelta(days=1))
    if m["ago"]:
        n, unit = _count(m["ago"]), m["unit"].lower().rstrip("s")
        if unit == "day":
            return _day(day - dt.timedelta(days=n))
        if unit == "week":
            start = day - dt.timedelta(days=7 * n)
            return f"week of {_day(start)} {_month(start)}"
        if unit == "month":
            return _month(_add_months(day, -n))
        return str(day.year - n)
    if m["on"]:  # "on Tuesday" in a memory: the last one before (or the day itself)
        back = (day.weekday() - WEEKDAYS.index(m["on"].lower())) % 7
        return _day(day - dt.timedelta(days=back))
    rel, what = m["rel"].lower(), m["what"].lower()
    step = {"last": -1, "next": 1, "this": 0}[rel]
    if what in WEEKDAYS:
        target = WEEKDAYS.index(what)
        if step < 0:
            back = (day.weekday() - target) % 7 or 7
            return _day(day - dt.timedelta(days=back))
        ahead = (target - day.weekday()) % 7 or (7 if step > 0 else 0)
        return _day(day + dt.timedelta(days=ahead))
    if what == "week":
        start = day + dt.timedelta(days=7 * step)
        return f"week of {_day(start)} {_month(start)}"
    if what == "weekend":
        if step < 0:
            saturday = day - dt.timedelta(days=(day.weekday() - 5) % 7 or 7)
        else:
            saturday = day + dt.timedelta(days=(5 - day.weekday()) % 7 or 7 * step)
        return f"weekend of {_day(saturday)}"
    if what == "month":
        return _month(_add_months(day, step))
    return str(day.year + step)


def resolved(slug: str, value: str, created_at: int) -> str:
    """The dates `value`'s relative expressions stand for, as words ("" if none)."""
    text = value.lower()
    if not any(c in text for c in _CLUES) or not _EXPRESSION.search(text):
        return ""
    day = anchor(slug, created_at)
    out = [r for m in _EXPRESSION.finditer(text) if (r := _resolve(m, day))]
    return " ".join(out)
