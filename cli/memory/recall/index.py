"""The recall index of one agent's memory: what each slug reads as (slug -> the event that
decided it, created_at, the live value with its version, trust and validity), a BM25 index
of the live values' words and a matrix of their unit vectors, row by row.

Pure and in memory: `cli.memory.recall.cache` stores it, `cli.memory.recall.updater` feeds
it from the relays. What is live is decided by `engram.live` (the one rule of every read:
tombstones, owner verdicts, forgets), in the updater; the index holds its answer.

What is ranked: BM25 over the slug's words and the value together (`doc_text`); a memory's
vector is the normalised sum of its slug words' unit vector and its value's
(`doc_vectors`): the slug is the memory's title, the agent's own name for it, and weighs
as much as the value however long the value is (a mean over the tokens of both let a long
value drown it). Chosen on the tuning split of `python -m bench recall quality`.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from cli.memory.recall import fusion
from cli.memory.recall.dense import Embedder
from cli.memory.recall.lexical import Lexical, Terms
from cli.memory.recall.people import People, names_in
from cli.memory.recall.text import STOP_WORDS, normalise, slug_words, terms
from cli.memory.recall.when import resolved
from engram import CORE_SLUG, beats


@dataclass(frozen=True, slots=True)
class Known:
    """What the index knows of a slug: the event that decided it (a head, or an owner
    verdict: enough to apply the head rule to a newer event), and the value when the slug
    reads as live (None: removed, denied, forgotten; core's is its profile, which is never
    ranked: its people resolve the memories' names, `people`). `version` is the live
    version's name (`log`'s id), with its trust, author role and validity."""

    event_id: str
    created_at: int
    value: str | None
    version: str = ""
    trust: str | None = None
    role: str = "agent"
    valid_from: int | None = None
    valid_until: int | None = None


@dataclass(frozen=True, slots=True)
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


def doc_text(
    slug: str, value: str, created_at: int | None = None, people: People | None = None
) -> str:
    """What BM25 indexes of a memory: its slug's words, its value, (given its created_at)
    the dates its relative expressions stand for (`when.resolved`) and (given core's
    people) who the people it names are (`People.resolved`)."""
    text = f"{slug_words(slug)}. {value}"
    if created_at is not None and (dates := resolved(slug, value, created_at)):
        text += f" ({dates})"
    if people and (who := people.resolved(value)):
        text += f" ({who})"
    return text


def ranked(slug: str, k: Known) -> bool:
    """Whether the index ranks this entry: a live memory (core never is)."""
    return k.value is not None and slug != CORE_SLUG


_NUMERIC = re.compile(r"^\d+$")


def title(slug: str) -> str:
    """A slug's words as the memory's title, numbers left out: `mem/chat/2023-05-21/014`
    is filed by date and turn, which say nothing of what the memory is about."""
    return " ".join(w for w in slug_words(slug).split() if not _NUMERIC.match(w))


def doc_vectors(embedder: Embedder, memories: list[tuple[str, str]]) -> np.ndarray:
    """Unit vectors of (slug, value) pairs: slug words and value weigh alike."""
    if not memories:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    titles = embedder.embed([title(s) for s, _ in memories])
    titles += embedder.embed([normalise(said(s, v)) for s, v in memories])
    norms = np.linalg.norm(titles, axis=1, keepdims=True)
    np.divide(titles, norms, out=titles, where=norms > 0)
    return titles


def query_vector(embedder: Embedder, query: str, speakers: Iterable[str] = ()) -> np.ndarray:
    """The question's vector, the speakers' names left out (`unnamed`)."""
    return embedder.embed([normalise(unnamed(query, speakers))])[0]


_WORDS = re.compile(r"[\w'’-]+")


def unnamed(query: str, speakers: Iterable[str]) -> str:
    """`query` without the names of the memory's speakers (and their 's): in a memory of
    conversation turns (`Ana: ...`) a speaker's name is on half the memories, so it says
    nothing of what a memory is about, and its vector in a static model pulls every turn
    of that speaker alike; BM25 still matches it. Other names are kept (they are what a
    memory is about)."""
    names = set(speakers)
    if not names:
        return query

    def drop(m: re.Match[str]) -> str:
        word = m[0].lower()
        return "" if word in names or (word.endswith("'s") and word[:-2] in names) else m[0]

    out = _WORDS.sub(drop, query)
    return out if out.strip() else query


def said(slug: str, value: str) -> str:
    """What a memory says, a speaker's label (`Ana: `) left out."""
    m = _SPEAKER.match(value) if group_of(slug) is not None else None
    return value[m.end() :] if m else value


