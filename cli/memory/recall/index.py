"""The recall index of one agent's memory: what each slug reads as (slug -> the event that
decided it, created_at, the live value with its version, trust and validity), a BM25 index
of the live values' words and a matrix of their unit vectors, row by row.

Pure and in memory: `cli.memory.recall.cache` stores it, `cli.memory.recall.updater` feeds
it from the relays. What is live is decided by `engram.live` (the one rule of every read:
tombstones, owner verdicts, forgets), in the updater; the index holds its answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from cli.memory.recall import fusion
from cli.memory.recall.dense import Embedder
from cli.memory.recall.lexical import Lexical
from cli.memory.recall.text import slug_words, terms
from engram import Body, Head, beats, body_text, is_live


@dataclass(frozen=True)
class Known:
    """What the index knows of a slug: the event that decided it (a head, or an owner
    verdict: enough to apply the head rule to a newer event), and the value when the slug
    reads as live (None: removed, denied, forgotten, core). `version` is the live
    version's name (`log`'s id), with its trust, author role and validity."""

    event_id: str
    created_at: int
    value: str | None
    version: str = ""
    trust: str | None = None
    role: str = "agent"
    valid_from: int | None = None
    valid_until: int | None = None


@dataclass(frozen=True)
class Hit:
    slug: str
    value: str
    score: float
    created_at: int
    event_id: str
    lexical_rank: int | None = None  # 1-based, None when outside that ranker's depth
    dense_rank: int | None = None
    similarity: float = 0.0  # cosine of query and memory vectors
    trust: str | None = None
    role: str = "agent"
    valid_from: int | None = None
    valid_until: int | None = None


def quantize(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 rows and a float32 scale per row (how the cache stores vectors)."""
    peak = np.abs(vectors).max(axis=1) if len(vectors) else np.zeros(0, np.float32)
    scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    return np.rint(vectors / scales[:, None]).astype(np.int8), scales


def dequantize(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) * scales[:, None]


def live_value(body: Body) -> str | None:
    """The text recall indexes for a head: its value when `engram.is_live`, else None."""
    return body_text(body) if is_live(body) else None


def doc_text(slug: str, value: str) -> str:
    return f"{slug_words(slug)}. {value}"


