"""Differences between two values, as lines a page can colour (no HTML here)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "add" | "del" | "same" | "hunk" | "note"
    text: str


def normalize_newlines(text: str) -> str:
    """CRLF and lone CR become LF: a browser sends CRLF for every line break of a form."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def diff_lines(old: str, new: str, context: int = 3) -> list[DiffLine]:
    """A unified diff of `old` -> `new` by lines; empty when they are equal.

    A changed last line without a newline is followed by a note, as `diff` prints one, so
    that a change of the final newline alone is visible."""
    if old == new:
        return []
    out: list[DiffLine] = []
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), n=context, lineterm=""
    )
    for line in lines:
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            out.append(DiffLine("hunk", line.strip()))
            continue
        kind = {"+": "add", "-": "del"}.get(line[:1], "same")
        body = line[1:]
        out.append(DiffLine(kind, body.removesuffix("\n")))
        if not body.endswith("\n") and kind != "same":  # a context line needs no note
            out.append(DiffLine("note", "\\ No newline at end of value"))
    return out
