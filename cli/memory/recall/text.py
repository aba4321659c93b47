"""Words for the lexical ranker: lower-cased, split on anything that is not a letter or a
digit, English stop words dropped, Snowball-stemmed (PyStemmer: the Snowball project's own
C stemmers, so "prefers", "preferred" and "preference" meet at "prefer").

Stems are memoised per process: a memory set repeats its words, and the stemmer is then
paid once per distinct word, not once per occurrence.

`normalise` writes ISO dates out ("2021-03-05" -> "5 March 2021") in everything recall
ranks, memories and questions alike: an agent writes ISO dates, a person asks "in March
2021", and the month's name is then a word both share (for BM25 and for the embeddings).
"""

from __future__ import annotations

import re
from functools import lru_cache

import Stemmer

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
_STEMMER = Stemmer.Stemmer("english")

# A short list: questions carry these ("which", "does", "the"), memories mostly do not, so
# keeping them would only add noise to the scores.
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your
    yours yourself yourselves mem
    """.split()  # noqa: SIM905
)


@lru_cache(maxsize=1 << 18)
def stem(word: str) -> str:
    return _STEMMER.stemWord(word)


def _written_out(m: re.Match[str]) -> str:
    month, day = int(m[2]), int(m[3])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return m[0]
    return f"{day} {MONTHS[month - 1]} {m[1]}"


def normalise(text: str) -> str:
    """`text` with its ISO dates (YYYY-MM-DD) written out as "D Month YYYY"."""
    return _ISO_DATE.sub(_written_out, text) if "-" in text else text


def terms(text: str) -> list[str]:
    """The stemmed terms of `text` (normalised), in order, stop words dropped (repeats
    kept: BM25 counts them)."""
    return [stem(w) for w in _WORD.findall(normalise(text).lower()) if w not in STOP_WORDS]


def slug_words(slug: str) -> str:
    """`mem/people/alice-chen/editor` -> `people alice chen editor`: a slug is the agent's
    own name for the memory, so its words are worth indexing with the value."""
    return " ".join(re.split(r"[/_-]+", slug.removeprefix("mem/")))