class RecallIndex:
    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.heads: dict[str, Known] = {}
        self.lexical = Lexical()
        self._row_of: dict[str, int] = {}
        self._slug_at: list[str | None] = []
        self._vectors = np.zeros((0, embedder.dim), dtype=np.float32)
        self._alive = np.zeros(0, dtype=bool)
        self._dead = 0

    # -- state -----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._row_of)

    def knows(self, event_id: str) -> bool:
        """Whether `event_id` is the head of some slug here (verified when it arrived)."""
        return event_id in self._ids

    @property
    def _ids(self) -> set[str]:
        ids = getattr(self, "_id_set", None)
        if ids is None:
            ids = self._id_set = {k.event_id for k in self.heads.values()}
        return ids

    def newest(self) -> int:
        return max((k.created_at for k in self.heads.values()), default=0)

    def vectors(self) -> tuple[list[str], np.ndarray]:
        """Live slugs in row order and their vectors (for the cache)."""
        rows = sorted(self._row_of.values())
        return [self._slug_at[r] or "" for r in rows], self._vectors[rows]

    # -- updates ---------------------------------------------------------------------

    def apply(self, heads: Iterable[Head]) -> int:
        """Take every head that beats what the index holds for its slug (spec: *Head
        selection*); returns how many changed. New live values are embedded in one batch."""
        return self.apply_known(
            (h.body.slug, Known(h.event.id, h.event.created_at, live_value(h.body))) for h in heads
        )

    def apply_known(self, entries: Iterable[tuple[str, Known]]) -> int:
        """`apply` for heads already reduced to `Known` (a write this process made)."""
        changed: dict[str, Known] = {}
        for slug, k in entries:
            prior = changed.get(slug) or self.heads.get(slug)
            if prior is not None and not beats(
                k.created_at, k.event_id, prior.created_at, prior.event_id
            ):
                continue
            changed[slug] = k
        self.put(changed)
        return len(changed)

    def put(self, known: dict[str, Known], vectors: np.ndarray | None = None) -> None:
        """Set these slugs' heads as given (no head rule: the caller applied it); `vectors`,
        when given, are the live ones' vectors in the order of `known`'s live entries."""
        if not known:
            return
        ids = self._ids
        for slug, k in known.items():
            old = self.heads.get(slug)
            if old is not None:
                ids.discard(old.event_id)
                self._drop(slug)
            self.heads[slug] = k
            ids.add(k.event_id)
        live = [(s, k.value) for s, k in known.items() if k.value is not None]
        if not live:
            return
        if vectors is None:  # as the cache will give them back: one index, one ranking
            vectors = dequantize(*quantize(self.embedder.embed([doc_text(s, v) for s, v in live])))
        start = len(self._slug_at)
        self._reserve(start + len(live))
        self._vectors[start : start + len(live)] = vectors
        self._alive[start : start + len(live)] = True
        for offset, (slug, value) in enumerate(live):
            row = start + offset
            self._slug_at.append(slug)
            self._row_of[slug] = row
            self.lexical.add(row, terms(doc_text(slug, value)))

    def _reserve(self, size: int) -> None:
        if size <= len(self._vectors):
            return
        cap = max(size, len(self._vectors) + len(self._vectors) // 4, 1024)  # RSS: +25%
        grown = np.zeros((cap, self.embedder.dim), dtype=np.float32)
        grown[: len(self._vectors)] = self._vectors
        self._vectors = grown
        alive = np.zeros(cap, dtype=bool)
        alive[: len(self._alive)] = self._alive
        self._alive = alive

    def _drop(self, slug: str) -> None:
        row = self._row_of.pop(slug, None)
        if row is None:
            return
        self._alive[row] = False
        self._slug_at[row] = None
        self.lexical.remove(row)
        self._dead += 1
        if self._dead > 1024 and self._dead > len(self._row_of):
            self.lexical.compact()
            self._dead = 0

    # -- queries ---------------------------------------------------------------------

    def _size(self) -> int:
        return len(self._slug_at)

    def _hit(self, row: int, score: float, sim: float, lex: int | None, den: int | None) -> Hit:
        slug = self._slug_at[row] or ""
        k = self.heads[slug]
        return Hit(
            slug, k.value or "", score, k.created_at, k.version or k.event_id, lex, den, sim,
            k.trust, k.role, k.valid_from, k.valid_until,
        )  # fmt: skip

    def _mask(self, n: int, skip: frozenset[str]) -> np.ndarray:
        alive = self._alive[:n]
        if skip:
            alive = alive.copy()
            for slug in skip:
                if (row := self._row_of.get(slug)) is not None and row < n:
                    alive[row] = False
        return alive

    def rank(
        self, query: str, limit: int, mode: str = "fused", skip: frozenset[str] = frozenset()
    ) -> list[Hit]:
        """The `limit` live memories best for `query`, best first; `skip`: slugs left out
        (facts not valid now, when asked).

        mode: "fused" (the default), "lexical", "dense" or "rrf" (for evaluation). Ties go to the
        newer memory, then the slug, so the order is stable for the same index."""
        n = self._size()
        if not n or limit < 1 or not len(self):
            return []
        alive = self._mask(n, skip)
        lex_scores = self.lexical.scores(terms(query), n)
        qv = self.embedder.embed([query])[0]
        sims = self._vectors[:n] @ qv
        depth = max(fusion.DEPTH, limit)
        lex_rows = fusion.top(lex_scores, alive & (lex_scores > 0), depth)
        den_rows = fusion.top(sims, alive, depth)
        lex_rank = {r: i + 1 for i, r in enumerate(lex_rows.tolist())}
        den_rank = {r: i + 1 for i, r in enumerate(den_rows.tolist())}
        if mode == "lexical":
            scored = {r: float(lex_scores[r]) for r in lex_rows.tolist()}
        elif mode == "dense":
            scored = {r: float(sims[r]) for r in den_rows.tolist()}
        elif mode == "rrf":
            scored = fusion.rrf([(lex_rows, 1.0), (den_rows, 0.5)], fusion.K)
        else:
            scored = fusion.weighted(lex_rows, den_rows, lex_scores, sims)
        hits = [
            self._hit(r, s, float(sims[r]), lex_rank.get(r), den_rank.get(r))
            for r, s in scored.items()
        ]
        hits.sort(key=lambda h: (-h.score, -h.created_at, h.slug))
        return hits[:limit]

    def similar(self, slug: str, value: str, limit: int, threshold: float) -> list[Hit]:
        """Live memories (`slug` itself excluded) whose vector's cosine with the one this
        memory would have is at least `threshold`."""
        n = self._size()
        if not n or not len(self):
            return []
        sims = self._vectors[:n] @ self.embedder.embed([doc_text(slug, value)])[0]
        rows = fusion.top(sims, self._alive[:n] & (sims >= threshold), limit + 1)
        hits = [self._hit(r, float(sims[r]), float(sims[r]), None, None) for r in rows.tolist()]
        return [h for h in hits if h.slug != slug][:limit]
