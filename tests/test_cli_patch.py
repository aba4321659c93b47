"""cli/memory/patch.py: strict unified-diff application (no fuzz, no offset, `\\n` only)."""

from __future__ import annotations

import difflib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.memory.patch import PatchError, apply_patch, split_lines


def udiff(old: str, new: str, n: int = 3) -> str:
    """A unified diff as difflib writes it, with `\\ No newline` markers added the way
    diff(1) does (difflib leaves them out)."""
    out: list[str] = []
    for line in difflib.unified_diff(split_lines(old), split_lines(new), "a", "b", n=n):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def test_applies_at_the_declared_line() -> None:
    old = "".join(f"line {i}\n" for i in range(1, 21))
    new = old.replace("line 3\n", "line three\n").replace("line 17\n", "line seventeen\n")
    patch = udiff(old, new)
    assert patch.count("@@ -") == 2
    assert apply_patch(old, patch) == new


def test_missing_final_newline_both_ways() -> None:
    assert apply_patch("a\nb", udiff("a\nb", "a\nb\n")) == "a\nb\n"
    assert apply_patch("a\nb\n", udiff("a\nb\n", "a\nb")) == "a\nb"
    assert apply_patch("a\nb", udiff("a\nb", "a\nc")) == "a\nc"


def test_lines_split_on_newline_only() -> None:
    old = "keep\r\nold\r\nline\u2028sep\n"
    new = "keep\r\nnew\r\nline\u2028sep\n"
    assert apply_patch(old, udiff(old, new)) == new
    # a CR-stripped diff does not match a CRLF value
    with pytest.raises(PatchError):
        apply_patch(old, udiff(old.replace("\r", ""), new.replace("\r", "")))


def test_hunk_at_wrong_line_is_refused_even_if_the_text_is_elsewhere() -> None:
    value = "x\na\nb\nc\nz\n"
    good = "@@ -2,3 +2,3 @@\n a\n-b\n+B\n c\n"
    assert apply_patch(value, good) == "x\na\nB\nc\nz\n"
    for start in (1, 3):
        with pytest.raises(PatchError, match="does not match"):
            apply_patch(value, good.replace("-2,3 +2,3", f"-{start},3 +{start},3"))


def test_stale_content_is_refused() -> None:
    with pytest.raises(PatchError, match="does not match"):
        apply_patch("a\nB\nc\n", "@@ -1,3 +1,3 @@\n a\n-b\n+x\n c\n")


def test_more_than_one_file_is_refused() -> None:
    one = "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n k\n-a\n+b\n"
    assert apply_patch("k\na\n", one) == "k\nb\n"
    with pytest.raises(PatchError, match="one file"):
        apply_patch("k\na\n", one + "--- a/y\n+++ b/y\n@@ -1,2 +1,2 @@\n k\n-a\n+b\n")
    git_two = "diff --git a/x b/x\nindex 1..2\n" + one + "diff --git a/y b/y\n"
    with pytest.raises(PatchError, match="one file"):
        apply_patch("k\na\n", git_two)
    assert apply_patch("k\na\n", "diff --git a/x b/x\nindex 1..2 100644\n" + one) == "k\nb\n"


def test_hunk_without_context_only_against_an_empty_value() -> None:
    assert apply_patch("", "@@ -0,0 +1,2 @@\n+a\n+b\n") == "a\nb\n"
    with pytest.raises(PatchError, match="without context"):
        apply_patch("old\n", "@@ -1 +1 @@\n-old\n+new\n")
    with pytest.raises(PatchError, match="without context"):
        apply_patch("x\n", "@@ -1,0 +2 @@\n+y\n")


def test_patch_that_changes_nothing_is_refused() -> None:
    with pytest.raises(PatchError, match="changes nothing"):
        apply_patch("a\nb\n", "@@ -1,2 +1,2 @@\n a\n-b\n+b\n")


@pytest.mark.parametrize(
    "patch",
    [
        "",
        "--- a\n+++ b\n",
        "just text\n",
        "@@ -1,2 +1,2 @@\n a\n",  # fewer lines than declared
        "@@ -1 +1 @@\n a\n-b\n+c\n",  # more lines than declared
        "@@ -x +1 @@\n",
        "@@ -1,2 +1,2 @@\n a\n-b\n+c\ngarbage\n",
        "@@ -2,2 +2,2 @@\n b\n-c\n+C\n@@ -1,2 +1,2 @@\n a\n-b\n+B\n",  # out of order
        "--- a\n@@ -1 +1 @@\n a\n",  # header without +++
    ],
)
def test_malformed_patches_are_refused(patch: str) -> None:
    with pytest.raises(PatchError):
        apply_patch("a\nb\nc\n", patch)


def test_blank_context_line_from_an_editor_that_strips_spaces() -> None:
    assert apply_patch("a\n\nb\n", "@@ -1,3 +1,3 @@\n a\n\n-b\n+B\n") == "a\n\nB\n"


lines = st.lists(st.text(alphabet="ab\r é", max_size=4), max_size=12)


@given(lines, lines, st.booleans(), st.booleans(), st.integers(1, 3))
def test_any_difflib_patch_round_trips(
    old_lines: list[str], new_lines: list[str], old_nl: bool, new_nl: bool, ctx: int
) -> None:
    old = "\n".join(old_lines) + ("\n" if old_nl and old_lines else "")
    new = "\n".join(new_lines) + ("\n" if new_nl and new_lines else "")
    patch = udiff(old, new, n=ctx)
    if old == new:
        return
    try:
        result = apply_patch(old, patch)
    except PatchError as exc:
        # the only refusal for a correct diff: a context-less hunk on a non-empty value
        assert "without context" in str(exc) and old
        return
    assert result == new
