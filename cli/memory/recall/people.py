"""The people `core` names, so that a memory that calls someone by one name is found by
another: core says "Mel is my sister Melanie", a memory says "Mel called about the trip",
and "what did my sister say about the trip?" or "... Melanie ..." finds it. Resolved when
a memory is indexed (its BM25 text gains the person's other names and relation), on this
machine, from core's live profile only (`engram.live`: a denied or cleared profile names
nobody).

Core is free text (`engram mem set core "..."`), so people are read from it by a few fixed
patterns, sentence by sentence, and nothing else (no model):
- a relation next to a name: "my sister Melanie", "my sister is Melanie", "Melanie, my
  sister", "Melanie (my sister)", "Dana Okafor: my manager", "Mel is my older sister";
- two names for one person: "Melanie (Mel)", "Mel is Melanie", "Robert, aka Bob",
  "Robert goes by Bob", "Mel is short for Melanie".
A name is a run of capitalised words; a run that ends in 's ("Melanie's husband") is
someone's, not a name for them, and joins nothing. A name stands next to at most one
relation (the one before it wins: "my sister, Melanie, my brother, Tom" is two people).
Whatever a sentence ties together is one person: their names and relations. A word that
names two of them (two Alexes) resolves to neither; a month or weekday name is never a key
("June is my sister" would add her to every memory dated in June).

A memory mentions a person when a capitalised word of its value is one of the person's
name words; what is added is the person's names and relations that the memory does not
already say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cli.memory.recall.text import MONTHS, STOP_WORDS
from cli.memory.recall.when import WEEKDAYS

RELATIONS = frozenset(
    """
    sister brother sibling mother mom mum mommy mama father dad daddy papa parent parents
    son daughter child kid stepson stepdaughter stepmother stepfather stepmom stepdad
    wife husband partner spouse fiance fiancee fiancé fiancée girlfriend boyfriend ex
    grandmother grandma granny grandfather grandpa grandson granddaughter grandchild
    aunt uncle cousin niece nephew godmother godfather godson goddaughter
    sister-in-law brother-in-law mother-in-law father-in-law son-in-law daughter-in-law
    friend roommate flatmate housemate neighbour neighbor boss manager colleague coworker
    co-worker teammate mentor mentee student teacher tutor coach doctor dentist therapist
    landlord landlady assistant client owner user pet dog cat puppy kitten
    """.split()  # noqa: SIM905
)
_MODIFIERS = r"(?:(?:older|elder|younger|little|big|baby|twin|best|old|new|former|late|step)\s+)*"
_LONGEST_FIRST = sorted((re.escape(r) for r in RELATIONS), key=len, reverse=True)
_RELATION = re.compile(rf"\b{_MODIFIERS}(?:{'|'.join(_LONGEST_FIRST)})\b", re.IGNORECASE)
_WORD = r"[A-Z][\w'’-]*[a-z][\w'’-]*"
_RUN = re.compile(rf"\b{_WORD}(?:[ \t]+{_WORD})*")
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+|\s+[-–—]\s+(?=[A-Z])")
_POSSESSIVE = re.compile(r"['’]s?$")
# what may stand between two parts of one mention (compared lower-cased, stripped)
_NAME_THEN_RELATION = re.compile(
    r"^(?:,|:|\(|[-–—=]|is|was)(?:\s*(?:is|was))?"
    r"(?:\s*(?:my|our|his|her|their|the|a|an|user's|owner's))?$"
)
_RELATION_THEN_NAME = re.compile(r"^(?:,|:|\(|is|was|,?\s*named|,?\s*called)?$")
_ALIAS = re.compile(
    r"^(?:\(|,?\s*(?:is|aka|a\.k\.a\.|also known as|known as|called|goes by|who goes by"
    r"|nicknamed|is short for|short for)\s*,?\s*\(?)$"
)
_NOT_NAMES = frozenset(w.lower() for w in MONTHS) | frozenset(WEEKDAYS)


@dataclass(frozen=True)
class Person:
    names: tuple[str, ...]  # as core writes them ("Melanie Chen", "Mel")
    relations: tuple[str, ...]  # lower-cased ("older sister")

    def words(self) -> list[str]:
        return [w for n in self.names for w in n.split()] + list(self.relations)


def _name_words(run: str) -> list[str]:
    return [w for w in run.split() if w.lower() not in STOP_WORDS and w.lower() not in RELATIONS]


def _clean(run: str) -> str:
    """A run without the stop or relation words it starts with ("My Melanie" -> "Melanie")."""
    words = run.split()
    while words and (words[0].lower() in STOP_WORDS or words[0].lower() in RELATIONS):
        words.pop(0)
    return " ".join(words)


def _sentence_people(sentence: str) -> list[Person]:
    # the parts of the sentence in order: ("name", text, start, end) and ("rel", ...)
    parts: list[tuple[str, str, int, int]] = []
    taken = [False] * len(sentence)
    for m in _RELATION.finditer(sentence):
        parts.append(("rel", m[0].lower(), m.start(), m.end()))
        taken[m.start() : m.end()] = [True] * (m.end() - m.start())
    for m in _RUN.finditer(sentence):
        # a run may swallow a capitalised relation ("Sister Melanie"): keep what is a name
        cleaned = _clean(m[0])
        start = m.end() - len(cleaned)
        if not cleaned or any(taken[start : m.end()]):
            continue
        kind = "owned" if _POSSESSIVE.search(cleaned) else "name"
        parts.append((kind, cleaned, start, m.end()))
    parts.sort(key=lambda p: p[2])
    parent = list(range(len(parts)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:
        parent[find(i)] = find(j)

    claimed: set[int] = set()
    for i in range(len(parts) - 1):
        (ka, _, _, a_end), (kb, _, b_start, _) = parts[i], parts[i + 1]
        gap = sentence[a_end:b_start].strip().lower()
        if ka == "rel" and kb == "name" and _RELATION_THEN_NAME.match(gap):
            join(i, i + 1)
            claimed.add(i + 1)
    for i in range(len(parts) - 1):
        (ka, _, _, a_end), (kb, _, b_start, _) = parts[i], parts[i + 1]
        gap = sentence[a_end:b_start].strip().lower()
        if ka != "name":
            continue
        related = kb == "rel" and i not in claimed and _NAME_THEN_RELATION.match(gap)
        if related or (kb == "name" and _ALIAS.match(gap)):
            join(i, i + 1)
    groups: dict[int, list[int]] = {}
    for i, (kind, *_rest) in enumerate(parts):
        if kind != "owned":
            groups.setdefault(find(i), []).append(i)
    people = []
    for members in groups.values():
        names = tuple(dict.fromkeys(parts[i][1] for i in members if parts[i][0] == "name"))
        relations = tuple(dict.fromkeys(parts[i][1] for i in members if parts[i][0] == "rel"))
        if names and (relations or len(names) > 1):
            people.append(Person(names, relations))
    return people


class People:
    """Core's people, and what a memory that mentions one of them is indexed with."""

    def __init__(self, profile: str | None = None) -> None:
        found = [p for s in _SENTENCE.split(profile or "") for p in _sentence_people(s)]
        by_key: dict[str, Person | None] = {}
        for person in found:
            for name in person.names:
                for word in _name_words(name):
                    key = word.lower()
                    if key in _NOT_NAMES:
                        continue
                    # two people share the word: it names neither
                    by_key[key] = person if by_key.get(key, person) == person else None
        self._by_key = {k: p for k, p in by_key.items() if p is not None}

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, People) and self._by_key == other._by_key

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._by_key)))

    def changed(self, other: People) -> frozenset[str]:
        """The name words that resolve differently in `other` than here."""
        return frozenset(
            k
            for k in self._by_key.keys() | other._by_key.keys()
            if self._by_key.get(k) != other._by_key.get(k)
        )

    def mentioned(self, value: str) -> set[str]:
        """The name words of core's people that `value` says (capitalised)."""
        return names_in(value) & self._by_key.keys() if self._by_key else set()

    def resolved(self, value: str) -> str:
        """What `value`'s people are besides what it calls them, as words ("" if none)."""
        said = self.mentioned(value)
        if not said:
            return ""
        have = {w.lower() for w in _PLAIN_WORD.findall(value)}
        out: list[str] = []
        for person in dict.fromkeys(self._by_key[k] for k in sorted(said)):
            out += [w for w in person.words() if w.lower() not in have]
        return " ".join(dict.fromkeys(out))


def names_in(value: str) -> set[str]:
    """The capitalised words of `value` as name keys: lower-cased, an 's left out."""
    return {_POSSESSIVE.sub("", w.lower()) for w in _CAPITALISED.findall(value)}


_CAPITALISED = re.compile(rf"\b{_WORD}")
_PLAIN_WORD = re.compile(r"[^\W_]+")
