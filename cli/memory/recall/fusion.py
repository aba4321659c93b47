"""Fusing the lexical and the dense ranking into one.

A weighted sum of normalised scores over the union of each ranker's top `DEPTH` rows:
BM25 divided by the best BM25 among them, cosine min-max scaled among them, then
`share * bm25 + (1 - share) * cosine`, a score in [0, 1]. Nothing is learnt; the share was
chosen per embedding model (`share_for`) on the tuning questions of `python -m bench recall`
(never on its held-out ones) against reciprocal rank fusion (`rrf`, kept for that
comparison): the best overall recall@10 among the settings that are not below lexical alone
on any question type (bench/RESULTS.md has the grid).

For memory written as a conversation (issue 49), three more steps, chosen on the tuning
split of `python -m bench recall conv` (and checked on `quality`'s): each ranker reads a
memory with its neighbours in its session (`with_context`: numbered entries of one slug
parent, `cli.memory.recall.index.group_of`); a second hop adds the memories that the best
first-hop memory points to (a rare name it holds and the question does not, a link); and
a value already ranked once is put after every other (the same words again say nothing
new). No model call: all of it is a few numpy operations over the scores.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

K = 10
DEPTH = 100  # rows taken from each ranker
LEXICAL_SHARE = 0.6
SHARE_BY_MODEL = {"minilm-l6-int8": 0.65}  # others: LEXICAL_SHARE


# A memory's own context: each ranker's score of a memory plus this share of its
# neighbours' in its group (the turns just before and after it in a session).
CONTEXT_LEXICAL = 0.2
CONTEXT_DENSE = 0.2
# The second hop: what the best HOP_FROM memories of the first name (people, places,
# links) finds the memories it points to, added with this weight.
HOP_FROM = 1
HOP_WEIGHT = 0.5
HOP_RARE = 5  # a name held by more memories than this (or this share) points nowhere
HOP_RARE_SHARE = 0.002


def share_for(model: str) -> float:
    return SHARE_BY_MODEL.get(model, LEXICAL_SHARE)


def top(scores: np.ndarray, alive: np.ndarray, depth: int) -> np.ndarray:
    """Rows of the `depth` best live scores, best first (ties: the lower row)."""
    masked = np.where(alive, scores, -np.inf)
    n = int(alive.sum())
    depth = min(depth, n)
    if depth <= 0:
        return np.zeros(0, dtype=np.int64)
    part = (
        np.argpartition(-masked, depth - 1)[:depth]
        if depth < len(masked)
        else np.arange(len(masked))
    )
    part = part[np.isfinite(masked[part])]
    order = np.lexsort((part, -masked[part]))
    return part[order]


def rrf(rankings: list[tuple[np.ndarray, float]], k: int = K) -> dict[int, float]:
    """row -> fused score from (rows best first, weight) pairs."""
    fused: dict[int, float] = {}
    for rows, weight in rankings:
        for rank, row in enumerate(rows.tolist()):
            fused[row] = fused.get(row, 0.0) + weight / (k + rank + 1)
    return fused


def weighted(
    lexical_rows: np.ndarray,
    dense_rows: np.ndarray,
    bm25: np.ndarray,
    cosine: np.ndarray,
    share: float = LEXICAL_SHARE,
) -> dict[int, float]:
    """row -> fused score in [0, 1] over the union of both rankers' rows."""
    rows = np.union1d(lexical_rows, dense_rows)
    if not len(rows):
        return {}
    lex = bm25[rows].astype(np.float64)
    top = lex.max()
    lex = lex / top if top > 0 else lex * 0
    den = cosine[rows].astype(np.float64)
    spread = den.max() - den.min()
    den = (den - den.min()) / spread if spread > 0 else np.ones_like(den)
    fused = share * lex + (1 - share) * den
    return dict(zip(rows.tolist(), fused.tolist(), strict=True))


class Links(NamedTuple):
    """The rows of an index that have neighbours, and for each its neighbours one and
    two away before and after (`size` for none), as `with_context` reads them."""

    size: int
    rows: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    prev2: np.ndarray
    next2: np.ndarray


def with_context(scores: np.ndarray, links: Links, share: float) -> np.ndarray:
    """Each row's score plus `share` of its neighbours' and CONTEXT_FAR of that for the
    neighbours' neighbours (gathered over the rows that have any)."""
    if share == 0 or not len(links.rows):
        return scores
    pad = np.append(scores, np.float32(0))  # index `size` reads the 0
    near = pad[links.prev]
    near += pad[links.next]
    if CONTEXT_FAR:
        far = pad[links.prev2]
        far += pad[links.next2]
        far *= CONTEXT_FAR
        near += far
    near *= share
    if len(links.rows) == len(scores):  # every row has neighbours: no scatter
        near += scores
        return near
    out = scores.copy()
    out[links.rows] += near
    return out


CONTEXT_FAR = 0.5
DEDUPE = True
