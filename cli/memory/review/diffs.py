"""Differences between two values, as lines a page can colour (no HTML here).

Bounded in work and in size, since the values are the agent's to choose: the lines both
values share at their start and end are set aside before any matching, a middle longer
than `MATCH_LINES` lines is shown as replaced rather than matched line by line (difflib
can take seconds on 50 KB of short, repetitive lines), and the lines given back stop at a
budget of characters, with one last line saying how many more there are.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

MATCH_LINES = 600  # lines per side matched line by line; past it, a block replaced
HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "add" | "del" | "same" | "hunk" | "note" | "more"
    text: str


def normalize_newlines(text: str) -> str:
    """CRLF and lone CR become LF: a browser sends CRLF for every line break of a form."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def diff_lines(old: str, new: str, context: int = 3, budget: int | None = None) -> list[DiffLine]:
    """A unified diff of `old` -> `new` by lines; empty when they are equal.

    A changed last line without a newline is followed by a note, as `diff` prints one, so
    that a change of the final newline alone is visible. `budget`: at most about this
    many characters of lines (a line longer than a quarter of it is cut), then a `more`
    line counting the lines left out."""
    if old == new:
        return []
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    lo = max(0, head - context)
    a_mid, b_mid = a[lo : len(a) - max(0, tail - context)], b[lo : len(b) - max(0, tail - context)]
    out = _Budgeted(budget)
    if len(a_mid) > MATCH_LINES or len(b_mid) > MATCH_LINES:
        _replaced(out, a, b, lo, head, tail, context)
        return out.lines
    for line in difflib.unified_diff(a_mid, b_mid, n=context, lineterm=""):
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            out.add("hunk", _shifted(line.strip(), lo))
            continue
        kind = {"+": "add", "-": "del"}.get(line[:1], "same")
        _body(out, kind, line[1:])
    return out.lines


def _body(out: _Budgeted, kind: str, body: str) -> None:
    out.add(kind, body.removesuffix("\n"))
    if not body.endswith("\n") and kind != "same":  # a context line needs no note
        out.add("note", "\\ No newline at end of value")


def _shifted(hunk: str, by: int) -> str:
    """A hunk header of a window that starts `by` lines into the values."""
    m = HUNK.fullmatch(hunk)
    if m is None or not by:
        return hunk
    a, a_len, b, b_len = m.groups()
    a_len = f",{a_len}" if a_len is not None else ""
    b_len = f",{b_len}" if b_len is not None else ""
    return f"@@ -{int(a) + by}{a_len} +{int(b) + by}{b_len} @@"


def _replaced(
    out: _Budgeted, a: list[str], b: list[str], lo: int, head: int, tail: int, context: int
) -> None:
    """One hunk: the shared context, every old line of the middle removed, every new one
    added (no line-by-line matching: the middle is too long for it)."""
    a_end, b_end = len(a) - tail, len(b) - tail
    after = min(tail, context)
    a_len, b_len = a_end + after - lo, b_end + after - lo
    out.add("hunk", f"@@ -{lo + 1},{a_len} +{lo + 1},{b_len} @@")
    for line in a[lo:head]:
        _body(out, "same", line)
    for line in a[head:a_end]:
        _body(out, "del", line)
    for line in b[head:b_end]:
        _body(out, "add", line)
    for line in a[a_end : a_end + after]:
        _body(out, "same", line)


class _Budgeted:
    """Lines kept up to a budget of characters; past it only counted, then one `more`."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.line_cap = max(200, budget // 4) if budget is not None else None
        self.kept: list[DiffLine] = []
        self.used = 0
        self.dropped = 0

    def add(self, kind: str, text: str) -> None:
        if self.line_cap is not None and len(text) > self.line_cap:  # one long line
            cut = len(text) - self.line_cap
            text = f"{text[: self.line_cap]} … ({cut:,} more characters not shown)"
        if self.budget is not None and (self.dropped or self.used + len(text) > self.budget):
            self.dropped += kind in ("add", "del", "same")
            return
        self.kept.append(DiffLine(kind, text))
        self.used += len(text) + 1

    @property
    def lines(self) -> list[DiffLine]:
        if not self.dropped:
            return self.kept
        more = f"… {self.dropped:,} more line{'s' if self.dropped != 1 else ''} not shown here"
        return [*self.kept, DiffLine("more", more)]
