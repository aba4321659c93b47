"""The recall evaluation set: memories made the way an agent's memory grows, and questions
that paraphrase them, generated deterministically (no model is involved).

An agent that talks with its user for months keeps many short facts about the people and
projects around the user, each under a slug it chose (`mem/people/dana-okafor/editor`), in
its own words; the questions come later, in the user's words. Each fact type has several
ways a memory says it and several ways a question asks for it, from different vocabularies
(a memory says "works as a data engineer at Fennel", a question "what is Dana's job?"), so a
question rarely quotes its memory. Names are shared by many memories (a person has a dozen),
so a name alone does not find the answer either.

Question types: `single` (one fact), `dated` (a fact with a date, asked with the date
written another way), `combine` (two facts joined through a person: "which city does the
lead of Atlas live in?": both memories are needed) and `absent` (a fact the memory does not
hold, about someone it knows: nothing should answer it; scored by how often the top hit is
the same kind of fact about someone else).

`held_out(entity)` splits by entity, from the seed, before anything is measured: questions
about held-out people and projects are never used to tune recall.

`build_fresh()` is a second set made the same way from another seed, about other people
(no name of the seed-38 set) and other projects (`FRESH_PROJECTS`): every question of it is
held out. It was frozen (`FRESH_DIGEST`, checked on every build) before recall was ever
measured on it: the seed-38 held-out split had been looked at twice while recall was
being tuned, so it no longer counts as unseen.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

FIRST = [
    "ada",
    "alan",
    "alice",
    "amara",
    "anders",
    "aria",
    "arjun",
    "astrid",
    "bea",
    "ben",
    "bianca",
    "boris",
    "carla",
    "chen",
    "chidi",
    "clara",
    "dana",
    "daniel",
    "diego",
    "elena",
    "elif",
    "emeka",
    "emil",
    "erin",
    "esme",
    "farah",
    "felix",
    "fatima",
    "gaia",
    "gemma",
    "goran",
    "hana",
    "hiro",
    "ida",
    "igor",
    "ines",
    "ivan",
    "jade",
    "jamal",
    "jana",
    "jonas",
    "jun",
    "kai",
    "kamala",
    "karin",
    "kenji",
    "lara",
    "leila",
    "leon",
    "liam",
    "lina",
    "lucas",
    "mai",
    "malik",
    "marco",
    "maya",
    "mei",
    "mila",
    "milo",
    "nadia",
    "naomi",
    "nico",
    "nina",
    "noor",
    "olga",
    "omar",
    "oscar",
    "paula",
    "pedro",
    "priya",
    "quinn",
    "rafael",
    "rania",
    "ravi",
    "rosa",
    "ruben",
    "sana",
    "sara",
    "sergio",
    "shira",
    "sofia",
    "sven",
    "tara",
    "theo",
    "tomas",
    "uma",
    "valeria",
    "vera",
    "viktor",
    "wen",
    "xavier",
    "yara",
    "yusuf",
    "zara",
    "zoe",
]
LAST = [
    "abbott",
    "adeyemi",
    "alvarez",
    "andersen",
    "bauer",
    "becker",
    "brandt",
    "castillo",
    "chen",
    "costa",
    "dahl",
    "delgado",
    "dubois",
    "eriksen",
    "farouk",
    "fischer",
    "garcia",
    "haddad",
    "hansen",
    "ito",
    "jansen",
    "kapoor",
    "kato",
    "keller",
    "kowalski",
    "larsen",
    "lindqvist",
    "lopez",
    "meyer",
    "moreau",
    "nakamura",
    "novak",
    "okafor",
    "olsen",
    "park",
    "patel",
    "perez",
    "quinn",
    "ramos",
    "rossi",
    "sato",
    "schmidt",
    "silva",
    "singh",
    "sousa",
    "tanaka",
    "torres",
    "vogel",
    "wagner",
    "weber",
    "yilmaz",
    "zhang",
]
PROJECTS = [
    "atlas",
    "beacon",
    "cedar",
    "comet",
    "delta",
    "ember",
    "falcon",
    "fjord",
    "garnet",
    "harbor",
    "helix",
    "iris",
    "juniper",
    "kestrel",
    "lagoon",
    "lumen",
    "maple",
    "meridian",
    "nimbus",
    "onyx",
    "orbit",
    "pebble",
    "phoenix",
    "quartz",
    "raven",
    "sable",
    "sierra",
    "solstice",
    "spruce",
    "summit",
    "tandem",
    "tide",
    "topaz",
    "tundra",
    "umber",
    "vector",
    "willow",
    "zephyr",
    "aurora",
    "basalt",
    "canyon",
    "dune",
    "echo",
    "flint",
    "glacier",
    "horizon",
    "indigo",
    "jasper",
    "koi",
    "lotus",
    "mosaic",
    "nova",
    "opal",
    "prism",
    "ripple",
    "saffron",
    "tempo",
]
# the fresh set's projects: none of PROJECTS
FRESH_PROJECTS = """
    acorn alder amber anchor arbor argon aspen bamboo birch bluff bramble breeze brook
    cairn cascade cinder cobalt coral crest cypress dawn drift dusk elm estuary fern fable
    flare forge galena grove hazel heron hollow ivy jetty kelp larch ledger linden marble
    marsh mesa mistral moss nectar oak orchid pine quill reef rowan sage shale slate sorrel
    thistle
