"""BM25 (Okapi, k1=1.2, b=0.75) over rows that can be added and removed one at a time.

Postings are per term: an `array` of row numbers and one of term frequencies, appended as
memories arrive. A removed row is only marked dead (its document frequency is taken back at
once); its postings are skipped at query time and dropped by `compact`, which the index
calls when dead rows pile up. Scoring is numpy over each query term's postings, so a query
costs the length of its terms' postings, not the number of memories.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter

import numpy as np

K1 = 1.2
B = 0.75


class Lexical:
    def __init__(self) -> None:
        self._post: dict[str, tuple[array[int], array[int]]] = {}
        self._df: Counter[str] = Counter()
        self._len = np.zeros(0, dtype=np.float32)
        self._alive = np.zeros(0, dtype=bool)
        self._terms: list[list[str] | None] = []
        self._total_len = 0.0
        self._n_alive = 0

    def __len__(self) -> int:
        return self._n_alive

    def _grow(self, row: int) -> None:
        if row >= len(self._len):
            size = max(1024, 2 * len(self._len), row + 1)
            self._len = np.resize(self._len, size)
            self._alive = np.resize(self._alive, size)
            self._alive[len(self._terms) :] = False
        while len(self._terms) <= row:
            self._terms.append(None)

    def add(self, row: int, words: list[str]) -> None:
        """Index `words` (from `text.terms`) as row `row` (which must not be alive)."""
        self._grow(row)
        counts = Counter(words)
        for term, tf in counts.items():
            post = self._post.get(term)
            if post is None:
                post = self._post[term] = (array("i"), array("i"))
            post[0].append(row)
            post[1].append(tf)
            self._df[term] += 1
        self._len[row] = len(words)
        self._alive[row] = True
        self._terms[row] = list(counts)
        self._total_len += len(words)
        self._n_alive += 1

    def remove(self, row: int) -> None:
        if row >= len(self._terms) or not self._alive[row]:
            return
        for term in self._terms[row] or ():
            self._df[term] -= 1
        self._alive[row] = False
        self._total_len -= float(self._len[row])
        self._terms[row] = None
        self._n_alive -= 1

    def compact(self) -> None:
        """Drop dead rows' postings (rows keep their numbers)."""
        alive = self._alive
        for term in list(self._post):
            rows, tfs = self._post[term]
            r = np.frombuffer(rows, dtype=np.int32)
            keep = alive[r]
            if keep.all():
                continue
            if not keep.any():
                del self._post[term]
                self._df.pop(term, None)
                continue
            self._post[term] = (
                array("i", r[keep].tobytes()),
                array("i", np.frombuffer(tfs, dtype=np.int32)[keep].tobytes()),
            )

    def scores(self, query: list[str], size: int) -> np.ndarray:
        """BM25 of every row (dead rows 0) for the query terms; an array of `size`."""
        out = np.zeros(size, dtype=np.float32)
        n = self._n_alive
        if not n or not query:
            return out
        avgdl = max(self._total_len / n, 1.0)
        for term, qtf in Counter(query).items():
            post = self._post.get(term)
            df = self._df.get(term, 0)
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
