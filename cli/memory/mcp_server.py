"""The `engram mcp` server: the agent's memory as MCP tools, a resource and a prompt.

Any MCP-capable agent host gets read and write access to its memory without a shell. The
server is built on the official `mcp` SDK and speaks stdio (the default: the host starts
`engram mcp` as a subprocess) or, with `--http [HOST:]PORT`, the streamable HTTP transport.
Identity and relays come from the same flags and environment as `engram mem`; the
operations, their validation and their safety rules are the same code as the CLI's.

Every failure is a tool result with `isError` set, whose text is one line `CODE: message`
(also given as structured content `{"code", "message"}`), CODE one of `ERROR_CODES`. No
secret key is ever returned or logged, and a key only ever reads what it can decrypt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

from cli.errors import AgentMemoryError
from cli.memory.api import AgentMemory, CoreRead, SetReport, WriteResult
from cli.memory.hook import HEADER
from cli.memory.mcp_auth import StaticToken, auth_settings
from engram import EngramError

T = TypeVar("T")

CORE_URI = "engram://core"
CORE_PROMPT = "core_profile"
PATCH_CAP = 1 << 20  # as `engram mem patch`: a larger diff is refused, never truncated
WRITE_TOOLS = ("memory_set", "memory_patch", "memory_delete")

# Stable, machine-readable error codes: the CLI's exit codes 1-5 by meaning, plus "error".
ERROR_CODES = ("bad_input", "not_found", "relay", "auth", "conflict", "error")

log = logging.getLogger("engram.mcp")


# --- what the agent reads: instructions and tool descriptions ------------------------------

SLUG_HELP = (
    "Slug: a path such as `notes/project-x` (`mem/` is added when missing; segments of "
    "lower-case letters, digits, `-` and `_`), or `core` for your profile."
)
INSTRUCTIONS = (
    "Persistent memory for this agent: text values under slugs, stored end-to-end encrypted "
    "on Nostr relays and kept across sessions. `core` is your profile (who you are, who you "
    f"work for, how you work together): read it first, from the resource {CORE_URI} or the "
    f"prompt `{CORE_PROMPT}`. Link other memories from the profile or from each other as "
    "[[mem/slug]] so they stay reachable (memory_refs). To change a value, memory_get it "
    "(the result includes its sha256), then memory_patch with that base_hash; memory_set "
    "replaces the whole value. To find a memory whose slug you do not know, ask "
    "memory_recall in plain words."
)
DESCRIPTIONS = {
    "memory_recall": (
        "The memories most relevant to a question or a few words in plain language, best "
        "first: slug, value, score (higher is better), created_at. Ranked locally after "
        "decryption (words and embeddings, fused): the query never leaves this machine. Use "
        "it before memory_set to find what you already know."
    ),
    "memory_get": (
        "Read one memory. The first text block is the value exactly as stored; the second "
        "gives its sha256, the base_hash for memory_patch. `core` returns your profile. "
        f"{SLUG_HELP} Links to other memories look like [[mem/slug]]."
    ),
    "memory_hash": (
        f"The sha256 (hex) of a memory's current value: the base_hash for memory_patch. {SLUG_HELP}"
    ),
    "memory_list": (
        "List your memories: slug, created_at (unix seconds) and event id, sorted by slug. "
        "`core` (your profile) and deleted memories are not listed."
    ),
    "memory_search": (
        "Search slugs and values for a text (case-insensitive), best matches first, with a "
        "one-line snippet each. The search runs locally after decryption: the query never "
        "leaves this machine."
    ),
    "memory_refs": (
        "Which memories are reachable from `core` through [[mem/slug]] links, which are "
        "orphans (nothing links to them) and which links are dangling (point at nothing). "
        "Nothing is deleted: decide yourself what to link or remove."
    ),
    "memory_set": (
        "Create a memory or replace its whole value (at most 65,535 bytes once encoded). "
        "Use it for new memories; to edit an existing one prefer memory_patch with a "
        "base_hash, which cannot overwrite a change you have not seen. `core` is your "
        f"profile: keep it short and link details as [[mem/slug]]. {SLUG_HELP}"
    ),
    "memory_patch": (
        "Edit a memory by applying a one-file unified diff exactly (no fuzz, no offset). "
        "base_hash is the sha256 of the value you made the diff against (from memory_get or "
        "memory_hash); if the memory changed since, nothing is written and the error code "
        "is `conflict`: read it again and redo the diff. An absent memory patches as the "
        f"empty value. {SLUG_HELP}"
    ),
    "memory_delete": (
        "Delete a memory (publishes a tombstone). `core` cannot be deleted: to clear your "
        "profile, memory_set it to a shorter text. Remove [[mem/slug]] links to it too "
        f"(memory_refs shows them as dangling). {SLUG_HELP}"
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
    str, Field(description="Text to look for (case-insensitive).", min_length=1, max_length=1000)
]
LimitArg = Annotated[int, Field(description="At most this many matches.", ge=1, le=1000)]
RegexArg = Annotated[bool, Field(description="Treat the query as a regular expression.")]

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DELETE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


# --- results and errors ---------------------------------------------------------------------


def one_line(text: str) -> str:
    return " ".join(text.split()) or "error"


def classify(exc: BaseException) -> tuple[str, str]:
    """(code, one-line message) for a failed call; neither ever carries a secret.

    AgentMemory's errors carry their code and messages written never to include a key or
    another key's plaintext; an unexpected exception is named by its type only.
    """
    if isinstance(exc, AgentMemoryError) and exc.code in ERROR_CODES:
        return exc.code, one_line(str(exc))
    if isinstance(exc, TimeoutError):
        return "relay", one_line(str(exc) or "timed out waiting for the relay")
    if isinstance(exc, EngramError):  # invalid slug or body: the caller's input
        return "bad_input", one_line(str(exc))
    return "error", f"unexpected error: {type(exc).__name__}"


def failure(code: str, message: str) -> CallToolResult:
    """An MCP tool error: `isError`, one line `CODE: message`, and the same as JSON."""
    message = one_line(message)
    return CallToolResult(
        content=[TextContent(type="text", text=f"{code}: {message}")],
        structured_content={"code": code, "message": message},
        is_error=True,
    )


def success(texts: list[str], data: dict[str, Any], report: SetReport) -> CallToolResult:
    """A result: text blocks for the model, the same facts as structured content.

    What the relay set had to say (a relay that failed or is behind, events skipped as
    invalid) is one more text block, and `relays` in the structured content.
    """
    notes = report.warnings()
    if notes:
        texts = [*texts, "note: " + "; ".join(notes)]
    data = {**data, "relays": report.as_json()}
    return CallToolResult(
        content=[TextContent(type="text", text=text) for text in texts], structured_content=data
    )


def validation_message(exc: ValidationError) -> str:
    """Field names and pydantic's reason only: the rejected values are never echoed."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "invalid arguments: " + "; ".join(parts)


