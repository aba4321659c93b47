"""`python -m bench recall`: recall quality, and recall speed and size.

    python -m bench recall quality [--split held-out|tune|all] [--model NAME] [--fresh]
    python -m bench recall conv [--split held-out|tune|all] [--model NAME]
    python -m bench recall speed [--sizes 1000,10000,100000] [--queries 200]

`quality` builds the evaluation set of `bench.recallset` (deterministic: the figures are the
same on any machine), indexes its memories exactly as `AgentMemory.recall` does (the same
`RecallIndex`, its vectors taken through the int8 cache), and reports recall@1/5/10 per
question type for lexical alone, dense alone and fused: `all` (every needed memory in the
top k) and `any` (at least one). Absent-fact questions have no answer: `wrong@1` is how
often the top hit is the same kind of fact about someone else. Tune on `--split tune` only.
`--fresh` measures the fresh set (`bench.recallset.build_fresh`: other people and projects,
frozen before recall was measured on it, every question held out): what bench/RESULTS.md
reports since the seed-38 held-out split was looked at during tuning.

`speed` starts an embedded PostgreSQL and one relay of ours, writes N memories of the same
generator, then measures: the first build from an empty cache (memories/s), warm recall
through the API and through MCP (`engram mcp` with the `mcp` SDK client; p50/p99), a cold
`engram mem recall` process with a current cache (wall time, start-up and the check for
changes included), the cache's bytes per memory and the RSS of the process holding the
index. It is a benchmark: run it alone on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from typing import Any

KINDS = ("single", "dated", "combine", "absent")
MODES = ("lexical", "dense", "rrf", "fused")
KS = (1, 5, 10)


def _index(evalset: Any, model: str) -> Any:
    from cli.memory.recall.dense import load
    from cli.memory.recall.index import Known, RecallIndex

    index = RecallIndex(load(model))
    known = {
        m.slug: Known(f"{i:064x}", m.created_at, m.value) for i, m in enumerate(evalset.memories)
    }
    index.put(known)
    return _through_cache(index)


def _through_cache(index: Any) -> Any:
    """The index as a new process would load it: vectors via the int8 cache."""
    import tempfile
    from pathlib import Path

    from cli.memory.recall.cache import CacheFile
    from cli.memory.recall.index import RecallIndex

    with tempfile.TemporaryDirectory() as tmp:
        cache = CacheFile(Path(tmp), "a" * 64, "b" * 64, index.embedder.name, b"k" * 32)
        cache.save(index, {}, {}, {})
        again = RecallIndex(index.embedder)
        assert cache.load(again) is not None
    return again


def evaluate(evalset: Any, index: Any, split: str) -> dict[str, dict[str, dict[str, float]]]:
    """mode -> kind -> metric -> value (percent), over the chosen split."""
    questions = [
        q
        for q in evalset.questions
        if split == "all" or (evalset.held_out(q.entity) == (split == "held-out"))
    ]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for mode in MODES:
        sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        counts: dict[str, int] = defaultdict(int)
        for q in questions:
            hits = [h.slug for h in index.rank(q.text, max(KS), mode)]
            counts[q.kind] += 1
            if q.kind == "absent":
                others = set(q.others)
                sums[q.kind]["wrong@1"] += bool(hits) and hits[0] in others
                continue
            for k in KS:
                top = set(hits[:k])
                sums[q.kind][f"all@{k}"] += all(s in top for s in q.needed)
                sums[q.kind][f"any@{k}"] += any(s in top for s in q.needed)
        out[mode] = {
            kind: {m: 100.0 * v / counts[kind] for m, v in sums[kind].items()}
            | {"n": float(counts[kind])}
            for kind in KINDS
            if counts[kind]
        }
        answered = [k for k in KINDS if k != "absent" and counts[k]]
        total = sum(counts[k] for k in answered)
        out[mode]["all"] = {
            m: sum(out[mode][k][m] * counts[k] for k in answered) / total
            for m in out[mode][answered[0]]
            if m != "n"
        } | {"n": float(total)}
    return out


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [
        "| type | n | ranker | all@1 | all@5 | all@10 | any@1 | any@5 | any@10 | wrong@1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in (*KINDS, "all"):
        for mode in MODES:
            row = results[mode].get(kind)
            if row is None:
                continue
            cells = [
                f"{row[m]:.1f}" if m in row else ""
                for m in ("all@1", "all@5", "all@10", "any@1", "any@5", "any@10", "wrong@1")
            ]
            lines.append(f"| {kind} | {int(row['n'])} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def similarity_report(evalset: Any, index: Any) -> str:
    """What `RecallSettings.similar` is chosen from (tuning split only): the cosine `set`'s
    hints compute (value to value) of a memory with the same fact said with another of its
    type's phrasings (a near-duplicate an agent might write, under another slug), against a
    different fact of the same person and a memory of someone else; and how often the
    near-duplicate's original is among the candidates `similar` compares."""
    import numpy as np

    from bench.recallset import PERSON_FACTS
    from cli.memory.recall.index import SIMILAR_CANDIDATES
    from cli.memory.recall.text import normalise

    says = {ft.name: ft.says for ft in PERSON_FACTS}
    mems = [m for m in evalset.memories if m.said and not evalset.held_out(m.entity)][:2000]
    dup, same_person, other, found = [], [], [], 0
    for i, m in enumerate(mems):
        again = next(t for t in says[m.fact] if t.format(**m.said) != m.value).format(**m.said)
        dup.append((m.value, again))
        found += m.slug in {h.slug for h in index.rank(again, SIMILAR_CANDIDATES + 1)}
        nxt = mems[(i + 1) % len(mems)]
        if nxt.entity == m.entity:
            same_person.append((m.value, nxt.value))
        far = mems[(i + 97) % len(mems)]
        if far.entity != m.entity:
            other.append((m.value, far.value))

    def cos(pairs: list[tuple[str, str]]) -> Any:
        a = index.embedder.embed([normalise(p[0]) for p in pairs])
        b = index.embedder.embed([normalise(p[1]) for p in pairs])
        return (a * b).sum(axis=1)

    q = [5, 25, 50, 75, 95]
    lines = [
        f"near-duplicates whose original is among the {SIMILAR_CANDIDATES} candidates: "
        f"{100 * found / len(mems):.1f}%"
    ]
    for name, pairs in (
        ("near-duplicates", dup),
        ("another fact, same person", same_person),
        ("someone else's fact", other),
    ):
        c = cos(pairs)
        at = " ".join(f">={t}: {100 * (c >= t).mean():.1f}%" for t in (0.5, 0.55, 0.6, 0.65, 0.7))
        lines.append(
            f"{name} (n={len(c)}): cosine percentiles {q}: {np.percentile(c, q).round(3).tolist()}"
            f"; {at}"
        )
    return "\n".join(lines)


