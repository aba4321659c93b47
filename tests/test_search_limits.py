"""Issue 46 item 7: the bounds a search pattern is checked against before it is compiled
(`cli.memory.search`): length, nesting, and the size its counted repeats come to once
written out. The processes that serve searches are tested in test_mcp.py and
test_cli_mem.py; here, the rule itself, at and past each bound."""

from __future__ import annotations

from re import _parser as re_parser

import pytest

from cli.memory.search import (
    DEPTH_MAX,
    EXPANDED_MAX,
    QUERY_MAX,
    compile_query,
    compiled,
    expanded,
)
from cli.nostr.errors import BadInputError


def size(pattern: str) -> int:
    return expanded(re_parser.parse(pattern))


def test_counted_repeats_multiply_and_everything_else_adds() -> None:
    assert size("abc") == 3
    assert size("x{100}") == 100
    assert size("(?:x{100}){100}") == EXPANDED_MAX  # exactly the bound: allowed
    assert size("(?:ab|c{10}){3}") == 3 * (1 + 2 + 10)  # a branch holds both alternatives
    assert size("x*") == size("x+") == size("x?") == 1
    assert size("x{7,}") == 7  # unbounded: its minimum
    assert size("(?=y)(?!z)(?>w)") == 3 * 2


@pytest.mark.parametrize(
    ("pattern", "limit"),
    [
        ("((a{200}){200}){100}", f"{EXPANDED_MAX:,} elements"),
        ("(?:x{65535}){1000}", f"{EXPANDED_MAX:,} elements"),
        ("(?:x{1000,}){1000}", f"{EXPANDED_MAX:,} elements"),
        ("x{10001}", f"{EXPANDED_MAX:,} elements"),
        ("(?:ab|(?:c{100}){101})", f"{EXPANDED_MAX:,} elements"),
        ("(?=" + "x{101}" * 100 + ")", f"{EXPANDED_MAX:,} elements"),  # in an assertion
        ("(" * (DEPTH_MAX + 1) + "x" + ")" * (DEPTH_MAX + 1), f"{DEPTH_MAX} deep"),
        ("(" * 450 + "x" + ")" * 450, f"{DEPTH_MAX} deep"),
        ("x" * (QUERY_MAX + 1), f"at most {QUERY_MAX:,}"),
        ("(", "invalid regular expression"),
    ],
)
def test_past_a_bound_is_bad_input_naming_it(pattern: str, limit: str) -> None:
    with pytest.raises(BadInputError) as refused:
        compile_query(pattern, True)
    assert limit in str(refused.value)


def test_within_the_bounds_compiles_and_matches() -> None:
    nested = "(" * DEPTH_MAX + "x" + ")" * DEPTH_MAX
    for pattern in ("x{10000}", "(?:x{100}){100}", nested, "x" * QUERY_MAX, "(a|aa)+$"):
        assert compile_query(pattern, True).search("x" * 10_000 + " aa") is not None, pattern
    # a literal query is text, whatever it looks like, and bounded by length alone
    assert compile_query("((a{200}){200}){100}", False).search("((A{200}){200}){100}")
    with pytest.raises(BadInputError, match="at most"):
        compile_query("a" * (QUERY_MAX + 1), False)


async def test_compiled_runs_off_the_loop_and_refuses_the_same() -> None:
    pattern = await compiled("zan.*bar", True)
    assert pattern.search("Zanzibar") is not None
    with pytest.raises(BadInputError, match="elements"):
        await compiled("((a{200}){200}){100}", True)
