"""The conversational recall set: long multi-session dialogues between two people, each
turn stored as one memory the way an agent keeps a conversation, and questions of the four
kinds people ask of such a memory. Generated deterministically (no model involved).

Each conversation is one agent's memory (its own index, as in use): two speakers, about
twenty sessions a week or three apart, each dated, of twenty to thirty turns. A turn is a
memory `mem/chat/<session date>/<turn>` whose value is `Name: what they said`, created at
the session's time. Turns are written as people talk: short, full of small talk, with
pronouns and first names for people met earlier ("She loved it"), relative dates ("I
signed up yesterday", "last Tuesday", "next month"), facts that change (a new job, a move)
and facts implied rather than said ("I go to Mass every Sunday"). Questions use other
words than the turns they need:

- `multi`: needs two or more turns: everything one person took up over the months, two
  facts joined through a person ("where does the friend Ana met at climbing live now?"),
  the two speakers' pets, a job before and after;
- `time`: about when something happened, asked as "when did ...?", or by the date
  ("what did Ana do on 20 May 2023?") where the turn says "yesterday";
- `implied`: needs knowledge beyond the memories (a fact implied: "would Ana be
  considered religious?" from "I go to Mass every Sunday");
- `single`: one turn (a pet's name, where someone works now).

`needed` holds every turn the answer rests on (all@k: all in the top k; any@k: one).
`held_out(conversation)` splits by conversation, from the seed, before anything is
measured: tune on the other half only. `build()` checks the set against `DIGEST`, frozen
before recall was ever measured on it.
"""

from __future__ import annotations

import calendar
import datetime as dt
import hashlib
import random
from dataclasses import dataclass, field

SEED = 49
CONVERSATIONS = 40
KINDS = ("multi", "time", "implied", "single")

SPEAKERS = [
    ("Caroline", "she"), ("Melanie", "she"), ("Jolene", "she"), ("Deborah", "she"),
    ("Audrey", "she"), ("Maria", "she"), ("Tanya", "she"), ("Gina", "she"), ("Nadia", "she"),
    ("Lena", "she"), ("Rosa", "she"), ("Ingrid", "she"), ("Priya", "she"), ("Hannah", "she"),
    ("Jon", "he"), ("Andrew", "he"), ("Calvin", "he"), ("Dave", "he"), ("Evan", "he"),
    ("Sam", "he"), ("Tim", "he"), ("John", "he"), ("Marcus", "he"), ("Omar", "he"),
    ("Felix", "he"), ("Diego", "he"), ("Kenji", "he"), ("Tomas", "he"), ("Victor", "he"),
]  # fmt: skip
OTHERS = [
    ("Maya", "she"), ("Jordan", "she"), ("Elise", "she"), ("Bianca", "she"), ("Greta", "she"),
    ("Lucia", "she"), ("Nora", "she"), ("Tessa", "she"), ("Zoe", "she"), ("Ruth", "she"),
    ("Ben", "he"), ("Leo", "he"), ("Mateo", "he"), ("Noah", "he"), ("Oscar", "he"),
    ("Hugo", "he"), ("Ravi", "he"), ("Pete", "he"), ("Ivan", "he"), ("Karl", "he"),
]  # fmt: skip
RELATIONS = ("sister", "brother", "cousin", "neighbour", "coworker", "best friend", "aunt")
GENDERED = {"sister": "she", "brother": "he", "aunt": "she"}
POSSESSIVE = {"she": "her", "he": "his"}
OBJECT = {"she": "her", "he": "him"}

