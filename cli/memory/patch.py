"""Strict unified-diff application for `engram mem patch`.

Pure text in, text out: no I/O. Strict on purpose: an agent patching its own memory
from a stale view must be stopped, not helped, so there is no fuzz, no offset search,
only one file per patch, and lines split on `\\n` alone (a `\\r` is part of the line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cli.nostr.errors import BadInputError

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = "\\"  # "\ No newline at end of file" (the text after the backslash varies)
# Lines git and diff(1) put before the first hunk of a file; anything else there is an error.
_PREAMBLE_PREFIXES = (
    "diff ",
    "index ",
    "--- ",
    "+++ ",
    "old mode ",
    "new mode ",
    "new file mode ",
    "deleted file mode ",
    "similarity index ",
    "rename from ",
    "rename to ",
    "Only in ",
)


class PatchError(BadInputError):
    """The patch is malformed or does not apply exactly; the message says which line."""


@dataclass
class Hunk:
    """One `@@` hunk; `old`/`new` are lines with their own `\\n` (absent on a last line)."""

    old_start: int
    old_count: int
    new_count: int
    header_line: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    has_context: bool = False


def split_lines(text: str) -> list[str]:
    """Lines that keep their `\\n`; the last one has none if the text does not end with one."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def parse_patch(patch: str) -> list[Hunk]:
    """Parse a single-file unified diff into hunks, checking every count it declares."""
    rows = patch.split("\n")
    if rows and rows[-1] == "":
        rows.pop()  # the newline that ends the last line of the patch
    hunks: list[Hunk] = []
    headers = {"diff ": 0, "--- ": 0}
    i = 0
    while i < len(rows):
        row = rows[i]
        if row.startswith("@@"):
            hunk, i = _parse_hunk(rows, i)
            if hunks and hunk.old_start < hunks[-1].old_start + hunks[-1].old_count:
                raise PatchError(f"line {hunk.header_line}: hunks overlap or are out of order")
            hunks.append(hunk)
            continue
        for prefix in headers:
            if row.startswith(prefix):
                headers[prefix] += 1
                if headers[prefix] > 1 or hunks:
                    raise PatchError("a patch may change only one file; this one has several")
        if row.startswith("--- ") and not (i + 1 < len(rows) and rows[i + 1].startswith("+++ ")):
            raise PatchError(f"line {i + 1}: '--- ' header without a '+++ ' line")
        if row.strip() == "" or (not hunks and row.startswith(_PREAMBLE_PREFIXES)):
            i += 1
            continue
        raise PatchError(f"line {i + 1}: unexpected text outside a hunk")
    if not hunks:
        raise PatchError("the patch contains no hunks")
    return hunks


def _parse_hunk(rows: list[str], i: int) -> tuple[Hunk, int]:
    """Read one hunk starting at `rows[i]`; returns it and the index of the next row."""
    m = _HUNK_HEADER.match(rows[i])
    if not m:
        raise PatchError(f"line {i + 1}: malformed hunk header")
    old_count = 1 if m.group(2) is None else int(m.group(2))
    new_count = 1 if m.group(4) is None else int(m.group(4))
    hunk = Hunk(int(m.group(1)), old_count, new_count, header_line=i + 1)
    i += 1
    old_left, new_left = old_count, new_count
    while i < len(rows) and (old_left or new_left):
        row = rows[i]
        tag, text = row[:1], row[1:] + "\n"
        if tag in (" ", "") and old_left and new_left:  # editors strip a blank context line's space
            hunk.old.append(text)
            hunk.new.append(text)
            hunk.has_context = True
            old_left, new_left = old_left - 1, new_left - 1
        elif tag == "-" and old_left:
            hunk.old.append(text)
            old_left -= 1
        elif tag == "+" and new_left:
            hunk.new.append(text)
            new_left -= 1
        elif tag == _NO_NEWLINE:
            _strip_last_newline(hunk, rows, i)
        else:
            raise PatchError(f"line {i + 1}: hunk body does not match its header's line counts")
        i += 1
    if old_left or new_left:
        raise PatchError(f"line {hunk.header_line}: hunk ends before its declared line counts")
    while i < len(rows) and rows[i].startswith(_NO_NEWLINE):
        _strip_last_newline(hunk, rows, i)
        i += 1
    return hunk, i


def _strip_last_newline(hunk: Hunk, rows: list[str], i: int) -> None:
    """Apply a `\\ No newline at end of file` marker to the line it follows."""
    prev = rows[i - 1][:1]
    sides = {" ": (hunk.old, hunk.new), "-": (hunk.old,), "+": (hunk.new,)}.get(prev)
    if not sides:
        raise PatchError(f"line {i + 1}: 'no newline' marker does not follow a hunk line")
    for side in sides:
        side[-1] = side[-1][:-1]


def apply_patch(value: str, patch: str) -> str:
    """Apply `patch` to `value` exactly; raise PatchError if any hunk does not fit.

    Every hunk must match at its declared line (no fuzz, no offset). A hunk without
    context lines is accepted only against an empty value (otherwise nothing anchors it
    but a line number). A patch whose result equals the value is refused.
    """
    hunks = parse_patch(patch)
    lines = split_lines(value)
    out: list[str] = []
    pos = 0
    for hunk in hunks:
        if not hunk.has_context and value:
            raise PatchError(
                f"line {hunk.header_line}: a hunk without context lines applies only to an "
                "empty value; regenerate the diff with context (diff -u) or use `mem set`"
            )
        start = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        if start < pos or start + hunk.old_count > len(lines):
            raise PatchError(f"line {hunk.header_line}: hunk lies outside the current value")
        if lines[start : start + hunk.old_count] != hunk.old:
            raise PatchError(
                f"line {hunk.header_line}: hunk does not match the current value at line "
                f"{hunk.old_start}"
            )
        pos_after = start + hunk.old_count
        if any(not line.endswith("\n") for line in hunk.new[:-1]) or (
            hunk.new and not hunk.new[-1].endswith("\n") and pos_after < len(lines)
        ):
            raise PatchError(f"line {hunk.header_line}: 'no newline' marker before the end")
        out.extend(lines[pos:start])
        out.extend(hunk.new)
        pos = pos_after
    out.extend(lines[pos:])
    result = "".join(out)
    if result == value:
        raise PatchError("the patch changes nothing")
    return result
