"""Fusing the lexical and the dense ranking into one.

Reciprocal rank fusion (Cormack et al., 2009): each ranker's top `DEPTH` rows, a row's
fused score the sum over rankers of `weight / (K + rank)`. Ranks, not scores: BM25 is
unbounded and cosine is not, so no scale has to be learnt; the weights and K were chosen
on the tuning questions of `python -m bench recall` (never on its held-out ones), see
bench/RESULTS.md.
"""

from __future__ import annotations

import numpy as np

K = 10
DEPTH = 100  # rows taken from each ranker
LEXICAL_WEIGHT = 1.0
DENSE_WEIGHT = 0.5


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