async def bounded(op: Callable[[], Awaitable[T]], timeout: float) -> T:
    """Run `op` with a hard deadline that holds even while a connection is being torn down.

    The operation runs as its own task: past the deadline it is cancelled and left to
    finish closing in the background, so the caller never waits longer than `timeout`.
    """
    task = asyncio.ensure_future(op())
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    finally:  # past the deadline, or the MCP client cancelled the call
        if not task.done():
            task.cancel()
            task.add_done_callback(_retrieve)
    if not done:
        raise TimeoutError(f"no answer from the relay within {timeout:g} s")
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Consume a cancelled call's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


class EngramMCP(MCPServer):
    """MCPServer whose argument errors and unknown tools are `bad_input` tool errors too.

    The SDK reports those as multi-line text without a code; here every failed call has
    the same one-line, coded shape, so a client can branch on it.
    """

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                return failure("bad_input", validation_message(cause))
            if self._tool_manager.get_tool(name) is None:
                why = " (this is a read-only session)" if name in WRITE_TOOLS else ""
                return failure("bad_input", f"unknown tool: {name}{why}")
            log.error("tool %s failed: %s", name, type(cause).__name__)
            return failure("error", f"unexpected error in {name}")


# --- the server -----------------------------------------------------------------------------


def inner_timeout(timeout: float) -> float:
    """AgentMemory's deadline inside a call bounded by `timeout`: a little earlier."""
    return timeout - min(0.5, timeout / 5)


