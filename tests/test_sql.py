"""The store's SQL without a database: the tag index and row encoding (relay.store.tagindex,
sqlwrite) and the Filter -> SQL builders (relay.store.sqlread, sqlcount)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

import msgspec
import pytest

from engram.nip01 import Event
from relay.config import KIND_ENGRAM
from relay.filters import Filter
from relay.store import sqlcount, sqlread, sqlwrite, tagindex

PK = "ab" * 32


def placeholders(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"\$(\d+)", text)}


def test_index_value_short_values_verbatim() -> None:
    assert tagindex.index_value("") == ""
    assert tagindex.index_value("x" * 200) == "x" * 200
    assert tagindex.index_value("😀" * 50) == "😀" * 50  # exactly 200 UTF-8 bytes


@pytest.mark.parametrize("value", ["x" * 201, "😀" * 51, "a\x00b", "\x01short"])
def test_index_value_hashes_long_nul_and_marker(value: str) -> None:
    hashed = tagindex.index_value(value)
    assert hashed == "\x01" + hashlib.sha256(value.encode()).hexdigest()
    assert hashed != value and "\x00" not in hashed


def test_tag_key_and_event_tagvals() -> None:
    tags = [["e", "x"], ["e", "x"], ["ee", "y"], ["p"], ["t", "z" * 300], ["é", "v"]]
    assert tagindex.event_tagvals(tags) == ["e:x", tagindex.tag_key("t", "z" * 300), "é:v"]
    assert tagindex.event_tagvals([]) == []


@pytest.mark.parametrize(
    ("kind", "tags", "d"),
    [
        (1, [["d", "x"]], None),
        (40000, [["d", "x"]], None),
        (0, [["d", "x"]], ""),
        (3, [], ""),
        (10002, [], ""),
        (30000, [], ""),
        (30000, [["d"]], ""),
        (30000, [["t", "a"], ["d", "b"], ["d", "c"]], "b"),
        (39999, [["d", "x" * 300]], tagindex.index_value("x" * 300)),
    ],
)
def test_address_d(kind: int, tags: list[list[str]], d: str | None) -> None:
    assert tagindex.address_d(kind, tags) == d


def test_owner_column_is_the_recipient_of_any_kind(make_event: Callable[..., Event]) -> None:
    """The first `p` tag (engram.readers.recipient), kept for every kind: the private
    read gate compares it to the viewer for engrams and the tenant's private kinds."""
    assert sqlwrite.owner_column([["d", "h"], ["p", PK], ["p", "cd" * 32]]) == bytes.fromhex(PK)
    assert sqlwrite.owner_column([["p", "not hex"], ["p", PK]]) is None  # the first p decides
    assert sqlwrite.owner_column([["p"], ["p", PK]]) == bytes.fromhex(PK)  # valueless: no p
    assert sqlwrite.owner_column([]) is None
    row = sqlwrite.encode_row(make_event(bytes([7]) * 32, kind=4, tags=[["p", PK]]), b"{}")
    assert row[5] == bytes.fromhex(PK)


def test_pg_text_array_escapes() -> None:
    assert sqlwrite.pg_text_array([]) == "{}"
    assert sqlwrite.pg_text_array(["a", 'q"', "b\\s", "NULL"]) == '{"a","q\\"","b\\\\s","NULL"}'


def test_values_are_parameters_never_sql() -> None:
    evil = "'); DROP TABLE events; --"
    f = Filter(
        ids=["0" * 64], authors=[PK], kinds=[1], tags={"e": [evil]}, since=1, until=2, limit=3
    )
    text, params = sqlread.build_query([f], "tenant'", viewer=PK)  # type: ignore[misc]
    assert evil not in text and "tenant'" not in text
    assert params[0] == "tenant'" and "e:" + evil in params[4]
    assert placeholders(text) == set(range(1, len(params) + 1))


@pytest.mark.parametrize(
    "f",
    [
        Filter(ids=[], limit=5),
        Filter(authors=[], limit=5),
        Filter(kinds=[], limit=5),
        Filter(tags={"e": []}, limit=5),
        Filter(ids=["XYZ"], limit=5),
        Filter(kinds=[2**40], limit=5),
        Filter(since=5, until=4, limit=5),
        Filter(limit=0),
    ],
)
def test_filters_matching_nothing(f: Filter) -> None:
    assert sqlread.build_query([f], "t") is None