""".split()  # noqa: SIM905
FRESH_SEED = 3802
ORGS = [
    "Fennel",
    "Brightwave",
    "Ostara",
    "Kelpie",
    "Northwind",
    "Tessellate",
    "Quillon",
    "Marlow",
    "Ardent",
    "Vireo",
]
CITIES = [
    "Lisbon",
    "Rotterdam",
    "Utrecht",
    "Porto",
    "Ghent",
    "Lyon",
    "Leipzig",
    "Kraków",
    "Bergen",
    "Tampere",
    "Bilbao",
    "Trieste",
    "Aarhus",
    "Graz",
    "Malmö",
    "Cork",
    "Brno",
    "Turin",
    "Nantes",
    "Bologna",
    "Gdańsk",
    "Tallinn",
    "Riga",
    "Vilnius",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]


@dataclass(frozen=True)
class FactType:
    """A kind of fact: how memories say it, how questions ask it (`{s}` the subject)."""

    name: str
    values: tuple[str, ...]
    says: tuple[str, ...]  # memory phrasings: {s} subject, {v} value
    asks: tuple[str, ...]  # question phrasings: {s} subject
    dated: bool = False


def _t(*xs: str) -> tuple[str, ...]:
    return xs


PERSON_FACTS = [
    FactType(
        "job",
        _t(
            "data engineer",
            "backend developer",
            "product designer",
            "site reliability engineer",
            "engineering manager",
            "security analyst",
            "technical writer",
            "ML researcher",
            "QA lead",
            "frontend developer",
        ),
        _t(
            "{s} works as a {v} at {org}.",
            "{s} is employed by {org}, role: {v}.",
            "Role of {s}: {v} ({org}).",
        ),
        _t(
            "What does {s} do for a living?",
            "What's {s}'s job?",
            "What position does {s} hold?",
            "What is {s}'s occupation?",
        ),
    ),
    FactType(
        "editor",
        _t("Neovim", "VS Code", "Emacs", "IntelliJ", "Helix", "Sublime Text", "Zed", "PyCharm"),
        _t(
            "{s} codes in {v} with a heavily customised config.",
            "{s} sticks to {v}; do not suggest switching.",
            "Editor of choice for {s}: {v}.",
        ),
        _t(
            "Which IDE does {s} like to program with?",
            "What text editor is {s} loyal to?",
            "What tool does {s} write software in?",
        ),
    ),
    FactType(
        "diet",
        _t(
            "vegan",
            "vegetarian",
            "pescatarian",
            "gluten-free",
            "lactose intolerant",
            "halal",
            "kosher",
            "on a low-carb diet",
        ),
        _t(
            "{s} is {v}; keep that in mind when booking team dinners.",
            "Food note: {s} is {v}.",
            "{s} eats {v} only.",
        ),
        _t(
            "Are there any dietary restrictions for {s}?",
            "What can {s} eat at a restaurant?",
            "What should I know about {s}'s meals?",
        ),
    ),
    FactType(
        "city",
        tuple(CITIES),
        _t(
            "{s} lives in {v}.",
            "{s} is based in {v} and rarely travels.",
            "Home town of {s} is {v}.",
        ),
        _t("Where does {s} reside?", "Which city is {s} located in?", "Where is {s}'s home?"),
    ),
    FactType(
        "pet",
        _t(
            "a beagle named Biscuit",
            "a tabby cat called Miso",
            "two rabbits, Pip and Bun",
            "a parrot named Kiwi",
            "a greyhound called Dash",
            "a tortoise named Sheldon",
            "a husky called Luna",
            "a goldfish named Bubbles",
        ),
        _t(
            "{s} has {v}.", "{s} owns {v} and talks about it a lot.", "Animal at home for {s}: {v}."
        ),
        _t(
            "Does {s} have any animals?",
            "What is the name of {s}'s pet?",
            "Which animal lives with {s}?",
        ),
    ),
    FactType(
        "hobby",
        _t(
            "bouldering",
            "sourdough baking",
            "trail running",
            "playing chess online",
            "restoring vintage bikes",
            "birdwatching",
            "woodworking",
            "sailing",
        ),
        _t(
            "{s} spends weekends {v}.",
            "Outside work {s} is into {v}.",
            "{s} mentioned {v} as a big passion.",
        ),
        _t(
            "What does {s} enjoy doing in their free time?",
            "What are {s}'s hobbies?",
            "How does {s} relax after work?",
        ),
    ),
    FactType(
        "language",
        _t("Portuguese", "Japanese", "Turkish", "Polish", "Swahili", "Hindi", "Finnish", "Greek"),
        _t(
            "{s} speaks {v} natively.",
            "{s}'s first language is {v}.",
            "{s} grew up speaking {v} at home.",
        ),
        _t(
            "What is {s}'s mother tongue?",
            "Which language did {s} learn as a child?",
            "What language is {s} most fluent in?",
        ),
    ),
    FactType(
        "meetings",
        _t(
            "before 10:00",
            "after lunch",
            "only on Tuesdays and Thursdays",
            "late afternoon",
            "not on Fridays",
            "in 25-minute slots",
            "early morning",
            "never before noon",
        ),
        _t(
            "{s} prefers meetings {v}.",
            "Calendar rule for {s}: meetings {v}.",
            "Book calls with {s} {v}.",
        ),
        _t(
            "When is a good time to schedule a call with {s}?",
            "When does {s} like to have appointments?",
            "How should I plan a sync with {s}?",
        ),
    ),
    FactType(
        "allergy",
        _t("peanuts", "shellfish", "pollen", "penicillin", "cats", "latex", "bee stings", "sesame"),
        _t(
            "{s} is allergic to {v}.",
            "Allergy: {s} reacts badly to {v}.",
            "Health note, {s}: {v} allergy.",
        ),
        _t(
            "What allergies does {s} have?",
            "Is {s} sensitive to anything medically?",
            "What must {s} avoid for health reasons?",
        ),
    ),
    FactType(
        "channel",
        _t(
            "Signal",
            "a phone call",
            "Slack DMs",
            "Matrix",
            "WhatsApp",
            "a handwritten note",
            "Telegram",
            "SMS",
        ),
        _t(
            "{s} answers {v} much faster than email.",
            "Best way to get hold of {s}: {v}.",
            "{s} ignores email; use {v}.",
        ),
        _t(
            "How should I contact {s}?",
            "What's the quickest way to reach {s}?",
            "How do I get in touch with {s}?",
        ),
    ),
    FactType(
        "commute",
        _t("bike", "train", "electric scooter", "car", "ferry", "bus", "on foot", "tram"),
        _t(
            "{s} commutes by {v}.",
            "{s} gets to the office by {v} every day.",
            "Travel to work for {s}: {v}.",
        ),
        _t(
            "How does {s} get to work?",
            "What transport does {s} take to the office?",
            "How does {s} travel each morning?",
        ),
    ),
    FactType(
        "music",
        _t(
            "jazz",
            "techno",
            "baroque music",
            "k-pop",
            "lo-fi hip hop",
            "metal",
            "bossa nova",
            "film scores",
        ),
        _t(
            "{s} listens to {v} while working.",
            "{s} always has {v} playing.",
            "Focus soundtrack for {s}: {v}.",
        ),
        _t(
            "What kind of music does {s} like?",
            "What songs does {s} put on?",
            "Which genre does {s} enjoy listening to?",
        ),
    ),
    FactType(
        "birthday",
        (),
        _t("{s}'s birthday is {v}.", "{s} was born on {v}.", "Birthday of {s}: {v}."),
        _t(
            "When should I wish {s} a happy birthday?",
            "When does {s} celebrate turning a year older?",
            "What day is {s}'s birthday?",
        ),
        dated=True,
    ),
    FactType(
        "joined",
        (),
        _t(
            "{s} joined {org} on {v}.",
            "{s} started at {org} on {v}.",
            "First day of {s} at {org}: {v}.",
        ),
        _t(
            "When did {s} begin working at their company?",
            "How long ago was {s} hired?",
            "Since when has {s} been with their employer?",
        ),
        dated=True,
    ),
]
PROJECT_FACTS = [
    FactType(
        "deadline",
        (),
        _t("Project {s} must ship by {v}.", "{s} deadline: {v}.", "Release of {s} is due {v}."),
        _t(
            "When is {s} due?",
            "By what date should {s} be finished?",
            "When does {s} have to launch?",
        ),
        dated=True,
    ),
    FactType(
        "database",
        _t(
            "PostgreSQL", "SQLite", "Cassandra", "MongoDB", "ClickHouse", "Redis", "DuckDB", "MySQL"
        ),
        _t(
            "{s} stores its data in {v}.", "{s} runs on {v} in production.", "Storage for {s}: {v}."
        ),
        _t(
            "Which database backs {s}?",
            "What does {s} persist its records with?",
            "What datastore is behind {s}?",
        ),
    ),
    FactType(
        "language",
        _t("Rust", "Go", "Python", "TypeScript", "Kotlin", "Elixir", "C++", "Swift"),
        _t("{s} is written in {v}.", "{s}'s codebase is mostly {v}.", "{s} is a {v} project."),
        _t(
            "What programming language is {s} built with?",
            "Which language is {s} coded in?",
            "What is {s} implemented in?",
        ),
    ),
    FactType(
        "status",
        _t(
            "paused until the budget review",
            "in beta with three customers",
            "blocked on a security audit",
            "being rewritten from scratch",
            "live and stable",
            "waiting for legal sign-off",
        ),
        _t("{s} is currently {v}.", "Status of {s}: {v}.", "Update on {s}: it is {v}."),
        _t("How is {s} going?", "What state is {s} in right now?", "Where does {s} stand?"),
    ),
]
# The names agents give such memories: rarely the question's word.
SLUG_NAMES = {
    "job": ("work", "role", "career"),
    "editor": ("tools", "setup", "dev-env"),
    "diet": ("food", "dinners", "diet"),
    "city": ("home", "location", "where"),
    "pet": ("animals", "home-life", "family"),
    "hobby": ("weekends", "interests", "free-time"),
    "language": ("languages", "background", "origin"),
    "meetings": ("calendar", "scheduling"),
    "allergy": ("health", "medical"),
    "channel": ("contact", "comms"),
    "commute": ("travel", "transport"),
    "music": ("focus", "music"),
    "birthday": ("dates", "birthday", "personal"),
    "joined": ("employment", "start", "hr"),
    "deadline": ("timeline", "schedule", "release"),
    "database": ("storage", "infra", "stack"),
    "status": ("status", "progress", "update"),
}
ABSENT_TYPES = {"pet", "allergy", "music", "commute", "hobby"}  # asked about, sometimes unknown


COMBINE_PROJECT = {
    "database": "which datastore {p} runs on",
    "language": "what {p} is coded in",
    "deadline": "when {p} has to launch",
    "status": "where {p} stands",
}
COMBINE_ASKS = {
    "city": ("I'm visiting {s} to talk about {p}: where do they live, and {q}?",),
    "editor": ("Pairing with {s} on {p} tomorrow: what IDE do they use, and {q}?",),
    "language": ("Before my call with {s} about {p}: what's their native language, and {q}?",),
    "channel": ("How do I reach {s}, and {q}?",),
    "diet": ("Planning a {p} team dinner with {s}: any food restrictions, and {q}?",),
    "job": ("Remind me what {s} does for a living and {q}.",),
}
DATED_ASKS = {
    "birthday": ("Which {s} was born in {when}?", "Whose birthday was in {when}, {s}'s?"),
    "joined": (
        "Who started at {org} in {when}?",
        "Which colleague was hired by {org} in {when}?",
        "Did {s} join {org} in {when}?",
    ),
}


@dataclass
class Memory:
    slug: str
    value: str
    created_at: int
    entity: str
    fact: str  # fact type name
    said: dict[str, str] = field(default_factory=dict)  # the template's fields (s, v, org)


@dataclass
class Question:
    text: str
    kind: str  # single | dated | combine | absent
    needed: list[str]  # slugs, all needed (empty for absent)
    entity: str
    fact: str = ""  # the asked fact type (absent: to score confusions)
    others: list[str] = field(default_factory=list)  # absent: memories of that type


@dataclass
class EvalSet:
    seed: int
    memories: list[Memory]
    questions: list[Question]

    def held_out(self, entity: str) -> bool:
        return held_out(self.seed, entity)


def held_out(seed: int, entity: str) -> bool:
    """40% of people and projects, fixed by the seed: never used for tuning."""
    digest = hashlib.sha256(f"{seed}:{entity}".encode()).digest()
    return digest[0] % 10 < 4


def _date(rng: random.Random, lo: int = 2019, hi: int = 2026) -> tuple[str, str]:
    """(as a memory writes it, as a question writes it): ISO vs words."""
    y, m, d = rng.randint(lo, hi), rng.randint(1, 12), rng.randint(1, 28)
    said = rng.choice(
        [f"{y}-{m:02d}-{d:02d}", f"{d} {MONTHS[m - 1]} {y}", f"{MONTHS[m - 1]} {d}, {y}"]
    )
    return said, f"{MONTHS[m - 1]} {y}"


def build(
    seed: int = 38,
    people: int = 380,
    projects: int = 60,
    notes: int = 400,
    *,
    exclude: frozenset[str] = frozenset(),
    project_pool: list[str] = PROJECTS,
) -> EvalSet:
    """At least 5,000 memories and 1,000 questions for the defaults; no person named in
    `exclude`, projects from `project_pool`."""
    rng = random.Random(seed)
    names: list[str] = []
    seen: set[str] = set(exclude)
    while len(names) < people:
        n = f"{rng.choice(FIRST).title()} {rng.choice(LAST).title()}"
        if n not in seen:
            seen.add(n)
            names.append(n)
    t0 = 1_700_000_000
    memories: list[Memory] = []
    questions: list[Question] = []
    facts: dict[tuple[str, str], Memory] = {}
    values: dict[tuple[str, str], str] = {}
    org_of = {n: rng.choice(ORGS) for n in names}

    slugs: set[str] = set()

    def add(entity: str, kind: str, slug: str, value: str) -> Memory:
        while slug in slugs:
            slug += "-2"
        slugs.add(slug)
        mem = Memory(slug, value, t0 + len(memories) * 97 + rng.randint(0, 50), entity, kind)
        memories.append(mem)
        facts[(entity, kind)] = mem
        return mem

    for name in names:
        key = name.lower().replace(" ", "-")
        kinds = rng.sample(PERSON_FACTS, k=rng.randint(11, 14))
        for ft in kinds:
            if ft.dated:
                said, asked = _date(rng, 1960, 2003) if ft.name == "birthday" else _date(rng)
                value = said
                values[(name, ft.name)] = asked
            else:
                value = rng.choice(ft.values)
            first = name.split()[0] if rng.random() < 0.5 else name
            text = rng.choice(ft.says).format(s=first, v=value, org=org_of[name])
            mem = add(name, ft.name, f"mem/people/{key}/{rng.choice(SLUG_NAMES[ft.name])}", text)
            mem.said = {"s": first, "v": value, "org": org_of[name]}
        have = {ft.name for ft in kinds}
        for ft in kinds:
            if ft.dated:
                when = values[(name, ft.name)]
                ask = rng.choice(DATED_ASKS[ft.name]).format(
                    when=when, org=org_of[name], s=name.split()[0]
                )
                kind = "dated"
            else:
                ask = rng.choice(ft.asks).format(s=name)
                kind = "single"
            if rng.random() < (0.6 if ft.dated else 0.3):
                questions.append(Question(ask, kind, [facts[(name, ft.name)].slug], name, ft.name))
        missing = [ft for ft in PERSON_FACTS if ft.name in ABSENT_TYPES and ft.name not in have]
        if missing and rng.random() < 0.8:
            ft = rng.choice(missing)
            questions.append(
                Question(rng.choice(ft.asks).format(s=name), "absent", [], name, ft.name)
            )
    project_names = rng.sample(project_pool, k=min(projects, len(project_pool)))
    for proj in project_names:
        title = proj.title()
        lead = rng.choice(names)
        add(
            title,
            "lead",
            f"mem/projects/{proj}/lead",
            rng.choice(
                [
                    f"{lead} leads {title}.",
                    f"{title} is run by {lead}.",
                    f"Owner of project {title}: {lead}.",
                ]
            ),
        )
        for ft in PROJECT_FACTS:
            if ft.dated:
                said, asked = _date(rng, 2024, 2027)
                value = said
                values[(title, ft.name)] = asked
            else:
                value = rng.choice(ft.values)
            topic = rng.choice(SLUG_NAMES.get(ft.name, (ft.name,)))
            add(
                title,
                ft.name,
                f"mem/projects/{proj}/{topic}",
                rng.choice(ft.says).format(s=title, v=value),
            )
            ask = rng.choice(ft.asks).format(s=title)
            if ft.dated and rng.random() < 0.5:
                ask = f"Which project has to be delivered in {values[(title, ft.name)]}?"
            questions.append(
                Question(
                    ask,
                    "dated" if ft.dated else "single",
                    [facts[(title, ft.name)].slug],
                    title,
                    ft.name,
                )
            )
        # facts to combine: one question, two memories (the project's and its lead's)
        for kind, asks in COMBINE_ASKS.items():
            proj_fact = rng.choice(["database", "language", "deadline", "status"])
            if (lead, kind) in facts:
                q = COMBINE_PROJECT[proj_fact].format(p=title)
                ask = rng.choice(asks).format(p=title, s=lead, q=q)
                questions.append(
                    Question(
                        ask,
                        "combine",
                        [facts[(title, proj_fact)].slug, facts[(lead, kind)].slug],
                        title,
                        kind,
                    )
                )
    # session notes: a few longer memories that mention several people in passing
    for i in range(notes):
        a, b = rng.sample(names, 2)
        proj = rng.choice(project_names).title()
        said, _ = _date(rng, 2023, 2026)
        add(
            f"note-{i}",
            "note",
            f"mem/notes/{i:04d}",
            (
                f"Session {said}: talked through {proj} with the user; {a} and {b} were mentioned "
                f"about the rollout plan. Follow up next week."
            ),
        )
    for q in questions:
        if q.kind == "absent":
            q.others = [m.slug for m in memories if m.fact == q.fact]
    return EvalSet(seed, memories, questions)


def digest(evalset: EvalSet) -> str:
    """sha256 of everything a set holds (memories and questions), to freeze it."""
    h = hashlib.sha256()
    for m in evalset.memories:
        h.update(f"{m.slug}\x00{m.value}\x00{m.created_at}\x00{m.entity}\n".encode())
    for q in evalset.questions:
        h.update(f"{q.text}\x00{q.kind}\x00{','.join(q.needed)}\x00{q.entity}\n".encode())
    return h.hexdigest()


FRESH_DIGEST = "a05c1c1024848fc58963301a9b24eeee0221cc11c466352cacd18af097781486"


def build_fresh() -> EvalSet:
    """The fresh held-out set (see the module docstring); refuses to be anything but the
    set that was frozen."""
    used = frozenset(m.entity for m in build(38).memories if m.entity[:1].isupper())
    fresh = build(FRESH_SEED, exclude=used, project_pool=FRESH_PROJECTS)
    if digest(fresh) != FRESH_DIGEST:
        raise RuntimeError("the fresh evaluation set changed since it was frozen")
    return fresh