CITIES = [
    "Denver", "Portland", "Austin", "Boston", "Seattle", "Chicago", "Toronto", "Dublin",
    "Lisbon", "Madrid", "Berlin", "Vienna", "Prague", "Oslo", "Helsinki", "Melbourne",
]  # fmt: skip
ORGS = [
    "a small design studio", "the city hospital", "a logistics startup", "the public library",
    "a local bakery", "an insurance firm", "a marketing agency", "the high school",
    "a bike shop", "a law office", "a software company", "the botanical garden",
]  # fmt: skip
ROLES = [
    "nurse", "accountant", "graphic designer", "teacher", "barista", "paralegal",
    "software developer", "librarian", "sales manager", "electrician", "pharmacist", "chef",
]  # fmt: skip
PETS = [
    ("dog", "puppy"), ("cat", "kitten"), ("rabbit", "bunny"), ("parrot", "bird"),
    ("guinea pig", "guinea pig"), ("tortoise", "tortoise"),
]  # fmt: skip
PET_NAMES = ["Oscar", "Luna", "Biscuit", "Pepper", "Mochi", "Ziggy", "Clover", "Rufus", "Bean"]
BOOKS = [
    "Charlotte's Web", "The Night Circus", "Becoming", "Educated", "The Hobbit", "Dune",
    "Circe", "The Alchemist", "Atomic Habits", "Little Women", "Station Eleven", "Beloved",
]  # fmt: skip
TRIPS = [
    "Iceland", "Japan", "Morocco", "Peru", "Greece", "Vietnam", "Scotland", "Mexico",
    "Norway", "Portugal", "Kenya", "New Zealand",
]  # fmt: skip


@dataclass(frozen=True)
class Activity:
    """A pastime: how it is taken up (the event a time question asks about), how it is
    mentioned later (distractors), where friends are met at it."""

    name: str  # as a question names it
    start: tuple[str, ...]  # "{when}" is the relative date
    later: tuple[str, ...]
    place: str
    ask: str  # "When did {s} ...?"


ACTIVITIES = [
    Activity(
        "pottery",
        (
            "I signed up for a pottery class {when}! I've wanted to try it for ages.",
            "{when} I finally joined a pottery workshop downtown.",
        ),
        (
            "My pottery teacher says my bowls are getting less wonky.",
            "I made a little vase at the studio, glazing it next time.",
        ),
        "the pottery studio",
        "sign up for a pottery class",
    ),
    Activity(
        "rock climbing",
        (
            "I went bouldering for the first time {when}, my arms are still shaking.",
            "{when} I started climbing at the new gym near work.",
        ),
        (
            "Finally sent that purple route at the gym!",
            "Climbing twice a week now, my forearms are huge.",
        ),
        "the climbing gym",
        "start rock climbing",
    ),
    Activity(
        "painting",
        (
            "I painted a lake at sunrise {when}, it's hanging in the hallway now.",
            "{when} I picked up watercolours again after years.",
        ),
        (
            "I've been playing with bolder colours on the canvas lately.",
            "Another landscape done, this one is all greens.",
        ),
        "the art collective",
        "take up painting",
    ),
    Activity(
        "running",
        (
            "I ran a charity 5K for mental health {when}!",
            "{when} I joined a running club that meets at the park.",
        ),
        (
            "Shaved a minute off my 5K time this week.",
            "My knees complain, but the morning runs are worth it.",
        ),
        "the running club",
        "run the charity race",
    ),
    Activity(
        "swimming",
        (
            "I started swimming laps at the community pool {when}.",
            "{when} I took my first open-water swim in the lake, so cold!",
        ),
        (
            "Forty laps this morning, I'm getting faster in the water.",
            "The pool was packed but I still got my lengths in.",
        ),
        "the pool",
        "start swimming",
    ),
    Activity(
        "guitar",
        (
            "I bought a secondhand guitar {when} and I'm learning chords.",
            "{when} I had my first guitar lesson, my fingertips hurt.",
        ),
        (
            "I can almost play a whole song on the guitar now.",
            "Practising barre chords every evening, slowly getting there.",
        ),
        "the music school",
        "start learning guitar",
    ),
    Activity(
        "camping",
        (
            "We went camping in the mountains {when}, the stars were unreal.",
            "{when} we pitched a tent by the beach for a weekend.",
        ),
        (
            "We bought a new tent for the next trip into the forest.",
            "Roasting marshmallows by the fire is the kids' favourite part.",
        ),
        "the campsite",
        "go camping",
    ),
    Activity(
        "baking",
        (
            "I baked my first sourdough loaf {when}, it actually rose!",
            "{when} I took a pastry course and made croissants.",
        ),
        (
            "My starter is bubbling away on the counter again.",
            "Made cinnamon rolls for the neighbours this weekend.",
        ),
        "the baking course",
        "bake sourdough for the first time",
    ),
    Activity(
        "volunteering",
        (
            "I volunteered at the food bank {when}, sorting donations all morning.",
            "{when} I started helping at the animal shelter on Saturdays.",
        ),
        (
            "We packed three hundred meal boxes at the food bank.",
            "One of the shelter dogs finally got adopted, I cried.",
        ),
        "the food bank",
        "start volunteering",
    ),
    Activity(
        "chess",
        (
            "I joined a chess club {when}, lost every game but loved it.",
            "{when} I played in my first chess tournament.",
        ),
        (
            "Finally won a game with the Sicilian defence at the club.",
            "I've been doing chess puzzles on my phone every night.",
        ),
        "the chess club",
        "join a chess club",
    ),
]