def test_skipped_filter_leaves_no_stray_parameter() -> None:
    filters = [Filter(kinds=[1], since=9, until=3, limit=5), Filter(kinds=[7], limit=2)]
    text, params = sqlread.build_query(filters, "t", viewer=PK)  # type: ignore[misc]
    assert "UNION" not in text
    assert placeholders(text) == set(range(1, len(params) + 1))
    assert params == ["t", 7, 2]  # kind 7 only: no engram gate, so no viewer parameter


def test_engram_gate_clause() -> None:
    engrams = frozenset({KIND_ENGRAM})
    text, params = sqlread.build_query([Filter(limit=1)], "t", private=engrams)  # type: ignore[misc]
    assert f"kind <> {KIND_ENGRAM}" in text and len(params) == 2
    text, params = sqlread.build_query([Filter(limit=1)], "t", viewer=PK)  # type: ignore[misc]
    assert "owner = $2::bytea" in text and params[1] == bytes.fromhex(PK)
    text, params = sqlread.build_query([Filter(limit=1)], "t", viewer="junk")  # type: ignore[misc]
    # the default private kinds: DMs, gift wraps, agent memory and its history (4174, 4175)
    assert f"kind NOT IN (4, 1059, 1060, 4174, 4175, {KIND_ENGRAM})" in text
    assert "owner" not in text


def test_private_gate_clause_names_only_the_filters_private_kinds() -> None:
    """The tenant's private kinds, narrowed to the filter's, as literal integers: every
    parameter stays a scalar (readbatch batches the statement)."""
    private = frozenset({4, 1059, KIND_ENGRAM})
    text, params = sqlread.build_query(  # type: ignore[misc]
        [Filter(kinds=[1, 4], limit=1)], "t", viewer=PK, private=private
    )
    assert "(kind <> 4 OR pubkey = $3::bytea OR owner = $3::bytea)" in text
    text, params = sqlread.build_query([Filter(limit=1)], "t", viewer=PK, private=private)  # type: ignore[misc]
    assert f"(kind NOT IN (4, 1059, {KIND_ENGRAM}) OR pubkey = $2::bytea" in text
    assert all(not isinstance(v, list) for v in params)
    text, _ = sqlread.build_query([Filter(kinds=[1, 7], limit=1)], "t", private=private)  # type: ignore[misc]
    assert "NOT IN" not in text and "kind <>" not in text  # no private kind asked for
    text, _ = sqlcount.build_count([Filter(ids=["0" * 64])], "t", private=private)  # type: ignore[misc]
    assert f"kind NOT IN (4, 1059, {KIND_ENGRAM})" in text
    text, _ = sqlcount.build_items(Filter(), "t", None, 0, 10, private)  # type: ignore[misc]
    assert f"kind NOT IN (4, 1059, {KIND_ENGRAM})" in text


def test_union_and_count() -> None:
    filters = [Filter(kinds=[1], limit=5), Filter(authors=[PK], limit=7)]
    text, params = sqlread.build_query(filters, "t", viewer=PK)  # type: ignore[misc]
    assert text.count("UNION ALL") == 1 and text.count("LIMIT") == 2
    assert placeholders(text) == set(range(1, len(params) + 1))
    text, params = sqlcount.build_count(filters, "t", viewer=PK)  # type: ignore[misc]
    assert text.startswith("SELECT count(*)") and "LIMIT" not in text
    assert placeholders(text) == set(range(1, len(params) + 1))
    assert sqlcount.build_count([Filter(kinds=[])], "t") is None


def test_tag_names_must_be_single_characters() -> None:
    with pytest.raises(ValueError):
        sqlread.build_query([Filter(tags={"ee": ["x"]}, limit=1)], "t")


def test_encode_row(make_event: Callable[..., Event]) -> None:
    sk = bytes([9]) * 32
    ev = make_event(sk, kind=KIND_ENGRAM, tags=[["d", "h"], ["p", PK]], content="a\x00b")
    row = sqlwrite.encode_row(ev, b"{raw}")
    assert row[0] == bytes.fromhex(ev.id) and row[4] == "h" and row[5] == bytes.fromhex(PK)
    # engram content is ciphertext, never searched: no copy for the full-text index
    assert row[6] == '{"d:h","p:' + PK + '"}' and row[7] == "" and row[8] == b"{raw}"
    note = make_event(sk, kind=1, content="a\x00b")
    assert sqlwrite.encode_row(note, b"")[7] == "ab"  # Postgres text holds no NUL
    assert sqlwrite.encode_row(note, b"", frozenset({0, 1}))[7] == "ab"
    assert sqlwrite.encode_row(note, b"", frozenset({30023}))[7] == ""  # not a searchable kind
    for bad, why in (
        (make_event(sk, kind=20000), "ephemeral"),
        (make_event(sk, kind=2**31), "kind"),
        (make_event(sk, created_at=2**63), "created_at"),
        (msgspec.structs.replace(note, id="zz" * 32), "hex"),
        (msgspec.structs.replace(note, pubkey="ab" * 31), "hex"),
    ):
        with pytest.raises(sqlwrite.RowError, match=why):
            sqlwrite.encode_row(bad, b"")