def quality(argv: list[str]) -> int:
    from bench.recallset import build, build_fresh
    from cli.memory.recall.dense import DEFAULT_MODEL

    p = argparse.ArgumentParser(prog="python -m bench recall quality")
    p.add_argument("--split", choices=("held-out", "tune", "all"), default="held-out")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--seed", type=int, default=38)
    p.add_argument("--fresh", action="store_true", help="the fresh set, every question")
    p.add_argument("--similarity", action="store_true", help="also the hint threshold report")
    args = p.parse_args(argv)
    if args.fresh:
        if args.similarity:
            p.error("--similarity is chosen on the tuning split only")
        evalset, args.split = build_fresh(), "all"
    else:
        evalset = build(args.seed)
    start = time.perf_counter()
    index = _index(evalset, args.model)
    built = time.perf_counter() - start
    n_q = len(evalset.questions)
    held = n_q if args.fresh else sum(evalset.held_out(q.entity) for q in evalset.questions)
    name = "fresh (every question held out)" if args.fresh else f"seed {args.seed}"
    print(
        f"evaluation set: {name}, {len(evalset.memories)} memories, {n_q} questions "
        f"({held} held out); model {args.model}; split {args.split}; indexed in {built:.1f} s"
    )
    print(table(evaluate(evalset, index, args.split)))
    if args.similarity:
        print(similarity_report(evalset, index))
    return 0


CONV_KINDS = ("multi", "time", "implied", "single")
CONV_MODES = ("bm25", "lexical", "dense", "fused")


def _conv_index(conv: Any, model: str) -> Any:
    """One conversation's memories as recall indexes them (through the int8 cache)."""
    from cli.memory.recall.dense import load
    from cli.memory.recall.index import Known, RecallIndex

    index = RecallIndex(load(model))
    index.put({t.slug: Known(f"{i:064x}", t.created_at, t.value) for i, t in enumerate(conv.turns)})
    return _through_cache(index)