# A fact implied, not said: the turn says something concrete, the question asks what it
# implies in other words (what the `implied` questions need).
IMPLIED = [
    (("I go to Mass every Sunday with my family.",
      "Church this morning was lovely, the choir sang my favourite hymn."),
     ("Would {s} be considered religious?", "Is faith important to {s}?")),
    (("I practise the cello for an hour every night.",
      "My cello teacher says my bowing has improved a lot."),
     ("Does {s} play a string instrument?", "Is {s} musical?")),
    (("I grew up in Stockholm and moved here when I was twelve.",
      "I miss the long summer nights back home in Stockholm."),
     ("Which country did {s} grow up in?", "Is {s} originally from Scandinavia?")),
    (("My son just turned six and he's obsessed with dinosaurs.",
      "Packed lunches for the twins again, they both want peanut butter."),
     ("Is {s} a parent?", "Does {s} have children?")),
    (("I'm looking into counseling programs, I want to help people like me.",
      "I'd love to work in mental health and support others one day."),
     ("What might {s} study at university?", "Which career is {s} likely to pursue?")),
    (("I get seasick even on a rowing boat on a calm lake.",
      "Ferries are the worst, I spend the whole crossing nauseous."),
     ("Would {s} enjoy a cruise holiday?", "Is {s} a good sailor?")),
    (("I collect old editions of Dr. Seuss and Roald Dahl for my nieces.",
      "Found a first printing of The Cat in the Hat at a flea market!"),
     ("Does {s} own children's books?", "Would {s} like a gift for a young reader?")),
    (("I ran my third marathon in October and I'm already training for the next.",
      "Did a twenty-mile long run this weekend, legs are fine."),
     ("Is {s} physically fit?", "Could {s} handle a hard endurance race?")),
    (("Anything with gluten makes me sick, so I bake my own bread.",
      "I have to check every label for wheat, it's exhausting."),
     ("Could {s} eat a regular pizza?", "Does {s} have a dietary restriction?")),
    (("I march at every climate rally and I vote in every local election.",
      "I spent the evening phone-banking for the council candidate."),
     ("Is {s} politically engaged?", "Does {s} care about politics?")),
    (("I haven't owned a car in ten years, the bike gets me everywhere.",
      "Cycled to work in the rain again, my panniers leaked."),
     ("How does {s} usually get around?", "Does {s} drive?")),
    (("I'm allergic to cats, even visiting my aunt's place is rough.",
      "Sneezed all evening at a friend's house, she has two cats."),
     ("Would {s} want to adopt a kitten?", "Can {s} be around pets comfortably?")),
    (("I've been sober for three years now, I don't miss it at all.",
      "Ordered a mocktail at the wedding, nobody even noticed."),
     ("Would {s} enjoy a wine tasting?", "Does {s} drink alcohol?")),
    (("I work night shifts in the emergency room this month.",
      "Slept until three in the afternoon after the shift."),
     ("Does {s} work in healthcare?", "Is {s} a morning person these days?")),
]  # fmt: skip