def build_server(
    memory: AgentMemory, timeout: float, token: str | None = None, base_url: str = ""
) -> EngramMCP:
    """The MCP server over `memory`; the write tools only when the held key may write.

    Every call is cut off after `timeout` seconds whatever the relays do. Give `memory` a
    slightly shorter deadline (`inner_timeout`), so that with a relay set its own deadline
    comes first and the relays that did answer still give a result. With `token`, its
    HTTP transport (served at `base_url`) answers only requests bearing it (mcp_auth).
    """
    server = EngramMCP(
        "engram",
        title="engram agent memory",
        instructions=INSTRUCTIONS,
        version=_version(),
        log_level="WARNING",
        token_verifier=None if token is None else StaticToken(token),
        auth=None if token is None else auth_settings(base_url),
    )

    async def call(
        op: Callable[[], Awaitable[CallToolResult]], slug: str | None = None
    ) -> CallToolResult:
        """Run one tool call within `timeout`; `slug` marks a write, whose event may have
        reached a relay before the deadline cut it off."""
        try:
            return await bounded(op, timeout)
        except TimeoutError as exc:
            if slug is None:
                return failure(*classify(exc))
            return failure(
                "relay",
                f"{exc}; the write was cut off at its deadline, so the memory MAY have been "
                f"written: memory_get {slug} before writing it again",
            )
        except Exception as exc:
            code, message = classify(exc)
            if code == "error":
                log.error("tool call failed: %s", message)
            return failure(code, message)

    async def memory_get(slug: SlugArg) -> CallToolResult:
        async def op() -> CallToolResult:
            entry = await memory.get(slug)
            data = {
                "slug": entry.slug,
                "value": entry.value,
                "sha256": entry.sha256,
                "event_id": entry.event_id,
                "created_at": entry.created_at,
            }
            texts = [entry.value, f"sha256 {entry.sha256} (the base_hash for memory_patch)"]
            return success(texts, data, entry.report)

        return await call(op)

    async def memory_hash(slug: SlugArg) -> CallToolResult:
        async def op() -> CallToolResult:
            entry = await memory.get(slug)
            return success(
                [entry.sha256], {"slug": entry.slug, "sha256": entry.sha256}, entry.report
            )

        return await call(op)

    async def memory_list() -> CallToolResult:
        async def op() -> CallToolResult:
            found = await memory.ls()
            rows = found.entries
            lines = [f"{r.slug}\t{r.created_at}\t{r.event_id}" for r in rows]
            data = [
                {"slug": r.slug, "created_at": r.created_at, "event_id": r.event_id} for r in rows
            ]
            text = "\n".join(lines) or "(no memories)"
            return success([text], {"memories": data}, found.report)

        return await call(op)

    async def memory_search(
        query: QueryArg, limit: LimitArg = 20, regex: RegexArg = False
    ) -> CallToolResult:
        async def op() -> CallToolResult:
            hits = await memory.search(query, regex=regex, limit=limit)
            lines = [f"{m.slug}\t{m.snippet}" for m in hits]
            data = [
                {
                    "slug": m.slug,
                    "snippet": m.snippet,
                    "created_at": m.created_at,
                    "event_id": m.event_id,
                }
                for m in hits
            ]
            text = "\n".join(lines) or "(no matches)"
            return success([text], {"matches": data}, hits.report)

        return await call(op)

    async def memory_recall(query: QueryArg, limit: LimitArg = 10) -> CallToolResult:
        async def op() -> CallToolResult:
            from cli.memory.recall.present import hit_json

            found = await memory.recall(query, limit)
            rows = [hit_json(h, query) for h in found.hits]
            lines = [
                f"{r['slug']}\t{r['score']:.6f}\t{r['created_at']}\t{one_line(r['value'])}"
                for r in rows
            ]
            text = "\n".join(lines) or "(no memories)"
            return success([text], {"memories": rows}, found.report)

        return await call(op)

    async def memory_refs() -> CallToolResult:
        async def op() -> CallToolResult:
            graph = await memory.refs()
            lines = [f"reachable\t{s}" for s in graph.reachable]
            lines += [f"orphan\t{s}" for s in graph.orphans]
            lines += [f"dangling\t{t}\t(linked from {s})" for s, t in graph.dangling]
            if not graph.has_core:
                lines.insert(0, "no core profile: every memory is an orphan")
            data = {
                "core": graph.has_core,
                "reachable": graph.reachable,
                "orphans": graph.orphans,
                "dangling": [{"from": s, "to": t} for s, t in graph.dangling],
            }
            return success(["\n".join(lines) or "(no memories)"], data, graph.report)

        return await call(op)

    async def memory_set(slug: SlugArg, value: ValueArg) -> CallToolResult:
        return await call(lambda: written(memory.set(slug, value), "saved"), slug)

    async def memory_patch(slug: SlugArg, diff: DiffArg, base_hash: BaseHashArg) -> CallToolResult:
        return await call(lambda: written(memory.patch(slug, diff, base_hash), "patched"), slug)

    async def memory_delete(slug: SlugArg) -> CallToolResult:
        return await call(lambda: written(memory.rm(slug), "deleted"), slug)

    tools: list[tuple[Callable[..., Any], ToolAnnotations]] = [
        (memory_get, READ),
        (memory_hash, READ),
        (memory_list, READ),
        (memory_search, READ),
        (memory_recall, READ),
        (memory_refs, READ),
    ]
    if not memory.read_only:
        tools += [(memory_set, WRITE), (memory_patch, WRITE), (memory_delete, DELETE)]
    for fn, hints in tools:
        server.add_tool(fn, description=DESCRIPTIONS[fn.__name__], annotations=hints)

    async def core_text() -> str | None:
        """The fetch hook's three outcomes: profile, nudge (core confirmed absent), None."""
        try:
            read = await bounded(memory.core, timeout)
        except TimeoutError as exc:
            read = CoreRead("unknown", reason=str(exc))
        if read.status == "profile":
            if memory.read_only:
                return f"# The agent's core profile (engram)\n\n{read.profile}"
            return f"{HEADER}\n\n{read.profile}\n\n{USAGE}"
        if read.status == "absent":
            return OWNER_NUDGE if memory.read_only else NUDGE
        log.warning("core profile not read: %s", one_line(read.reason))
        return None

    @server.resource(
        CORE_URI,
        name="core",
        title="Core profile",
        description=(
            "Your core profile with how to use your memory; the nudge to create one when the "
            "relays confirmed there is none; empty when it could not be read."
        ),
        mime_type="text/markdown",
    )
    async def core_resource() -> str:
        return await core_text() or ""

    @server.prompt(
        name=CORE_PROMPT,
        title="Core profile",
        description=(
            "Your core profile for the start of a session; the nudge to create one when there "
            "is none; no message when it could not be read."
        ),
    )
    async def core_prompt() -> list[UserMessage]:
        text = await core_text()
        return [] if text is None else [UserMessage(text)]

    return server


