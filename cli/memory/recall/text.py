"""Words for the lexical ranker: lower-cased, split on anything that is not a letter or a
digit, English stop words dropped, Snowball-stemmed (PyStemmer: the Snowball project's own
C stemmers, so "prefers", "preferred" and "preference" meet at "prefer").

Stems are memoised per process: a memory set repeats its words, and the stemmer is then
paid once per distinct word, not once per occurrence.
"""

from __future__ import annotations

import re
from functools import lru_cache

import Stemmer

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
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


def terms(text: str) -> list[str]:
    """The stemmed terms of `text`, in order, stop words dropped (repeats kept: BM25
    counts them)."""
    return [stem(w) for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


def slug_words(slug: str) -> str:
    """`mem/people/alice-chen/editor` -> `people alice chen editor`: a slug is the agent's
    own name for the memory, so its words are worth indexing with the value."""
    return " ".join(re.split(r"[/_-]+", slug.removeprefix("mem/")))