GREETINGS = [
    "Hey {o}! Good to see you! How have you been?",
    "Hi {o}, it's been a while! What's new with you?",
    "{o}! So glad we get to catch up today.",
    "Hey {o}, how was your week?",
]
OPENERS = [
    "Hey {o}! I'm swamped with work but doing okay. Anything new on your side?",
    "Hi {o}! Busy as always, but good. What's been happening?",
    "Pretty good, {o}, thanks for asking! You?",
    "Honestly a bit tired, {o}, but happy to chat.",
]
REACTIONS = [
    "Wow, that's so cool, {o}! How did it go?",
    "That sounds amazing, {o}. Tell me more!",
    "No way! I love that for you, {o}.",
    "That's awesome! What made you want to do that?",
    "Oh nice, {o}! How are you feeling about it?",
    "Haha, that's so you. Was it fun?",
    "I'm so happy for you! You deserve it.",
    "Really? I had no idea, {o}. That's great news.",
]
ASIDES = [
    "Thanks, {o}! It means a lot that you ask.",
    "Haha, totally. It was a lot of fun.",
    "It really was. I feel more like myself lately.",
    "Yeah, I'm proud of it, honestly.",
    "I know, right? I'm still buzzing from it.",
    "It's been a good distraction from work.",
]
CLOSINGS = [
    "Anyway, I have to run. Talk soon, {o}!",
    "Great catching up, {o}. Take care!",
    "Bye {o}! Let's talk again next week.",
    "I should get going, but this was lovely. See you, {o}!",
]
CHAT = [
    "The weather has been so grey lately, I need some sun.",
    "Work is a lot right now, three deadlines in one week.",
    "Have you watched that new detective series? I binged it.",
    "I tried a new ramen place near the station, so good.",
    "My phone screen cracked again, I'm so clumsy.",
    "I've been sleeping badly, too much coffee probably.",
    "We finally repainted the kitchen, it's a pale yellow now.",
    "Traffic was a nightmare this morning.",
    "I'm thinking of redoing the garden in spring.",
    "Did you see the game on Saturday? What a finish.",
    "I need a holiday so badly, even just a long weekend.",
    "My landlord finally fixed the heating.",
    "I've been trying to drink more water, it's harder than it sounds.",
    "The farmers market had the best strawberries this week.",
    "I reorganised my whole closet, found clothes I forgot I had.",
    "My internet keeps dropping during calls, so annoying.",
    "I started a podcast about history, it's surprisingly funny.",
    "We had a power cut last night, read by candlelight.",
    "I'm trying to cut down on sugar, wish me luck.",
    "My neighbour's dog barks at every leaf that moves.",
    "Yeah, I get that completely.",
    "Same here, honestly.",
    "Ha! That made me laugh.",
    "Oh no, that sounds stressful.",
    "You always find the bright side, I love that about you.",
    "Fingers crossed it gets better soon.",
    "True, one day at a time.",
    "That's fair. I'd probably do the same.",
]
WEEKDAYS = list(calendar.day_name)
MONTHS = list(calendar.month_name)[1:]


@dataclass
class Turn:
    slug: str
    value: str  # "Name: what they said"
    created_at: int
    session: int


@dataclass
class Question:
    text: str
    kind: str  # multi | time | implied | single
    needed: list[str]  # slugs of the turns the answer rests on (all of them)
    conversation: int
    answer: str = ""  # for a reader: what the turns say (not used by the scoring)


