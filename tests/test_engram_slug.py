"""Slug grammar (spec: *Slugs*), normalize_slug, and the blinded d tag (spec: *Addressing*)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram import (
    CORE_SLUG,
    SLUG_MAX_BYTES,
    InvalidSlugError,
    d_tag,
    is_valid_slug,
    normalize_slug,
    validate_slug,
)

K_C = bytes.fromhex("c41c775356fd92eadc63ff5a0dc1da211b268cbea22316767095b2871ea1412d")
SEG64 = "a" * 64


def slug_of_length(n: int) -> str:
    """A valid-looking slug of exactly n bytes made of 64-byte segments."""
    parts, size = [], len("mem")
    while size < n:
        take = min(64, n - size - 1)
        parts.append("b" * take)
        size += take + 1
    slug = "mem/" + "/".join(parts)
    assert len(slug) == n
    return slug


@pytest.mark.parametrize(
    "slug",
    [
        "core",
        "mem/x",
        "mem/0",
        "mem/x-y_z",
        "mem/notes/2026-05-12",
        "mem/a/b/c",
        "mem/9-_",
        f"mem/{SEG64}",
        f"mem/{SEG64}/{SEG64}/{SEG64}",
        slug_of_length(255),
    ],
)
def test_valid_slugs(slug: str) -> None:
    assert is_valid_slug(slug)
    assert validate_slug(slug) == slug


@pytest.mark.parametrize(
    ("slug", "why"),
    [
        ("", "empty"),
        ("mem", "no slash"),
        ("mem/", "empty first segment"),
        ("mem//x", "empty middle segment"),
        ("mem/x/", "empty last segment"),
        ("MEM/x", "upper-case prefix"),
        ("mem/X", "upper case"),
        ("mem/x/Y", "upper case later"),
        ("Core", "upper-case core"),
        ("core/x", "core is not a prefix"),
        (" core", "leading space"),
        ("mem/x.y", "dot"),
        ("mem/x y", "space"),
        ("mem/-x", "leading dash"),
        ("mem/_x", "leading underscore"),
        ("mem/x/-y", "leading dash later"),
        ("memx", "no slash"),
        ("mem/x\n", "trailing newline ($ trap)"),
        ("mem/é", "non-ASCII"),
        ("mem/ｘ", "full-width letter"),
        (f"mem/{SEG64}a", "65-byte segment"),
        (f"mem/x/{SEG64}b", "65-byte later segment"),
        (slug_of_length(256), "256 bytes"),
        ("mem/x/../y", "dots"),
    ],
)
def test_invalid_slugs(slug: str, why: str) -> None:
    assert not is_valid_slug(slug), why
    with pytest.raises(InvalidSlugError):
        validate_slug(slug)


def test_length_limit_is_exactly_255_bytes() -> None:
    assert SLUG_MAX_BYTES == 255
    assert is_valid_slug(slug_of_length(255))
    assert not is_valid_slug(slug_of_length(256))


def test_error_messages_say_why() -> None:
    with pytest.raises(InvalidSlugError, match="empty segment"):
        validate_slug("mem//x")
    with pytest.raises(InvalidSlugError, match="longer than 64"):
        validate_slug(f"mem/{SEG64}z")
    with pytest.raises(InvalidSlugError, match="bytes"):
        validate_slug(slug_of_length(256))
    with pytest.raises(InvalidSlugError, match="start with 'mem/'"):
        validate_slug("notes")


@pytest.mark.parametrize(
    ("raw", "slug"),
    [
        ("notes", "mem/notes"),
        ("notes/today", "mem/notes/today"),
        ("mem/notes", "mem/notes"),
        ("core", "core"),
        ("mem", "mem/mem"),  # "mem" is not the prefix "mem/": it becomes a segment
        ("memo", "mem/memo"),
    ],
)
def test_normalize_slug(raw: str, slug: str) -> None:
    assert normalize_slug(raw) == slug


@pytest.mark.parametrize("raw", ["mem/", "Notes", "a.b", "", "/x", "mem//x", "core/"])
def test_normalize_slug_validates_again(raw: str) -> None:
    with pytest.raises(InvalidSlugError):
        normalize_slug(raw)


def test_d_tag_vectors_and_shape() -> None:
    assert d_tag(K_C, CORE_SLUG) == (
        "bdc233238ffe52e272b44cc233c8f33a2bc510b08be04495b225964283be4a90"
    )
    d = d_tag(K_C, "mem/example")
    assert len(d) == 64 and d == d.lower()
    assert "example" not in d


def test_d_tag_refuses_invalid_slug() -> None:
    with pytest.raises(InvalidSlugError):
        d_tag(K_C, "mem/Example")


def test_d_tag_depends_on_key_and_slug() -> None:
    other = bytes(32)
    assert d_tag(K_C, "mem/a") != d_tag(other, "mem/a")
    assert d_tag(K_C, "mem/a") != d_tag(K_C, "mem/b")


SEGMENT = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,63}", fullmatch=True)


@given(st.lists(SEGMENT, min_size=1, max_size=6))
def test_grammar_property(segments: list[str]) -> None:
    slug = "mem/" + "/".join(segments)
    assert is_valid_slug(slug) == (len(slug) <= 255)
    assert not is_valid_slug(slug.upper())
