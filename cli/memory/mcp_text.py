"""What the agent (or its owner) reads from the `engram mcp` server: instructions, tool
descriptions, the nudge, and the tools' argument types. Text only; the server is
`cli.memory.mcp_server`."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from cli.memory.search import DEPTH_MAX, EXPANDED_MAX, QUERY_MAX

CORE_URI = "engram://core"
CORE_PROMPT = "core_profile"
PATCH_CAP = 1 << 20  # as `engram mem patch`: a larger diff is refused, never truncated

SLUG_HELP = (
    "Slug: a path such as `notes/project-x` (`mem/` is added when missing; segments of "
    "lower-case letters, digits, `-` and `_`), or `core` for your profile."
)
TRUST_HELP = (
    "Every memory carries a trust: `guess` (you inferred it), `stated` (your user said so), "
    "`confirmed` (your owner confirmed or corrected it); memories your owner denied are "
    "never shown, and you cannot write a denied value again."
)
INSTRUCTIONS = (
    "Persistent memory for this agent: text values under slugs, stored end-to-end encrypted "
    "on Nostr relays and kept across sessions, with their history. `core` is your profile "
    "(who you are, who you work for, how you work together): read it first, from the "
    f"resource {CORE_URI} or the prompt `{CORE_PROMPT}`. Link other memories from the "
    "profile or from each other as [[mem/slug]] so they stay reachable (memory_refs). To "
    "change a value, memory_get it (the result includes its sha256), then memory_patch "
    "with that base_hash; memory_set replaces the whole value. To find a memory whose slug "
    f"you do not know, ask memory_recall in plain words. {TRUST_HELP}"
)
OWNER_INSTRUCTIONS = (
    "Your agent's persistent memory, read with your (the owner's) key. Review it with "
    "memory_list, memory_get and memory_log; memory_confirm a value that is right, "
    "memory_deny one that is wrong (the agent then never sees it and cannot write it "
    "again); memory_set, memory_patch and memory_revert write corrections, which the agent "
    "reads as yours and cannot silently overwrite."
)
_TIME = "unix seconds or ISO 8601 (UTC where no zone is given)"
DESCRIPTIONS = {
    "memory_recall": (
        "The memories most relevant to a question or a few words in plain language, best "
        "first: slug, value, score (higher is better), created_at, trust. Ranked locally "
        "after decryption (words and embeddings, fused): the query never leaves this "
        "machine. Use it before memory_set to find what you already know. valid_now: leave "
        "out facts not valid now."
    ),
    "memory_get": (
        "Read one memory. The first text block is the value exactly as stored; the second "
        "gives its sha256 (the base_hash for memory_patch), its trust, who wrote it and its "
        "validity. `core` returns your profile. Optional: as_of (the value at that time), "
        "rev (one version, from memory_log), valid_at (an error unless the fact holds "
        f"then); times are {_TIME}. {SLUG_HELP} Links to other memories look like "
        "[[mem/slug]]."
    ),
    "memory_hash": (
        f"The sha256 (hex) of a memory's current value: the base_hash for memory_patch. {SLUG_HELP}"
    ),
    "memory_list": (
        "List your memories: slug, created_at (unix seconds), version id, trust and validity "
        "(a fact whose validity has ended is marked `ended`), sorted by slug. `core` (your "
        "profile) and removed or denied memories are not listed. valid_now: leave out "
        "facts not valid now."
    ),
    "memory_search": (
        "Search slugs and values for a text (case-insensitive), best matches first, with a "
        "one-line snippet and the trust of each. The search runs locally after decryption: "
        "the query never leaves this machine. valid_now: leave out facts not valid now."
    ),
    "memory_refs": (
        "Which memories are reachable from `core` through [[mem/slug]] links, which are "
        "orphans (nothing links to them) and which links are dangling (point at nothing, "
        "or at a removed or denied memory). Nothing is deleted: decide yourself what to "
        "link or remove."
    ),
    "memory_log": (
        "The versions of one memory, newest first: id, time, who wrote it (agent or owner), "
        "trust, state (value, removed, denied, forgotten, withheld) and source. Read an "
        f"old value with memory_get rev=ID; restore one with memory_revert. {SLUG_HELP}"
    ),
    "memory_set": (
        "Create a memory or replace its whole value (at most 65,535 bytes once encoded). "
        "Use it for new memories; to edit an existing one prefer memory_patch with a "
        "base_hash, which cannot overwrite a change you have not seen. trust: `guess` (the "
        "default: you inferred it) or `stated` (your user said so); source: where it came "
        f"from; valid_from/valid_until ({_TIME}): when the fact holds in the world. A value "
        "you removed earlier is refused (error code `refused`) unless force; a value your "
        "owner denied is always refused; force is also needed to overwrite your owner's "
        "correction. `core` is your profile: keep it short and link details as "
        f"[[mem/slug]]. {SLUG_HELP}"
    ),
    "memory_patch": (
        "Edit a memory by applying a one-file unified diff exactly (no fuzz, no offset). "
        "base_hash is the sha256 of the value you made the diff against (from memory_get or "
        "memory_hash); if the memory changed since, nothing is written and the error code "
        "is `conflict`: read it again and redo the diff. An absent memory patches as the "
        "empty value. Trust, source and validity carry over; the refusals of memory_set "
        f"apply. {SLUG_HELP}"
    ),
    "memory_delete": (
        "Delete a memory (publishes a tombstone that records `reason` and the hash of the "
        "value, so the same value is not silently written again). `core` cannot be "
        "deleted: to clear your profile, memory_set it to a shorter text. Remove "
        f"[[mem/slug]] links to it too (memory_refs shows them as dangling). {SLUG_HELP}"
    ),
    "memory_revert": (
        "Write a new version with the value of an earlier one (rev: its id from memory_log); "
        f"the past is never rewritten. The refusals of memory_set apply. {SLUG_HELP}"
    ),
    "memory_confirm": (
        "Owner verdict: confirm the memory's current value. The agent reads it as "
        f"`confirmed` by you and needs force to overwrite it. {SLUG_HELP}"
    ),
    "memory_deny": (
        "Owner verdict: deny the memory's current value (with a reason). The agent then "
        "reads the memory as absent and can never write that value again; you can, by "
        f"correcting to it. {SLUG_HELP}"
    ),
}
OWNER_DESCRIPTIONS = {
    "memory_set": (
        "Owner correction: write the memory's value (at most 65,535 bytes). The agent reads "
        "it as yours (`confirmed`) and cannot overwrite it without force. Optional source "
        f"and validity (valid_from/valid_until, {_TIME}). {SLUG_HELP}"
    ),
    "memory_patch": (
        "Owner correction by a one-file unified diff applied exactly; base_hash is the "
        "sha256 of the value you made it against (memory_get, memory_hash); a changed value "
        f"is a `conflict`. {SLUG_HELP}"
    ),
    "memory_revert": (
        "Owner correction back to an earlier version (rev: its id from memory_log), as a "
        f"new version; this also lifts your denial of that value. {SLUG_HELP}"
    ),
}
USAGE = (
    "Your memory survives across sessions. Read more with the memory_get and memory_list "
    "tools; save with memory_set; edit with memory_patch (base_hash from memory_get); link "
    "entries from this profile as [[mem/...]]; update the profile with memory_set on `core`."
)
NUDGE = (
    "# Persistent memory: no core profile yet (engram)\n\n"
    "You have persistent memory, but no core profile: nothing tells you who you are or who "
    "you work for. Early in this session, ask your user about themselves (name, role, "
    "preferences, what they want from you), then create your profile with the memory_set "
    "tool on slug `core` (a short text about you, your user and how you work together). "
    "Save other facts with memory_set and link them from the profile as [[mem/...]]."
)
OWNER_NUDGE = "# Agent memory (engram)\n\nThis agent has no core profile yet."

SlugArg = Annotated[str, Field(description="`notes/x` (`mem/` is added) or `core`.")]
ValueArg = Annotated[
    str, Field(description="The whole new value (text, at most 65,535 bytes).", max_length=65_535)
]
DiffArg = Annotated[
    str,
    Field(description="A one-file unified diff against the current value.", max_length=PATCH_CAP),
]
BaseHashArg = Annotated[
    str,
    Field(
        description="sha256 (64 hex) of the value the diff was made against.",
        pattern=r"^[0-9a-fA-F]{64}$",
    ),
]
QueryArg = Annotated[
    str,
    Field(
        description=(
            "Text to look for (case-insensitive); with regex, a regular expression in Python "
            f"`re` syntax, at most {DEPTH_MAX} groups and repeats deep and at most "
            f"{EXPANDED_MAX:,} elements once its counted repeats are written out."
        ),
        min_length=1,
        max_length=QUERY_MAX,
    ),
]
LimitArg = Annotated[int, Field(description="At most this many matches.", ge=1, le=1000)]
RegexArg = Annotated[bool, Field(description="Treat the query as a regular expression.")]
TimeArg = Annotated[str | None, Field(description=f"A time: {_TIME}.", max_length=64)]
RevArg = Annotated[
    str, Field(description="A version id (or 8+ hex prefix) from memory_log.", max_length=64)
]
TrustArg = Annotated[
    str | None,
    Field(description="`guess` (default: you inferred it) or `stated` (your user said so)."),
]
SourceArg = Annotated[
    str | None,
    Field(description="Where it came from: a session, a tool, a URL.", max_length=1024),
]
ReasonArg = Annotated[str | None, Field(description="Why (recorded).", max_length=1024)]
ForceArg = Annotated[
    bool,
    Field(description="Write a value you removed earlier, or over your owner's correction."),
]
ValidNowArg = Annotated[bool, Field(description="Leave out facts not valid now.")]