def test_one_value_is_a_plain_equality() -> None:
    """One author/kind/id is `col = $n` (an ordered index scan that stops at the limit);
    several stay `= ANY($n)`."""
    text, params = sqlread.build_query([Filter(authors=[PK], kinds=[1], limit=10)], "t")  # type: ignore[misc]
    assert "pubkey = $2::bytea" in text and "kind = $3::int4" in text
    assert "ANY" not in text
    assert params[1:4] == [bytes.fromhex(PK), 1, 10]
    text, params = sqlread.build_query([Filter(ids=[PK, "0" * 64], kinds=[1, 7], limit=3)], "t")  # type: ignore[misc]
    assert "id = ANY($2::bytea[])" in text and "kind = ANY($3::int4[])" in text


def test_several_authors_read_per_author() -> None:
    """Several authors with a limit: one newest-first scan per author, merged and cut at
    the limit (each author a scalar parameter); beyond MERGE_AUTHORS_MAX one LATERAL
    probe per author over an array parameter. Counting ignores both."""
    other = "b" * 64
    text, params = sqlread.build_query([Filter(authors=[PK, other, PK], kinds=[1], limit=5)], "t")  # type: ignore[misc]
    assert text.count("UNION ALL") == 1 and "LATERAL" not in text and "{author}" not in text
    assert placeholders(text) == set(range(1, len(params) + 1))
    assert bytes.fromhex(PK) in params and bytes.fromhex(other) in params
    assert text.count("LIMIT") == 3
    many = [f"{i:064x}" for i in range(sqlread.MERGE_AUTHORS_MAX + 1)]
    text, params = sqlread.build_query([Filter(authors=many, kinds=[1], limit=5)], "t")  # type: ignore[misc]
    assert "CROSS JOIN LATERAL" in text and "pubkey = a.pk" in text and "UNION" not in text
    assert placeholders(text) == set(range(1, len(params) + 1))
    assert [bytes.fromhex(a) for a in many] in params
    count, _ = sqlcount.build_count([Filter(authors=[PK, other], limit=5)], "t")  # type: ignore[misc]
    assert "LATERAL" not in count and "UNION" not in count


def test_engram_head_is_one_address_probe() -> None:
    """kinds [30174] + one author + one `#d`: the unique address, no ORDER BY or LIMIT."""
    f = Filter(kinds=[KIND_ENGRAM], authors=[PK], tags={"p": [PK], "d": ["slug"]}, limit=1)
    text, params = sqlread.build_query([f], "t", viewer=PK)  # type: ignore[misc]
    assert "d = $" in text and "ORDER BY" not in text and "LIMIT" not in text
    assert placeholders(text) == set(range(1, len(params) + 1))
    two = Filter(kinds=[KIND_ENGRAM], authors=[PK], tags={"d": ["a", "b"]}, limit=1)
    text, _ = sqlread.build_query([two], "t", viewer=PK)  # type: ignore[misc]
    assert "LIMIT" in text


def _reads_rows(text: str) -> bool:
    return "FROM events WHERE tenant" in text


def test_count_of_one_tag_reads_event_tags() -> None:
    """NIP-45 COUNT of filters naming one tag (kinds, since, until allowed) is read from
    event_tags; anything else (ids, authors, search, a second tag name, in any of the
    filters) counts `events` rows as before."""
    countable = [
        [Filter(kinds=[7], tags={"e": ["x"]})],
        [Filter(tags={"p": [PK, "y"]}, since=1, until=9, limit=3)],
        [Filter(tags={"e": ["x"]}), Filter(kinds=[1, 6], tags={"t": ["y"]})],
    ]
    for filters in countable:
        for viewer in (None, PK):
            text, params = sqlcount.build_count(filters, "t", viewer, 100)  # type: ignore[misc]
            assert not _reads_rows(text) and "FROM event_tags x" in text, text
            assert placeholders(text) == set(range(1, len(params) + 1))
    # the common shape: scalar parameters only, so readbatch may batch it
    _, params = sqlcount.build_count(countable[0], "t", PK, 100)  # type: ignore[misc]
    assert all(not isinstance(v, list) for v in params)
    others = [
        Filter(ids=["0" * 64], tags={"e": ["x"]}),
        Filter(authors=[PK], tags={"e": ["x"]}),
        Filter(search="w", tags={"e": ["x"]}),
        Filter(tags={"e": ["x"], "p": [PK]}),
        Filter(kinds=[1]),
    ]
    for f in others:
        for filters in ([f], [Filter(tags={"e": ["x"]}), f]):
            text, _ = sqlcount.build_count(filters, "t", PK, 100)  # type: ignore[misc]
            assert _reads_rows(text), text
    with pytest.raises(ValueError):
        sqlcount.build_count([Filter(tags={"ee": ["x"]})], "t")


