"""bench/corpus.py: the values `bench scale` asks for are what the stored events carry.

The "events with the value" column of the scale report comes from the generator's
counts; here they are checked against the signed events themselves (replaceable events
replacing older versions, as the relay stores them).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from bench import corpus
from engram.nip01 import Event, verify_event


def stored(prepared: corpus.Prepared) -> list[Event]:
    """What a relay keeps of the stream: every regular event, the newest per address."""
    latest: dict[tuple[str, int, str], Event] = {}
    kept: list[Event] = []
    for _, _, events in prepared.chunks():
        for raw in events.raw:
            ev = msgspec.json.decode(raw, type=Event)
            if ev.kind in corpus.REGULAR:
                kept.append(ev)
                continue
            d = next((t[1] for t in ev.tags if t[0] == "d"), "")
            old = latest.get((ev.pubkey, ev.kind, d))
            if old is None or ev.created_at > old.created_at:
                latest[(ev.pubkey, ev.kind, d)] = ev
    return kept + list(latest.values())


def carried(events: list[Event]) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {s: Counter() for s in corpus.TAG_SHAPES}
    for ev in events:
        for shape, value in {(f"#{t[0]}", t[1]) for t in ev.tags if t[0] in "ept"}:
            counts[shape][value] += 1
        counts["search"].update(set(re.findall(r"[a-z0-9]+", ev.content)))
    return counts


@pytest.mark.parametrize("name", corpus.CORPORA)
def test_picks_match_the_stored_events(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGRAM_BENCH_CACHE", str(tmp_path))
    prepared = corpus.prepare(name, 7, [1000, 3000], chunk=1000, say=lambda _s: None)
    assert prepared.meta.bounds == [1000, 2000, 3000]
    events = stored(prepared)
    assert all(verify_event(ev) for ev in events[:50])  # signed for real
    counts = carried(events)
    picks = prepared.picks(3000)
    for shape in corpus.TAG_SHAPES:
        for cls in corpus.CLASSES:
            key = f"{shape} {cls}"
            values, matches = picks.values[key], picks.matches[key]
            assert values, key
            assert [counts[shape][v] for v in values] == matches, key
        assert all(m == 0 for m in picks.matches[f"{shape} absent"])
        assert all(1 <= m <= 5 for m in picks.matches[f"{shape} rare"]), shape
        top = sorted(counts[shape].values(), reverse=True)[:5]
        assert sorted(picks.matches[f"{shape} common"], reverse=True) == top, shape
    if name == "skewed":  # one hashtag and one `p` value on every stored event
        assert counts["#t"][corpus.SKEW_TAG] == len(events)
        assert counts["#p"][corpus.SKEW_P] == len(events)
        notes = sum(1 for ev in events if ev.kind == 1)
        assert all(counts["search"][w] == notes for w in corpus.SKEW_WORDS)
    ids = {ev.id for ev in events}
    assert set(picks.values["ids"]) <= ids and set(picks.values["COUNT"]) <= ids
    # the same seed gives the same stream from the cache, without signing again
    again = corpus.prepare(name, 7, [1000, 3000], chunk=1000, say=lambda _s: None)
    assert again.meta == prepared.meta


def test_a_cached_corpus_serves_any_of_its_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench flood --size N` loads part of a corpus `bench scale` signed for several
    sizes: found in the cache by any of its sizes, read only up to N."""
    monkeypatch.setenv("ENGRAM_BENCH_CACHE", str(tmp_path))
    assert corpus.cached("skewed", 7, 1000, chunk=1000) is None
    made = corpus.prepare("skewed", 7, [1000, 3000], chunk=1000, say=lambda _s: None)
    for size in (1000, 3000):
        found = corpus.cached("skewed", 7, size, chunk=1000)
        assert found is not None and found.directory == made.directory
        assert found.picks(size) == made.picks(size)
    # 2000 is a chunk end but no size the picks were made for; other seeds, corpora and
    # chunk sizes are other streams
    assert corpus.cached("skewed", 7, 2000, chunk=1000) is None
    assert corpus.cached("skewed", 8, 1000, chunk=1000) is None
    assert corpus.cached("realistic", 7, 1000, chunk=1000) is None
    assert corpus.cached("skewed", 7, 1000, chunk=500) is None
    assert [(a, b) for a, b, _ in made.chunks(1000)] == [(0, 1000)]
    assert [(a, b) for a, b, _ in made.chunks()] == [(0, 1000), (1000, 2000), (2000, 3000)]
    # a size whose chunks are all there is found even when a later chunk is missing
    (made.directory / "upto-0000003000.msgpack").unlink()
    assert corpus.cached("skewed", 7, 1000, chunk=1000) is not None
    assert corpus.cached("skewed", 7, 3000, chunk=1000) is None
    # every absent value is one no event carries, whatever its index
    assert corpus.absent("#t", 0) == made.picks(1000).values["#t absent"][0]
    assert corpus.absent("#e", 5) == made.picks(1000).values["#e absent"][5]
