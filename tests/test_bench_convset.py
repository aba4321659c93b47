"""The conversational recall set (`bench.convset`) is the set that was frozen, and what it
holds is what bench/RESULTS.md says it holds; `bench recall conv` runs on it (a smoke run on
one conversation: nothing timed, no figure asserted)."""

from __future__ import annotations

from collections import Counter

from bench.convset import DIGEST, KINDS, build, digest, generate


def test_the_set_is_the_frozen_one_and_holds_what_it_says() -> None:
    cs = build()
    assert digest(cs) == DIGEST
    assert len(cs.conversations) == 40
    assert sum(len(c.turns) for c in cs.conversations) == 18_954
    kinds = Counter(q.kind for q in cs.questions)
    assert set(kinds) == set(KINDS) and sum(kinds.values()) == 1_554
    for conv in cs.conversations:
        slugs = {t.slug for t in conv.turns}
        assert len(slugs) == len(conv.turns)  # one memory per turn
        for q in conv.questions:
            assert q.needed and set(q.needed) <= slugs, q.text
            assert (len(q.needed) >= 2) == (q.kind == "multi"), q.text
    held = {c.number for c in cs.conversations if cs.held_out(c.number)}
    assert 0 < len(held) < len(cs.conversations)


def test_another_seed_is_another_set() -> None:
    """Negative twin: the digest tells sets apart (a changed generator is caught)."""
    assert digest(generate(seed=50, conversations=2)) != digest(generate(conversations=2))


def test_recall_conv_runs_on_one_conversation() -> None:
    from bench.convset import ConvSet
    from bench.recall import conv_evaluate, conv_table

    cs = build()
    one = ConvSet(cs.seed, cs.conversations[:1])
    results = conv_evaluate(one, "wordllama-256", "all")
    assert set(results) == {"bm25", "lexical", "dense", "fused"}
    assert results["fused"]["all"]["n"] == len(one.questions)
    assert "| all |" in conv_table(results)