def test_count_of_one_tag_gates_private_kinds() -> None:
    """Private kinds are never counted from the index: without a viewer they are left
    out (nothing left: nothing to read), with one they are read through their rows."""
    assert sqlcount.build_count([Filter(kinds=[4], tags={"p": [PK]})], "t", None, 100) is None
    filters = [Filter(kinds=[4], tags={"p": [PK]}), Filter(kinds=[1], tags={"e": ["x"]})]
    text, params = sqlcount.build_count(filters, "t", None, 100)  # type: ignore[misc]
    assert "kind = 4" not in text and "kind IN" not in text
    assert placeholders(text) == set(range(1, len(params) + 1)) and "p:" + PK not in params
    text, params = sqlcount.build_count(filters, "t", PK, 100)  # type: ignore[misc]
    assert "x.kind = 4 AND e.tenant = $1 AND e.id = x.id" in text
    assert "(e.pubkey = $" in text and placeholders(text) == set(range(1, len(params) + 1))
    text, _ = sqlcount.build_count([Filter(tags={"e": ["x"]})], "t", None, 100)  # type: ignore[misc]
    assert f"x.kind NOT IN (4, 1059, 1060, 4174, 4175, {KIND_ENGRAM})" in text
    assert "e.pubkey" not in text


def test_statement_size_does_not_grow_with_the_values() -> None:
    """Tag values are one array parameter whatever their count (one value stays a scalar:
    readbatch batches it); merged per-author scans are bounded per REQ, not per filter."""
    texts = set()
    for n in (2, 3, 256):
        f = Filter(tags={"t": [f"v{i}" for i in range(n)]}, kinds=[1], limit=10)
        text, params = sqlread.build_query([f], "t")  # type: ignore[misc]
        texts.add(text)
        assert [tagindex.tag_key("t", f"v{i}") for i in range(n)] in params
        assert placeholders(text) == set(range(1, len(params) + 1))
    assert len(texts) == 1
    text, params = sqlread.build_query([Filter(tags={"t": ["v"]}, limit=10)], "t")  # type: ignore[misc]
    assert "unnest" not in text and all(not isinstance(v, list) for v in params)
    authors = [f"{i:064x}" for i in range(sqlread.MERGE_AUTHORS_MAX)]
    filters = [Filter(authors=authors, kinds=[k], limit=5) for k in range(16)]
    text, params = sqlread.build_query(filters, "t")  # type: ignore[misc]
    merged = text.count("pubkey = $")
    assert merged == sqlread.MERGE_BRANCHES_MAX, merged
    assert text.count("CROSS JOIN LATERAL") == 16 - sqlread.MERGE_BRANCHES_MAX // len(authors)
    assert placeholders(text) == set(range(1, len(params) + 1))


def test_a_d_tag_drives_a_limited_scan_whatever_the_tag_order() -> None:
    """One slug's history read (kinds 30174 and 4174, `#p` the owner, `#d` the slug, a
    limit): driven by the owner's `p` it read every engram of the memory and ran into the
    10 s query timeout at 10,000 memories; `d` names a few events."""
    from relay.store.sqlread import _driving_tag

    tags = {"p": ["ab" * 32], "d": ["x"]}
    history = Filter(kinds=[30174, 4174], authors=["cd" * 32], tags=tags, limit=500)
    assert _driving_tag(history) == "d"
    assert _driving_tag(Filter(kinds=[1], tags={"t": ["a"], "p": ["ab" * 32]}, limit=5)) == "t"
    # an engram-only filter's `d` is its address column, never a tag scan
    heads = Filter(kinds=[30174], tags={"p": ["ab" * 32], "d": ["x"]}, limit=5)
    assert _driving_tag(heads) == "p"