def _bm25(conv: Any) -> Any:
    """The baseline: plain BM25 over the same memories (each turn's slug words and value,
    stemmed, stop words dropped; `cli.memory.recall.lexical` with nothing else), ranked
    by score, ties to the newer memory."""
    import numpy as np

    from cli.memory.recall.index import doc_text
    from cli.memory.recall.lexical import Lexical
    from cli.memory.recall.text import terms

    lex = Lexical()
    for row, t in enumerate(conv.turns):
        lex.add(row, terms(doc_text(t.slug, t.value)))
    created = np.array([t.created_at for t in conv.turns], dtype=np.int64)

    def rank(query: str, k: int) -> list[str]:
        scores = lex.scores(terms(query), len(conv.turns))
        rows = [r for r in np.lexsort((-created, -scores))[:k].tolist() if scores[r] > 0]
        return [conv.turns[r].slug for r in rows]

    return rank


def conv_evaluate(convset: Any, model: str, split: str) -> dict[str, dict[str, dict[str, float]]]:
    """mode -> kind -> metric -> percent over the chosen split of the conversational set;
    each conversation is its own memory (one index per conversation, as in use)."""
    sums: dict[str, dict[str, dict[str, float]]] = {
        m: {k: defaultdict(float) for k in (*CONV_KINDS, "all")} for m in CONV_MODES
    }
    counts: dict[str, int] = defaultdict(int)
    for conv in convset.conversations:
        if split != "all" and convset.held_out(conv.number) != (split == "held-out"):
            continue
        index = _conv_index(conv, model)
        bm25 = _bm25(conv)
        for q in conv.questions:
            counts[q.kind] += 1
            counts["all"] += 1
            for mode in CONV_MODES:
                if mode == "bm25":
                    hits = bm25(q.text, max(KS))
                else:
                    hits = [h.slug for h in index.rank(q.text, max(KS), mode)]
                for kind in (q.kind, "all"):
                    for k in KS:
                        top = set(hits[:k])
                        sums[mode][kind][f"all@{k}"] += all(s in top for s in q.needed)
                        sums[mode][kind][f"any@{k}"] += any(s in top for s in q.needed)
    return {
        mode: {
            kind: {m: 100.0 * v / counts[kind] for m, v in sums[mode][kind].items()}
            | {"n": float(counts[kind])}
            for kind in (*CONV_KINDS, "all")
            if counts[kind]
        }
        for mode in CONV_MODES
    }


def conv_table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """Per kind: n, BM25 and recall (fused) all@10 with the ratio, any@10; then every
    ranker's all@1/5/10."""
    lines = [
        "| questions | n | BM25 all@10 | recall all@10 | ratio | BM25 any@10 | recall any@10 |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for kind in ("all", *CONV_KINDS):
        b, r = results["bm25"].get(kind), results["fused"].get(kind)
        if b is None or r is None:
            continue
        ratio = r["all@10"] / b["all@10"] if b["all@10"] else float("inf")
        lines.append(
            f"| {kind} | {int(b['n'])} | {b['all@10']:.1f} | {r['all@10']:.1f} | {ratio:.2f}x"
            f" | {b['any@10']:.1f} | {r['any@10']:.1f} |"
        )
    lines += [
        "",
        "| kind | ranker | all@1 | all@5 | all@10 | any@10 |",
        "|---|---|--:|--:|--:|--:|",
    ]
    for kind in ("all", *CONV_KINDS):
        for mode in CONV_MODES:
            row = results[mode].get(kind)
            if row is not None:
                cells = " | ".join(f"{row[m]:.1f}" for m in ("all@1", "all@5", "all@10", "any@10"))
                lines.append(f"| {kind} | {mode} | {cells} |")
    return "\n".join(lines)


def conversational(argv: list[str]) -> int:
    from bench.convset import build
    from cli.memory.recall.dense import DEFAULT_MODEL

    p = argparse.ArgumentParser(prog="python -m bench recall conv")
    p.add_argument("--split", choices=("held-out", "tune", "all"), default="held-out")
    p.add_argument("--model", default=DEFAULT_MODEL)
    args = p.parse_args(argv)
    convset = build()
    start = time.perf_counter()
    results = conv_evaluate(convset, args.model, args.split)
    took = time.perf_counter() - start
    n_turns = sum(len(c.turns) for c in convset.conversations)
    print(
        f"conversational set: {len(convset.conversations)} conversations, {n_turns} turns, "
        f"{len(convset.questions)} questions; model {args.model}; split {args.split}; "
        f"{took:.1f} s"
    )
    print(conv_table(results))
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] == "quality":
        return quality(argv[1:])
    if argv[0] == "conv":
        return conversational(argv[1:])
    if argv[0] == "speed":
        from bench.recallspeed import speed

        return speed(argv[1:])
    print(f"unknown mode {argv[0]!r}: quality, conv or speed", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
