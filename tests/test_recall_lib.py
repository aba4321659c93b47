"""The recall library without a relay: the packaged model read as WordLlama reads it, the
lexical index's removals, the head rule on updates, and the cache's sealing."""

from __future__ import annotations

import numpy as np
import pytest

from cli.memory.recall.dense import load, package_dir
from cli.memory.recall.index import Known, RecallIndex
from cli.memory.recall.lexical import Lexical
from cli.memory.recall.text import terms


def test_vectors_are_wordllamas_own() -> None:
    wordllama = pytest.importorskip("wordllama")
    reference = wordllama.WordLlama.load(cache_dir=package_dir("wordllama"), disable_download=True)
    texts = ["The user prefers Neovim for Go.", "Dana leads the payments team.", "x"]
    ours = load().embed(texts)
    theirs = reference.embed(texts, norm=True)
    assert np.allclose(ours, theirs, atol=1e-3)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_terms_stem_and_drop_stop_words() -> None:
    assert terms("Which editor does the user prefer?") == ["editor", "user", "prefer"]
    assert terms("preferred preferences") == ["prefer", "prefer"]


def test_lexical_forgets_removed_rows() -> None:
    lex = Lexical()
    lex.add(0, terms("coffee black no sugar"))
    lex.add(1, terms("green tea after lunch"))
    assert lex.scores(terms("coffee"), 2)[0] > 0
    lex.remove(0)
    lex.compact()
    assert lex.scores(terms("coffee"), 2).tolist() == [0.0, 0.0] and len(lex) == 1


def test_index_applies_the_head_rule_and_drops_what_is_not_live() -> None:
    index = RecallIndex(load())
    index.put({"mem/a": Known("1" * 64, 100, "coffee black")})
    # an older version arriving late never replaces the head
    assert index.apply_known([("mem/a", Known("2" * 64, 99, "coffee with milk"))]) == 0
    assert index.rank("coffee", 5)[0].value == "coffee black"
    # a newer tombstone removes it; an equal-time event with a lower id would win the tie
    assert index.apply_known([("mem/a", Known("0" * 64, 100, None))]) == 1
    assert index.rank("coffee", 5) == [] and len(index) == 0
