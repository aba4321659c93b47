"""BM25 (Okapi, k1=1.2, b=0.75) over rows that can be added and removed one at a time.

Terms are numbered (`vocab`); postings are per term: an `array` of row numbers and one of
term frequencies, appended as memories arrive. A removed row is only marked dead (its
document frequency is taken back at once); its postings are skipped at query time and
dropped by `compact`, which the index calls when dead rows pile up. Scoring is numpy over
each query term's postings, so a query costs the length of its terms' postings, not the
number of memories.

`export` and `load` move the rows' terms in and out as flat arrays (the cache keeps them):
a process that opens the cache builds its postings with a few numpy calls instead of
tokenizing and stemming every memory again.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass

import numpy as np

K1 = 1.2
B = 0.75


@dataclass
class Terms:
    """Rows' terms as flat arrays: row i has `counts[i]` distinct terms, their numbers (in
    `vocab`) and frequencies next in `ids` and `tfs`, and `lengths[i]` terms in all."""

    vocab: list[str]
    counts: np.ndarray  # int32 per row
    ids: np.ndarray  # int32, sum(counts)
    tfs: np.ndarray  # int32, sum(counts)
    lengths: np.ndarray  # int32 per row


class Lexical:
    def __init__(self) -> None:
        self._vocab: list[str] = []
        self._id: dict[str, int] = {}
        self._post: list[tuple[array[int], array[int]] | None] = []  # by term number
        self._df = np.zeros(0, dtype=np.int64)
        self._len = np.zeros(0, dtype=np.float32)
        self._alive = np.zeros(0, dtype=bool)
        self._terms: list[array[int] | None] = []  # distinct term numbers of each row
        self._total_len = 0.0
        self._n_alive = 0

    def __len__(self) -> int:
        return self._n_alive

    def _grow(self, row: int) -> None:
        if row >= len(self._len):
            size = max(1024, 2 * len(self._len), row + 1)
            self._len = np.resize(self._len, size)
            alive = np.zeros(size, dtype=bool)
            alive[: len(self._alive)] = self._alive
            self._alive = alive
        if row >= len(self._terms):
            self._terms.extend([None] * (row + 1 - len(self._terms)))

    def _number(self, term: str) -> int:
        n = self._id.get(term)
        if n is None:
            n = self._id[term] = len(self._vocab)
            self._vocab.append(term)
            self._post.append(None)
            if n >= len(self._df):
                self._df = np.resize(self._df, max(1024, 2 * len(self._df)))
                self._df[n:] = 0
        return n

    def add(self, row: int, words: list[str]) -> None:
        """Index `words` (from `text.terms`) as row `row` (which must not be alive)."""
        self._grow(row)
        counts = Counter(words)
        ids = array("i")
        for term, tf in counts.items():
            n = self._number(term)
            post = self._post[n]
            if post is None:
                post = self._post[n] = (array("i"), array("i"))
            post[0].append(row)
            post[1].append(tf)
            self._df[n] += 1
            ids.append(n)
        self._len[row] = len(words)
        self._alive[row] = True
        self._terms[row] = ids
        self._total_len += len(words)
        self._n_alive += 1

    def add_many(self, rows: list[int], docs: list[list[str]]) -> None:
        """Index each of `docs` (`text.terms`) as the row beside it (none alive), all at
        once through `load`: the postings, numbering and scores are `add`'s, one row after
        another, without its per-term numpy updates (a fifth of a first build's indexing)."""
        vocab: dict[str, int] = {}
        counts, ids, tfs, lengths = array("i"), array("i"), array("i"), array("i")
        for words in docs:
            tf_of = Counter(words)
            counts.append(len(tf_of))
            lengths.append(len(words))
            for term, tf in tf_of.items():
                ids.append(vocab.setdefault(term, len(vocab)))
                tfs.append(tf)

        def arr(a: array[int]) -> np.ndarray:
            return np.frombuffer(a, dtype=np.int32) if len(a) else np.zeros(0, np.int32)

        self.load(rows, Terms(list(vocab), arr(counts), arr(ids), arr(tfs), arr(lengths)))

    def remove(self, row: int) -> None:
        if row >= len(self._terms) or not self._alive[row]:
            return
        ids = self._terms[row]
        if ids is not None:
            self._df[np.frombuffer(ids, dtype=np.int32)] -= 1
        self._alive[row] = False
        self._total_len -= float(self._len[row])
        self._terms[row] = None
        self._n_alive -= 1

    def compact(self) -> None:
        """Drop dead rows' postings (rows keep their numbers)."""
        alive = self._alive
        for n, post in enumerate(self._post):
            if post is None:
                continue
            r = np.frombuffer(post[0], dtype=np.int32)
            keep = alive[r]
            if keep.all():
                continue
            if not keep.any():
                self._post[n] = None
                continue
            self._post[n] = (
                array("i", r[keep].tobytes()),
                array("i", np.frombuffer(post[1], dtype=np.int32)[keep].tobytes()),
            )

    def export(self, rows: list[int]) -> Terms:
        """The terms of these live rows, in this order (for the cache), gathered from the
        postings with numpy (a row's terms come out in term order)."""
        # int32 throughout and each temporary dropped once used: at 100,000 memories the
        # postings are ~3M entries, and int64 copies of them (a lexsort, a unique) raised
        # the saving process's peak RSS past 400 MB (bench recall speed)
        position = np.full(len(self._len), -1, dtype=np.int32)
        position[np.asarray(rows, dtype=np.int64)] = np.arange(len(rows), dtype=np.int32)
        parts = [(n, p) for n, p in enumerate(self._post) if p is not None and len(p[0])]
        if not parts:
            zero = np.zeros(len(rows), np.int32)
            return Terms([], zero, np.zeros(0, np.int32), np.zeros(0, np.int32), zero)
        lengths = np.fromiter((len(p[0]) for _, p in parts), dtype=np.int64, count=len(parts))
        term = np.repeat(np.fromiter((n for n, _ in parts), np.int32, len(parts)), lengths)
        del lengths
        at = position[np.frombuffer(b"".join(p[0].tobytes() for _, p in parts), dtype=np.int32)]
        del position
        keep = at >= 0  # dead rows' postings are dropped here too
        at, term = at[keep], term[keep]
        tf = np.frombuffer(b"".join(p[1].tobytes() for _, p in parts), dtype=np.int32)[keep]
        del keep, parts
        # postings come in term order, so a stable sort by row keeps each row's terms in
        # term order
        order = np.argsort(at, kind="stable")
        counts = np.bincount(at, minlength=len(rows)).astype(np.int32)
        del at
        term = term[order]
        tf = tf[order]
        del order
        present = np.zeros(len(self._vocab), dtype=bool)
        present[term] = True
        used = np.flatnonzero(present)
        local = (np.cumsum(present, dtype=np.int32) - 1)[term]
        return Terms(
            [self._vocab[i] for i in used.tolist()],
            counts,
            local,
            tf,
            self._len[rows].astype(np.int32) if rows else np.zeros(0, np.int32),
        )

    def load(self, rows: list[int], terms: Terms) -> None:
        """Index `terms` as these rows (none of them alive), all at once."""
        if not rows:
            return
        remap = np.fromiter(
            (self._number(t) for t in terms.vocab), dtype=np.int32, count=len(terms.vocab)
        )
        ids = remap[terms.ids] if len(terms.ids) else terms.ids
        row_of = np.repeat(np.asarray(rows, dtype=np.int32), terms.counts)
        self._grow(max(rows))
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        bounds = np.flatnonzero(np.diff(sorted_ids)) + 1
        starts = np.concatenate(([0], bounds)).tolist()
        ends = [*bounds.tolist(), len(sorted_ids)]
        post_rows = row_of[order]
        post_tfs = terms.tfs[order]
        firsts = sorted_ids[starts].tolist() if len(sorted_ids) else []  # no terms at all
        for n, a, b in zip(firsts, starts, ends, strict=False):
            post = self._post[n]
            if post is None:
                post = self._post[n] = (array("i"), array("i"))
            post[0].frombytes(post_rows[a:b].tobytes())
            post[1].frombytes(post_tfs[a:b].tobytes())
        np.add.at(self._df, ids, 1)
        offsets = np.concatenate(([0], np.cumsum(terms.counts))).tolist()
        ids_b = ids.astype(np.int32).tobytes()
        for i, row in enumerate(rows):
            self._terms[row] = array("i", ids_b[4 * offsets[i] : 4 * offsets[i + 1]])
        idx = np.asarray(rows)
        self._len[idx] = terms.lengths
        self._alive[idx] = True
        self._total_len += float(terms.lengths.sum())
        self._n_alive += len(rows)

    def df(self, term: str) -> int:
        """How many live rows hold `term`."""
        t = self._id.get(term)
        return int(self._df[t]) if t is not None else 0

    def scores(self, query: list[str], size: int) -> np.ndarray:
        """BM25 of every row (dead rows 0) for the query terms; an array of `size`."""
        out = np.zeros(size, dtype=np.float32)
        n = self._n_alive
        if not n or not query:
            return out
        avgdl = max(self._total_len / n, 1.0)
        for term, qtf in Counter(query).items():
            t = self._id.get(term)
            post = self._post[t] if t is not None else None
            df = int(self._df[t]) if t is not None else 0
            if post is None or df <= 0:
                continue
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            rows = np.frombuffer(post[0], dtype=np.int32)
            tf = np.frombuffer(post[1], dtype=np.int32).astype(np.float32)
            dl = self._len[rows]
            part = idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * dl / avgdl))
            part *= self._alive[rows]
            if len(rows) < 64:
                np.add.at(out, rows, part * qtf)
            else:
                _add(out, rows, part * qtf)
        return out


def _add(out: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    # much faster than np.add.at on long postings (rows are never reused, so each row is
    # in a term's postings at most once anyway)
    out += np.bincount(rows, weights=values, minlength=len(out))[: len(out)].astype(np.float32)