def speaker(slug: str, value: str) -> str | None:
    """The speaker of a conversation turn, lower-cased: the label (`Ana: ...`) that
    starts a numbered entry (`group_of`); a named fact that starts "Allergy: ..." has
    none."""
    m = _SPEAKER.match(value) if group_of(slug) is not None else None
    return m[1].lower() if m else None


BLOCK = 8192  # rows of vectors per block
SIMILAR_CANDIDATES = 30  # memories `similar` compares value to value
BULK = 32  # slugs added to one group in one put past which the group is sorted again
_NAME = re.compile(r"\b[A-Z][\w'’-]*[a-z][\w'’-]*\b")
_SPEAKER = re.compile(r"^\s*([A-Z][\w'’-]*)\s*:")
_LINK = re.compile(r"\[\[([^\]\s|]+)(?:\|[^\]]*)?\]\]")
_ENTRY = re.compile(r"^[a-z]{0,2}\d+$")


def group_of(slug: str) -> str | None:
    """The sequence a memory is an entry of: its slug's parent when its own name is a
    number (`mem/chat/2023-05-21/014`: turn 14 of that session; `log/t3`), else None:
    named siblings (`mem/people/dana/editor`, `.../city`) are separate facts, not a
    conversation read in order."""
    parent, _, name = slug.rpartition("/")
    return parent if parent and _ENTRY.match(name) else None


def entities(slug: str, value: str) -> set[str]:
    """What a memory names that a question may not: its capitalised words (people,
    places, things), a speaker's label and stop words left out, lower-cased."""
    who = speaker(slug, value)
    return {
        w.lower() for w in _NAME.findall(value) if w.lower() not in STOP_WORDS and w.lower() != who
    }


def links(value: str) -> list[str]:
    """The slugs a memory links to (`[[mem/people/dana]]`)."""
    return [m if m.startswith("mem/") or m == "core" else f"mem/{m}" for m in _LINK.findall(value)]