@dataclass
class Conversation:
    number: int
    speakers: tuple[str, str]
    turns: list[Turn]
    questions: list[Question] = field(default_factory=list)


@dataclass
class ConvSet:
    seed: int
    conversations: list[Conversation]

    def held_out(self, conversation: int) -> bool:
        return held_out(self.seed, conversation)

    @property
    def questions(self) -> list[Question]:
        return [q for c in self.conversations for q in c.questions]


def held_out(seed: int, conversation: int) -> bool:
    """Half of the conversations, fixed by the seed: never used for tuning."""
    return hashlib.sha256(f"conv:{seed}:{conversation}".encode()).digest()[0] % 2 == 0


def _said_when(rng: random.Random, day: dt.date, precise: bool) -> tuple[str, dt.date, str]:
    """A relative date as a person says it on `day`: (words, the date meant, how precise:
    "day" or "month")."""
    if precise:
        choice = rng.randrange(5)
        if choice == 0:
            return "yesterday", day - dt.timedelta(days=1), "day"
        if choice == 1:
            return "two days ago", day - dt.timedelta(days=2), "day"
        if choice == 2:
            return "this morning", day, "day"
        back = rng.randint(2, 6)
        meant = day - dt.timedelta(days=back)
        if choice == 3:
            return f"last {WEEKDAYS[meant.weekday()]}", meant, "day"
        return f"on {WEEKDAYS[meant.weekday()]}", meant, "day"
    choice = rng.randrange(3)
    if choice == 0:
        return "last week", day - dt.timedelta(days=7), "week"
    first = day.replace(day=1)
    if choice == 1:
        return "last month", (first - dt.timedelta(days=1)).replace(day=1), "month"
    return "a couple of weeks ago", day - dt.timedelta(days=14), "week"


def _date_words(day: dt.date, precision: str) -> str:
    if precision == "day":
        return f"{day.day} {MONTHS[day.month - 1]} {day.year}"
    if precision == "week":
        return f"the week of {day.day} {MONTHS[day.month - 1]} {day.year}"
    return f"{MONTHS[day.month - 1]} {day.year}"


@dataclass
class _Topic:
    """A piece of a session: a few turns about one thing, and the questions it answers."""

    session: int
    lines: list[tuple[int, str]]  # (speaker index, text)
    marks: dict[str, int] = field(default_factory=dict)  # label -> index in lines


