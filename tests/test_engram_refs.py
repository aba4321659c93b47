"""References (spec: *References*): extract_refs edge cases and reachability."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram import Reachability, extract_refs, is_valid_slug, reachability

LONG_OK = "mem/" + "a" * 64
OVERSIZE = "mem/" + "/".join(c * 64 for c in "abcd")  # 263 bytes


@pytest.mark.parametrize(
    ("text", "refs"),
    [
        ("", []),
        ("plain prose", []),
        ("mem/example without brackets", []),
        ("[mem/x] single brackets", []),
        ("see [[mem/example]] for context", ["mem/example"]),
        ("rooted at [[core]]", ["core"]),
        ("[[mem/a]] then [[mem/b]] then [[mem/c]]", ["mem/a", "mem/b", "mem/c"]),
        ("[[mem/b]] [[mem/a]] [[mem/b]] [[mem/c]] [[mem/a]]", ["mem/b", "mem/a", "mem/c"]),
        ("[[mem/notes/2026-05-12]]", ["mem/notes/2026-05-12"]),
        ("[[]] and [[ ]]", []),
        ("[[Mem/Example]] [[mem/with space]] [[mem/-x]] [[example]] [[mem/]]", []),
        ("[[mem/x.y]] [[mem/x/]]", []),
        # unclosed
        ("[[mem/x with no closing", []),
        ("[[mem/x", []),
        ("[[mem/x]", []),
        ("[[mem/x with no close, but [[mem/y]] is fine", ["mem/y"]),
        ("[[oops [[mem/x]]", ["mem/x"]),
        # triple and quadruple brackets
        ("[[[mem/x]]]", []),  # the candidate is "[mem/x"
        ("[[mem/x]]]", ["mem/x"]),
        ("[[[[mem/x]]", ["mem/x"]),
        ("]][[mem/x]][[", ["mem/x"]),
        # UTF-8 either side
        ("héllo [[mem/example]] wörld 🎉", ["mem/example"]),
        ("😀[[mem/a]]😀[[mem/b]]日本", ["mem/a", "mem/b"]),
        ("[[mem/é]] [[mem/ok]]", ["mem/ok"]),
        # length limits
        (f"[[{LONG_OK}]]", [LONG_OK]),
        (f"[[{OVERSIZE}]] [[mem/ok]]", ["mem/ok"]),
        (f"[[mem/{'a' * 65}]]", []),
        # self reference is just a reference
        ("I refer to [[mem/me]] from inside mem/me", ["mem/me"]),
        # newline inside brackets is not a slug
        ("[[mem/a\n]] [[mem/b]]", ["mem/b"]),
    ],
)
def test_extract_refs(text: str, refs: list[str]) -> None:
    assert extract_refs(text) == refs


def test_oversize_candidate_really_is_oversize() -> None:
    assert len(OVERSIZE) > 255 and not is_valid_slug(OVERSIZE)


@given(st.text(alphabet=st.sampled_from("[]ab/mecor-é "), max_size=60))
def test_extract_refs_returns_valid_unique_bracketed_slugs(text: str) -> None:
    refs = extract_refs(text)
    assert len(refs) == len(set(refs))
    for ref in refs:
        assert is_valid_slug(ref)
        assert f"[[{ref}]]" in text


def test_reachability_basic() -> None:
    values = {
        "mem/a": "links to [[mem/b]] and [[mem/missing]]",
        "mem/b": "back to [[core]] and [[mem/a]]",
        "mem/dead": None,  # tombstone
        "mem/orphan": "points at [[mem/dead]] and [[mem/a]]",
        "mem/lonely": "nothing",
    }
    result = reachability("root: [[mem/a]] [[mem/dead]]", values)
    assert isinstance(result, Reachability)
    reachable, orphans, dangling = result
    assert reachable == ["mem/a", "mem/b"]
    assert orphans == ["mem/lonely", "mem/orphan"]
    assert dangling == [
        ("core", "mem/dead"),
        ("mem/a", "mem/missing"),
        ("mem/orphan", "mem/dead"),
    ]


def test_reachability_is_transitive_and_handles_cycles() -> None:
    values = {"mem/a": "[[mem/b]]", "mem/b": "[[mem/c]]", "mem/c": "[[mem/a]] [[mem/c]]"}
    assert reachability("[[mem/a]]", values) == (["mem/a", "mem/b", "mem/c"], [], [])


def test_reachability_without_core() -> None:
    values = {"mem/a": "[[core]] [[mem/b]]", "mem/b": "x"}
    assert reachability(None, values) == ([], ["mem/a", "mem/b"], [("mem/a", "core")])


def test_reachability_ignores_core_key_and_empty_store() -> None:
    assert reachability("[[mem/x]]", {"core": "ignored"}) == ([], [], [("core", "mem/x")])
    assert reachability("", {}) == ([], [], [])