class RecallIndex:
    """Vectors are kept as the cache keeps them, int8 with a float32 scale per row (a
    quarter of float32's memory, and a fresh index ranks exactly as a cached one), in
    blocks of BLOCK rows: growing never copies them, and a query widens one block at a
    time into a scratch buffer for the product."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.heads: dict[str, Known] = {}
        self.lexical = Lexical()
        self._row_of: dict[str, int] = {}
        self._slug_at: list[str | None] = []
        self._blocks: list[np.ndarray] = []  # int8 (BLOCK, dim)
        self._scales = np.zeros(0, dtype=np.float32)
        self._alive = np.zeros(0, dtype=bool)
        self._scratch: np.ndarray | None = None
        self._dead = 0
        # each live memory's neighbours in its group (slug order), -1 for none: its own
        # context, which ranking reads (`fusion.context`)
        self._groups: dict[str, list[str]] = {}
        self._speakers: Counter[str] = Counter()  # conversation turns' speakers
        self.version = 0  # counts changes: a save read in a thread checks it
        self._prev = np.zeros(0, dtype=np.int64)
        self._next = np.zeros(0, dtype=np.int64)
        self._links: fusion.Links | None = None  # made from them for queries
        self.people = People()  # core's, as its live profile says (`_core`)

    # -- state -----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._row_of)

    def knows(self, event_id: str) -> bool:
        """Whether `event_id` is the head of some slug here (verified when it arrived)."""
        return event_id in self._ids

    def created_at_of(self, event_id: str) -> int | None:
        """The created_at of the head `event_id` as it was verified, or None."""
        return self._ids.get(event_id)

    @property
    def _ids(self) -> dict[str, int]:
        ids = getattr(self, "_id_at", None)
        if ids is None:
            ids = self._id_at = {k.event_id: k.created_at for k in self.heads.values()}
        return ids

    def quantized(self, slugs: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """int8 vectors and scales of these live slugs, in this order (for the cache)."""
        rows = np.fromiter((self._row_of[s] for s in slugs), dtype=np.int64, count=len(slugs))
        q = np.zeros((len(rows), self.embedder.dim), dtype=np.int8)
        for b, block in enumerate(self._blocks):
            mine = (rows // BLOCK) == b
            if mine.any():
                q[mine] = block[rows[mine] % BLOCK]
        return q, self._scales[rows]

    def terms_of(self, slugs: list[str]) -> Terms:
        """The lexical terms of these live slugs, in this order (for the cache)."""
        return self.lexical.export([self._row_of[s] for s in slugs])

    # -- updates ---------------------------------------------------------------------

    def apply_known(self, entries: Iterable[tuple[str, Known]]) -> int:
        """Take every entry that beats what the index holds for its slug (spec: *Head
        selection*; a write this process made, or a test's); returns how many changed."""
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

    def put(
        self,
        known: dict[str, Known],
        vectors: tuple[np.ndarray, np.ndarray] | None = None,
        terms_of_live: Terms | None = None,
    ) -> None:
        """Set these slugs' heads as given (no head rule: the caller applied it); `vectors`
        (int8 rows and scales) and `terms_of_live`, when given (the cache), are the live
        ones' in the order of `known`'s live entries."""
        if not known:
            return
        self.version += 1
        again = self._core(known[CORE_SLUG]) if CORE_SLUG in known else []
        ids = self._ids
        for slug, k in known.items():
            old = self.heads.get(slug)
            if old is not None:
                ids.pop(old.event_id, None)
                self._drop(slug)
            self.heads[slug] = k
            ids[k.event_id] = k.created_at
        live = [(s, k.value) for s, k in known.items() if ranked(s, k) and k.value is not None]
        if again:  # core's people changed: memories that name one are indexed again
            self._reindex([s for s in again if s not in known])
        if not live:
            return
        q, scales = quantize(doc_vectors(self.embedder, live)) if vectors is None else vectors
        start = len(self._slug_at)
        self._reserve(start + len(live))
        done = 0
        while done < len(live):  # a block at a time
            b, at = divmod(start + done, BLOCK)
            take = min(BLOCK - at, len(live) - done)
            self._blocks[b][at : at + take] = q[done : done + take]
            done += take
        self._scales[start : start + len(live)] = scales
        self._alive[start : start + len(live)] = True
        for offset, (slug, _) in enumerate(live):
            self._slug_at.append(slug)
            self._row_of[slug] = start + offset
        self._link([slug for slug, _ in live])
        self._speakers.update(who for slug, value in live if (who := speaker(slug, value)))
        if terms_of_live is not None:
            self.lexical.load(list(range(start, start + len(live))), terms_of_live)
            return
        docs = [terms(doc_text(s, v, known[s].created_at, self.people)) for s, v in live]
        self.lexical.add_many(list(range(start, start + len(live))), docs)

    def _core(self, k: Known) -> list[str]:
        """Take core's new head: its people (none unless it reads as live); the live
        memories that name a person whose resolution changed."""
        people = People(k.value)
        changed = self.people.changed(people)
        self.people = people
        if not changed:
            return []
        return [
            slug
            for slug in self._row_of
            if (value := self.heads[slug].value) is not None
            and not changed.isdisjoint(names_in(value))
        ]

    def _reindex(self, slugs: list[str]) -> None:
        """Index these live memories again (their words; their vectors are kept)."""
        if not slugs:
            return
        vectors = self.quantized(slugs)
        self.put({s: self.heads[s] for s in slugs}, vectors)

    def _context(self, n: int) -> fusion.Links:
        """The rows that have neighbours, with their neighbours one and two away (n for
        none), remade after a change of the links: a query then gathers over those rows
        only (none, in a memory of named facts)."""
        if self._links is None or self._links.size != n:
            rows = np.flatnonzero((self._prev[:n] >= 0) | (self._next[:n] >= 0))

            def hop(a: np.ndarray, b: np.ndarray) -> np.ndarray:
                return np.where(a >= 0, b[np.maximum(a, 0)], -1)

            p, q = self._prev[rows], self._next[rows]
            ends = [p, q, hop(p, self._prev), hop(q, self._next)]
            self._links = fusion.Links(
                n, rows.astype(np.int32), *(np.where(e >= 0, e, n).astype(np.int32) for e in ends)
            )
        return self._links

    def _relink(self, group: list[str], at: int) -> None:
        """Set the links of `group[at]` and its two neighbours."""
        row_of = self._row_of
        self._links = None
        for i in range(max(at - 1, 0), min(at + 2, len(group))):
            row = row_of[group[i]]
            self._prev[row] = row_of[group[i - 1]] if i > 0 else -1
            self._next[row] = row_of[group[i + 1]] if i + 1 < len(group) else -1

    def _link(self, slugs: list[str]) -> None:
        """Put newly live slugs among their groups' neighbours."""
        by_group: dict[str, list[str]] = {}
        for slug in slugs:
            if (name := group_of(slug)) is not None:
                by_group.setdefault(name, []).append(slug)
        for name, added in by_group.items():
            group = self._groups.setdefault(name, [])
            if len(added) <= BULK:
                for slug in added:
                    at = bisect.bisect_left(group, slug)
                    group.insert(at, slug)
                    self._relink(group, at)
                continue
            self._links = None
            group.extend(added)
            group.sort()
            rows = np.fromiter((self._row_of[s] for s in group), np.int64, len(group))
            self._prev[rows] = np.concatenate(([-1], rows[:-1]))
            self._next[rows] = np.concatenate((rows[1:], [-1]))

    def _unlink(self, slug: str) -> None:
        name = group_of(slug)
        group = self._groups.get(name) if name is not None else None
        if not group:
            return
        at = bisect.bisect_left(group, slug)
        if at < len(group) and group[at] == slug:
            del group[at]
            if at < len(group):
                self._relink(group, at)
            elif at > 0:
                self._relink(group, at - 1)

    def _reserve(self, size: int) -> None:
        while len(self._blocks) * BLOCK < size:
            self._blocks.append(np.zeros((BLOCK, self.embedder.dim), dtype=np.int8))
        if size > len(self._scales):
            cap = len(self._blocks) * BLOCK
            more = cap - len(self._scales)
            self._scales = np.concatenate([self._scales, np.zeros(more, "f4")])
            self._alive = np.concatenate([self._alive, np.zeros(more, bool)])
            self._prev = np.concatenate([self._prev, np.full(more, -1, np.int64)])
            self._next = np.concatenate([self._next, np.full(more, -1, np.int64)])

    def _sims(self, qv: np.ndarray, n: int) -> np.ndarray:
        """Cosine of `qv` with the first `n` rows."""
        out = np.empty(n, dtype=np.float32)
        if self._scratch is None:
            self._scratch = np.empty((BLOCK, self.embedder.dim), dtype=np.float32)
        for b in range((n + BLOCK - 1) // BLOCK):
            k = min(BLOCK, n - b * BLOCK)
            wide = self._scratch[:k]
            np.copyto(wide, self._blocks[b][:k], casting="unsafe")
            np.matmul(wide, qv, out=out[b * BLOCK : b * BLOCK + k])
        out *= self._scales[:n]
        return out

    def _drop(self, slug: str) -> None:
        if slug not in self._row_of:
            return
        self._unlink(slug)
        if (who := speaker(slug, self.heads[slug].value or "")) is not None:
            self._speakers[who] -= 1
            if self._speakers[who] <= 0:
                del self._speakers[who]
        row = self._row_of.pop(slug)
        self._prev[row] = self._next[row] = -1
        self._links = None
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
        qv = query_vector(self.embedder, query, self._speakers)
        sims = self._sims(qv, n)
        if mode == "fused":  # each memory read with its neighbours
            links = self._context(n)
            lex_scores = fusion.with_context(lex_scores, links, fusion.CONTEXT_LEXICAL)
            sims = fusion.with_context(sims, links, fusion.CONTEXT_DENSE)
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
            share = fusion.share_for(self.embedder.name)
            scored = fusion.weighted(lex_rows, den_rows, lex_scores, sims, share)
            if fusion.HOP_WEIGHT:
                self._second_hop(query, scored, alive, n)
        hits = [
            self._hit(r, s, float(sims[r]), lex_rank.get(r), den_rank.get(r))
            for r, s in scored.items()
        ]
        hits.sort(key=lambda h: (-h.score, -h.created_at, h.slug))
        if mode == "fused" and fusion.DEDUPE:  # the same words again say nothing new
            seen: set[str] = set()
            first, again = [], []
            for h in hits:
                (again if h.value in seen else first).append(h)
                seen.add(h.value)
            floor = first[-1].score if first else 0.0  # scores stay best first
            hits = first + [replace(h, score=min(h.score, floor)) for h in again]
        return hits[:limit]

    def _second_hop(self, query: str, scored: dict[int, float], alive: np.ndarray, n: int) -> None:
        """Add to `scored` what the best first-hop memories point to: the memories that
        name the people, places and things they name (and that the question does not),
        scored by BM25 over those names, and the memories they link to."""
        best = sorted(scored, key=lambda r: -scored[r])[: fusion.HOP_FROM]
        asked = set(terms(query))
        names: list[str] = []
        linked: list[int] = []
        for row in best:
            slug = self._slug_at[row]
            value = self.heads[slug].value if slug is not None else None
            if not value:
                continue
            names += [w for w in entities(slug, value) if w not in asked]
            linked += [r for s in links(value) if (r := self._row_of.get(s)) is not None]
        rare = max(fusion.HOP_RARE, fusion.HOP_RARE_SHARE * len(self.lexical))
        found = [t for t in terms(" ".join(names)) if self.lexical.df(t) <= rare]
        hop = self.lexical.scores(found, n) if found else None
        if hop is not None and (peak := float(hop.max())) > 0:
            for r in fusion.top(hop, alive & (hop > 0), fusion.DEPTH).tolist():
                scored[r] = scored.get(r, 0.0) + fusion.HOP_WEIGHT * float(hop[r]) / peak
        for r in linked:
            if alive[r]:
                scored[r] = scored.get(r, 0.0) + fusion.HOP_WEIGHT

    def similar(self, slug: str, value: str, limit: int, threshold: float) -> list[Hit]:
        """Live memories (`slug` itself excluded) whose value says what `value` says: the
        cosine of the two values' vectors (slugs left out: a near-duplicate is the same
        fact under another name) is at least `threshold`. Candidates are the value's
        best `SIMILAR_CANDIDATES` by recall's own ranking; their values are embedded now."""
        found = [h for h in self.rank(value, SIMILAR_CANDIDATES + 1) if h.slug != slug]
        if not found:
            return []
        vectors = self.embedder.embed([normalise(value)] + [normalise(h.value) for h in found])
        sims = (vectors[1:] @ vectors[0]).tolist()
        near = [
            replace(h, score=s, similarity=s, lexical_rank=None, dense_rank=None)
            for h, s in zip(found, sims, strict=True)
            if s >= threshold
        ]
        near.sort(key=lambda h: (-h.score, -h.created_at, h.slug))
        return near[:limit]