class _Builder:
    """One conversation: what each speaker lives through (topics placed in sessions, each
    with the questions it answers), then the sessions written out turn by turn."""

    def __init__(self, rng: random.Random, number: int) -> None:
        self.rng = rng
        self.number = number
        a, b = rng.sample(SPEAKERS, 2)
        self.names = (a[0], b[0])
        n_sessions = rng.randint(18, 22)
        day = dt.date(2022, 1, 3) + dt.timedelta(days=rng.randint(0, 500))
        self.days: list[dt.date] = []
        for _ in range(n_sessions):
            self.days.append(day)
            day += dt.timedelta(days=rng.randint(6, 24))
        self.topics: list[_Topic] = []
        self.asked: list[tuple[str, str, list[tuple[int, str]], str]] = []
        self.pets: list[tuple[int, str]] = []  # (topic, species)
        self.taken: set[str] = set(self.names)

    def topic(self, session: int, lines: list[tuple[int, str]], **marks: int) -> int:
        self.topics.append(_Topic(session, lines, marks))
        return len(self.topics) - 1

    def ask(self, text: str, kind: str, refs: list[tuple[int, str]], answer: str) -> None:
        self.asked.append((text, kind, refs, answer))

    def react(self, listener: int) -> tuple[int, str]:
        return listener, self.rng.choice(REACTIONS).format(o=self.names[1 - listener])

    def aside(self, who: int) -> tuple[int, str]:
        return who, self.rng.choice(ASIDES).format(o=self.names[1 - who])

    def session(self, lo: int = 0, hi: int | None = None) -> int:
        return self.rng.randrange(lo, len(self.days) if hi is None else hi)

    def other_person(self, relation: str | None = None) -> tuple[str, str]:
        rng = self.rng
        want = GENDERED.get(relation or "")
        name, pron = next(
            p for p in rng.sample(OTHERS, len(OTHERS))
            if p[0] not in self.taken and want in (None, p[1])
        )  # fmt: skip
        self.taken.add(name)
        return name, pron

    # -- what each speaker lives through ----------------------------------------------

    def activities(self, who: int) -> None:
        rng, name, other = self.rng, self.names[who], 1 - who
        starts: list[tuple[int, str]] = []
        friend = rng.random() < 0.8
        for act in rng.sample(ACTIVITIES, 3):
            s = self.session(0, len(self.days) - 4)
            words, meant, precision = _said_when(rng, self.days[s], rng.random() < 0.7)
            text = rng.choice(act.start).format(when=words)
            text = text[0].upper() + text[1:]
            t = self.topic(s, [(who, text), self.react(other), self.aside(who)], start=0)
            starts.append((t, "start"))
            for later in sorted(rng.sample(range(s + 1, len(self.days)), 2)):
                self.topic(later, [(who, rng.choice(act.later)), self.react(other)])
            when = _date_words(meant, precision)
            if rng.random() < 0.55:
                self.ask(f"When did {name} {act.ask}?", "time", [(t, "start")], when)
            else:
                on = "on" if precision == "day" else "in"
                self.ask(f"What did {name} do {on} {when}?", "time", [(t, "start")], act.name)
            if friend:  # a friend met there, whose news comes later, by first name only
                friend = False
                fname, fpron = self.other_person()
                meet = self.session(s, len(self.days) - 2)
                t1 = self.topic(
                    meet,
                    [(who, f"At {act.place} I met {fname}, {fpron} is so inspiring."),
                     self.react(other),
                     (who, f"{fpron.capitalize()} invited me for coffee next week.")],
                    met=0,
                )  # fmt: skip
                city = rng.choice(CITIES)
                news = rng.choice(
                    [f"{fname} called, {fpron} just moved to {city} for a new job!",
                     f"{fname} has a new flat in {city} now, {fpron} sent me photos.",
                     f"Guess who relocated to {city}? {fname}! I'll miss {OBJECT[fpron]}."]
                )  # fmt: skip
                t2 = self.topic(self.session(meet + 1), [(who, news), self.react(other)], news=0)
                self.ask(f"Who did {name} meet at {act.place}?", "single", [(t1, "met")], fname)
                self.ask(
                    f"Where does the friend {name} met at {act.place} live now?",
                    "multi", [(t1, "met"), (t2, "news")], city,
                )  # fmt: skip
        self.ask(f"What activities has {name} taken up?", "multi", rng.sample(starts, 2), "")

    def relative(self, who: int) -> None:
        rng, name, other = self.rng, self.names[who], 1 - who
        rel = rng.choice(RELATIONS)
        rname, rpron = self.other_person(rel)
        s1 = self.session(0, len(self.days) - 1)
        words, meant, precision = _said_when(rng, self.days[s1], True)
        t1 = self.topic(
            s1,
            [(who, f"My {rel} {rname} came over {words}."),
             self.react(other),
             (who, f"We cooked all afternoon, {rpron} makes the best curry.")],
            intro=0, cook=2,
        )  # fmt: skip
        role = rng.choice(ROLES)
        t2 = self.topic(
            self.session(s1 + 1),
            [(who, f"{rname} got a job as a {role}, {rpron} starts on Monday!"),
             self.react(other),
             (who, f"{rpron.capitalize()} was so nervous at the interview.")],
            job=0,
        )  # fmt: skip
        self.topic(
            self.session(s1 + 1), [(who, f"{rname} says hi, by the way!"), self.aside(other)]
        )
        self.ask(
            f"What is the new job of {name}'s {rel}?", "multi", [(t1, "intro"), (t2, "job")], role
        )
        self.ask(f"Whose cooking does {name} like best?", "single", [(t1, "cook")], rname)
        self.ask(f"What is the name of {name}'s {rel}?", "single", [(t1, "intro")], rname)
        self.ask(
            f"When did {name}'s {rel} visit?",
            "time",
            [(t1, "intro")],
            _date_words(meant, precision),
        )

    def job(self, who: int) -> None:
        rng, name, other = self.rng, self.names[who], 1 - who
        s1 = self.session(0, len(self.days) - 1)
        org1, org2 = rng.sample(ORGS, 2)
        t1 = self.topic(
            s1, [(who, f"I still work at {org1}, but it's draining."), self.react(other)], j=0
        )
        s2 = self.session(s1 + 1)
        words, meant, precision = _said_when(rng, self.days[s2], True)
        t2 = self.topic(
            s2,
            [(who, f"Big news: I quit and started at {org2} {words}."),
             self.react(other),
             (who, "The new team is lovely so far.")],
            j=0,
        )  # fmt: skip
        self.ask(f"Where does {name} work now?", "single", [(t2, "j")], org2)
        self.ask(f"Where did {name} work before and after changing jobs?", "multi",
                 [(t1, "j"), (t2, "j")], f"{org1}, then {org2}")  # fmt: skip
        self.ask(f"When did {name} start the new job?", "time", [(t2, "j")],
                 _date_words(meant, precision))  # fmt: skip

    def pet(self, who: int) -> None:
        rng, name, other = self.rng, self.names[who], 1 - who
        species, young = rng.choice(PETS)
        pet = rng.choice(PET_NAMES)
        pron = rng.choice(["him", "her"])
        s = self.session(0, len(self.days) - 1)
        words, meant, precision = _said_when(rng, self.days[s], rng.random() < 0.5)
        t = self.topic(
            s,
            [(who, f"We adopted a {young} {words}!"),
             self.react(other),
             (who, f"We named {pron} {pet}, after my grandpa's old pet.")],
            adopt=0, name=2,
        )  # fmt: skip
        self.topic(
            self.session(s + 1),
            [(who, f"{pet} chewed through my charger again."), self.react(other)],
        )
        self.pets.append((t, species))
        self.ask(f"What is the name of {name}'s {species}?", "single", [(t, "name")], pet)
        if rng.random() < 0.5:
            self.ask(f"When did {name} get the {species}?", "time", [(t, "adopt")],
                     _date_words(meant, precision))  # fmt: skip

    def book_and_trip(self, who: int) -> None:
        rng, name, other = self.rng, self.names[who], 1 - who
        book = rng.choice(BOOKS)
        t = self.topic(
            self.session(),
            [(who, f'I just finished reading "{book}", couldn\'t put it down.'), self.react(other)],
            b=0,
        )
        self.ask(f"Which book did {name} recommend?", "single", [(t, "b")], book)
        place = rng.choice(TRIPS)
        s = self.session(1)
        words, meant, precision = _said_when(rng, self.days[s], False)
        t = self.topic(
            s,
            [(who, f"We got back from {place} {words}, still jet-lagged."), self.react(other),
             (who, "The food alone was worth the flight.")],
            trip=0,
        )  # fmt: skip
        if rng.random() < 0.5:
            self.ask(f"When did {name} travel to {place}?", "time", [(t, "trip")],
                     _date_words(meant, precision))  # fmt: skip
        else:
            month = _date_words(meant, "month")
            self.ask(f"Where did {name} go on holiday in {month}?", "time", [(t, "trip")], place)

    def implied(self, who: int) -> None:
        rng, name, other = self.rng, self.names[who], 1 - who
        for says, asks in rng.sample(IMPLIED, 3):
            t = self.topic(self.session(), [(who, rng.choice(says)), self.react(other)], x=0)
            self.ask(rng.choice(asks).format(s=name), "implied", [(t, "x")], "")

    # -- the dialogue -------------------------------------------------------------------

    def build(self) -> Conversation:
        for who in (0, 1):
            self.activities(who)
            self.relative(who)
            self.job(who)
            self.pet(who)
            self.book_and_trip(who)
            self.implied(who)
        (t0, sp0), (t1, sp1) = self.pets
        self.ask(f"What pets do {self.names[0]} and {self.names[1]} have?", "multi",
                 [(t0, "adopt"), (t1, "adopt")], f"{sp0}, {sp1}")  # fmt: skip
        rng = self.rng
        by_session: dict[int, list[int]] = {}
        for i, tp in enumerate(self.topics):
            by_session.setdefault(tp.session, []).append(i)
        turns: list[Turn] = []
        where: dict[tuple[int, str], str] = {}
        for s, day in enumerate(self.days):
            first = rng.randrange(2)
            lines: list[tuple[int, str]] = [
                (first, rng.choice(GREETINGS).format(o=self.names[1 - first])),
                (1 - first, rng.choice(OPENERS).format(o=self.names[first])),
            ]
            marks: list[tuple[int, str, int]] = []  # topic, mark, line
            chunks: list[int | None] = [*by_session.get(s, []), *[None] * rng.randint(5, 9)]
            rng.shuffle(chunks)
            for ti in chunks:
                if ti is None:  # small talk
                    who = rng.randrange(2)
                    lines += [(who, rng.choice(CHAT)), (1 - who, rng.choice(CHAT))]
                    continue
                tp = self.topics[ti]
                for label, at in tp.marks.items():
                    marks.append((ti, label, len(lines) + at))
                lines += tp.lines
            last = rng.randrange(2)
            lines.append((last, rng.choice(CLOSINGS).format(o=self.names[1 - last])))
            lines.append((1 - last, rng.choice(CLOSINGS).format(o=self.names[last])))
            base = calendar.timegm(day.timetuple()) + rng.randint(9, 20) * 3600
            for n, (who, text) in enumerate(lines):
                slug = f"mem/chat/{day.isoformat()}/{n + 1:03d}"
                turns.append(Turn(slug, f"{self.names[who]}: {text}", base + 45 * n, s))
            for ti, label, at in marks:
                where[(ti, label)] = f"mem/chat/{day.isoformat()}/{at + 1:03d}"
        conv = Conversation(self.number, self.names, turns)
        for text, kind, refs, answer in self.asked:
            needed = sorted({where[r] for r in refs})
            conv.questions.append(Question(text, kind, needed, self.number, answer))
        return conv


def generate(seed: int = SEED, conversations: int = CONVERSATIONS) -> ConvSet:
    rng = random.Random(seed)
    return ConvSet(seed, [_Builder(rng, i).build() for i in range(conversations)])


def digest(cs: ConvSet) -> str:
    """sha256 of everything the set holds (turns and questions), to freeze it."""
    h = hashlib.sha256()
    for c in cs.conversations:
        for t in c.turns:
            h.update(f"{c.number}\x00{t.slug}\x00{t.value}\x00{t.created_at}\n".encode())
        for q in c.questions:
            h.update(f"{q.text}\x00{q.kind}\x00{','.join(q.needed)}\x00{q.answer}\n".encode())
    return h.hexdigest()


DIGEST = "378455c89604c3ea01d9a6e9647c054cc46b4e211f964ccbb341cfd441b01ced"


def build() -> ConvSet:
    """The frozen conversational set; refuses to be anything but the set that was frozen."""
    cs = generate()
    if digest(cs) != DIGEST:
        raise RuntimeError("the conversational evaluation set changed since it was frozen")
    return cs