async def written(write: Awaitable[WriteResult], verb: str) -> CallToolResult:
    """A write's result: the slug, the new event id and the new value's hash."""
    result = await write
    text = f"{verb} {result.slug} (event {result.event_id}"
    text += f"; sha256 {result.sha256})" if result.sha256 else ")"
    data: dict[str, Any] = {"slug": result.slug, "event_id": result.event_id}
    if result.sha256:
        data["sha256"] = result.sha256
    texts = [text]
    if result.refused:  # written on some relays of the set, not on these
        data["refused"] = result.refused
        said_no = {u: r for u, r in result.refused.items() if u not in result.report.failed}
        if said_no:
            where = "; ".join(f"{url}: {why}" for url, why in said_no.items())
            texts.append(f"note: not written on {where}")
    if result.similar:  # write-time hints (memory_set): never a refusal
        data["similar"] = [{"slug": n.slug, "score": n.score} for n in result.similar]
        names = ", ".join(f"{n.slug} ({n.score:.2f})" for n in result.similar)
        texts.append(
            f"note: similar memories already exist: {names}; consider memory_patch on one of "
            "them (or memory_delete the duplicate) rather than keeping near-duplicates"
        )
    return success(texts, data, result.report)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("engram-relay")
    except PackageNotFoundError:
        return ""
