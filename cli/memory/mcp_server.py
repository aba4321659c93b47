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
from typing import Any, TypeVar

import msgspec
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ValidationError

from cli.memory.api import AgentMemory, CoreRead, SetReport, WriteResult
from cli.memory.hook import HEADER, trust_line
from cli.memory.mcp_auth import StaticToken, auth_settings
from cli.memory.mcp_text import (
    CORE_PROMPT,
    CORE_URI,
    DESCRIPTIONS,
    INSTRUCTIONS,
    NUDGE,
    OWNER_DESCRIPTIONS,
    OWNER_INSTRUCTIONS,
    OWNER_NUDGE,
    USAGE,
    BaseHashArg,
    DiffArg,
    ForceArg,
    LimitArg,
    QueryArg,
    ReasonArg,
    RegexArg,
    RevArg,
    SlugArg,
    SourceArg,
    TimeArg,
    TrustArg,
    ValidNowArg,
    ValueArg,
)
from cli.nostr.errors import AgentMemoryError, BadInputError
from cli.nostr.timeparse import parse_time
from engram import EngramError

T = TypeVar("T")

# Tools by who may call them: the agent's key writes versions, the owner's key verdicts.
AGENT_TOOLS = ("memory_delete",)
OWNER_TOOLS = ("memory_confirm", "memory_deny")
WRITE_TOOLS = ("memory_set", "memory_patch", "memory_revert", *AGENT_TOOLS, *OWNER_TOOLS)

# Stable, machine-readable error codes: the CLI's exit codes 1-5 by meaning, plus "error".
ERROR_CODES = ("bad_input", "not_found", "refused", "relay", "auth", "conflict", "error")

log = logging.getLogger("engram.mcp")

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
                why = ""
                if name in AGENT_TOOLS:
                    why = " (an owner session: deny a memory with memory_deny)"
                elif name in OWNER_TOOLS:
                    why = " (verdicts are the owner's: an owner session has them)"
                return failure("bad_input", f"unknown tool: {name}{why}")
            log.error("tool %s failed: %s", name, type(cause).__name__)
            return failure("error", f"unexpected error in {name}")


# --- the server -----------------------------------------------------------------------------


def inner_timeout(timeout: float) -> float:
    """AgentMemory's deadline inside a call bounded by `timeout`: a little earlier."""
    return timeout - min(0.5, timeout / 5)


def described(
    trust: str | None, role: str, valid_from: int | None, valid_until: int | None, ended: bool
) -> str:
    """`trust stated, written by the agent, valid until 1714521600 (ended)` for the model."""
    text = f"trust {trust or 'not given'}, written by the {role}"
    if valid_from is not None:
        text += f", valid from {valid_from}"
    if valid_until is not None:
        text += f", valid until {valid_until}" + (" (ended)" if ended else "")
    return text


def when(text: str | None, name: str) -> int | None:
    """A time argument: unix seconds or ISO 8601 (bad_input otherwise)."""
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError:
        raise BadInputError(f"{name}: not unix seconds or an ISO 8601 time") from None


class MemoryTools:
    """The tools over one AgentMemory: the agent's, or with the owner's key the owner's
    (corrections, confirm, deny; no delete). Every call is cut off after `timeout`
    seconds whatever the relays do (`call`); failures are coded tool results."""

    def __init__(self, memory: AgentMemory, timeout: float) -> None:
        self.memory = memory
        self.timeout = timeout

    async def call(
        self, op: Callable[[], Awaitable[CallToolResult]], slug: str | None = None
    ) -> CallToolResult:
        """Run one tool call within `timeout`; `slug` marks a write, whose event may have
        reached a relay before the deadline cut it off."""
        try:
            return await bounded(op, self.timeout)
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

    async def memory_get(
        self,
        slug: SlugArg,
        as_of: TimeArg = None,
        rev: RevArg | None = None,
        valid_at: TimeArg = None,
    ) -> CallToolResult:
        async def op() -> CallToolResult:
            entry = await self.memory.get(
                slug,
                as_of=when(as_of, "as_of"),
                rev=rev,
                valid_at=when(valid_at, "valid_at"),
            )
            data = {**entry.as_json(), "sha256": entry.sha256, "event_id": entry.event_id}
            about = f"sha256 {entry.sha256} (the base_hash for memory_patch); " + described(
                entry.trust, entry.role, entry.valid_from, entry.valid_until, entry.ended
            )
            return success([entry.value, about], data, entry.report)

        return await self.call(op)

    async def memory_hash(self, slug: SlugArg) -> CallToolResult:
        async def op() -> CallToolResult:
            entry = await self.memory.get(slug)
            return success(
                [entry.sha256], {"slug": entry.slug, "sha256": entry.sha256}, entry.report
            )

        return await self.call(op)

    async def memory_list(self, valid_now: ValidNowArg = False) -> CallToolResult:
        async def op() -> CallToolResult:
            found = await self.memory.ls(valid_now=valid_now)
            rows = found.entries
            lines = [
                f"{r.slug}\t{r.created_at}\t{r.event_id}\t{r.trust or '-'}"
                + ("\tended" if r.ended else "")
                for r in rows
            ]
            data = [msgspec.structs.asdict(r) for r in rows]
            text = "\n".join(lines) or "(no memories)"
            return success([text], {"memories": data}, found.report)

        return await self.call(op)

    async def memory_search(
        self,
        query: QueryArg,
        limit: LimitArg = 20,
        regex: RegexArg = False,
        valid_now: ValidNowArg = False,
    ) -> CallToolResult:
        async def op() -> CallToolResult:
            hits = await self.memory.search(query, regex=regex, limit=limit, valid_now=valid_now)
            lines = [
                f"{m.slug}\t{m.snippet}\t{m.trust or '-'}" + ("\tended" if m.ended else "")
                for m in hits
            ]
            data = [
                {
                    "slug": m.slug,
                    "snippet": m.snippet,
                    "created_at": m.created_at,
                    "event_id": m.event_id,
                    "trust": m.trust,
                    "role": m.role,
                    "valid_until": m.valid_until,
                    "ended": m.ended,
                }
                for m in hits
            ]
            text = "\n".join(lines) or "(no matches)"
            return success([text], {"matches": data}, hits.report)

        return await self.call(op)

    async def memory_recall(
        self, query: QueryArg, limit: LimitArg = 10, valid_now: ValidNowArg = False
    ) -> CallToolResult:
        async def op() -> CallToolResult:
            from cli.memory.recall.present import hit_json

            found = await self.memory.recall(query, limit, valid_now=valid_now)
            rows = [hit_json(h, query) for h in found.hits]
            lines = [
                f"{r['slug']}\t{r['score']:.6f}\t{r['created_at']}\t{r['trust'] or '-'}"
                + ("\tended" if r["ended"] else "")
                + f"\t{one_line(r['value'])}"
                for r in rows
            ]
            text = "\n".join(lines) or "(no memories)"
            return success([text], {"memories": rows}, found.report)

        return await self.call(op)

    async def memory_refs(self) -> CallToolResult:
        async def op() -> CallToolResult:
            graph = await self.memory.refs()
            lines = [f"reachable\t{s}\t{graph.trust.get(s) or '-'}" for s in graph.reachable]
            lines += [f"orphan\t{s}\t{graph.trust.get(s) or '-'}" for s in graph.orphans]
            lines += [f"dangling\t{t}\t(linked from {s})" for s, t in graph.dangling]
            if not graph.has_core:
                lines.insert(0, "no core profile: every memory is an orphan")
            data = {
                "core": graph.has_core,
                "reachable": graph.reachable,
                "orphans": graph.orphans,
                "dangling": [{"from": s, "to": t} for s, t in graph.dangling],
                "trust": graph.trust,
                "ended": graph.ended,
            }
            return success(["\n".join(lines) or "(no memories)"], data, graph.report)

        return await self.call(op)

    async def memory_log(self, slug: SlugArg) -> CallToolResult:
        async def op() -> CallToolResult:
            history = await self.memory.log(slug)
            lines = [
                f"{v.id}\t{v.created_at}\t{v.role}\t{v.trust or '-'}\t{v.state}"
                + (f"\t{' '.join(v.source.split())}" if v.source else "")
                for v in history.versions
            ]
            data = {
                "slug": history.slug,
                "versions": [msgspec.structs.asdict(v) for v in history.versions],
            }
            return success(["\n".join(lines)], data, history.report)

        return await self.call(op)

    async def memory_set(
        self,
        slug: SlugArg,
        value: ValueArg,
        trust: TrustArg = None,
        source: SourceArg = None,
        valid_from: TimeArg = None,
        valid_until: TimeArg = None,
        force: ForceArg = False,
    ) -> CallToolResult:
        async def write() -> WriteResult:
            return await self.memory.set(
                slug,
                value,
                trust=trust,
                source=source,
                valid_from=when(valid_from, "valid_from"),
                valid_until=when(valid_until, "valid_until"),
                force=force,
            )

        return await self.call(lambda: written(write(), "saved"), slug)

    async def memory_patch(
        self, slug: SlugArg, diff: DiffArg, base_hash: BaseHashArg, force: ForceArg = False
    ) -> CallToolResult:
        return await self.call(
            lambda: written(self.memory.patch(slug, diff, base_hash, force=force), "patched"), slug
        )

    async def memory_delete(self, slug: SlugArg, reason: ReasonArg = None) -> CallToolResult:
        return await self.call(
            lambda: written(self.memory.rm(slug, reason=reason), "deleted"), slug
        )

    async def memory_revert(
        self, slug: SlugArg, rev: RevArg, force: ForceArg = False
    ) -> CallToolResult:
        return await self.call(
            lambda: written(self.memory.revert(slug, rev, force=force), "reverted"), slug
        )

    async def memory_confirm(self, slug: SlugArg, source: SourceArg = None) -> CallToolResult:
        return await self.call(
            lambda: written(self.memory.confirm(slug, source=source), "confirmed"), slug
        )

    async def memory_deny(self, slug: SlugArg, reason: ReasonArg = None) -> CallToolResult:
        return await self.call(
            lambda: written(self.memory.deny(slug, reason=reason), "denied"), slug
        )

    def offered(self) -> list[tuple[Callable[..., Any], ToolAnnotations]]:
        """The tools of this memory's role, with their hints."""
        tools: list[tuple[Callable[..., Any], ToolAnnotations]] = [
            (self.memory_get, READ),
            (self.memory_hash, READ),
            (self.memory_list, READ),
            (self.memory_search, READ),
            (self.memory_recall, READ),
            (self.memory_refs, READ),
            (self.memory_log, READ),
            (self.memory_set, WRITE),
            (self.memory_patch, WRITE),
            (self.memory_revert, WRITE),
        ]
        if self.memory.role == "owner":
            return [*tools, (self.memory_confirm, WRITE), (self.memory_deny, DELETE)]
        return [*tools, (self.memory_delete, DELETE)]

    async def core_text(self) -> str | None:
        """The fetch hook's three outcomes: profile, nudge (core confirmed absent), None."""
        try:
            read = await bounded(self.memory.core, self.timeout)
        except TimeoutError as exc:
            read = CoreRead("unknown", reason=str(exc))
        owner = self.memory.role == "owner"
        if read.status == "profile":
            note = trust_line(read)
            if owner:
                return f"# The agent's core profile (engram)\n\n{read.profile}\n\n{note}"
            return f"{HEADER}\n\n{read.profile}\n\n{note}\n\n{USAGE}"
        if read.status == "absent":
            return OWNER_NUDGE if owner else NUDGE
        log.warning("core profile not read: %s", one_line(read.reason))
        return None


def build_server(
    memory: AgentMemory, timeout: float, token: str | None = None, base_url: str = ""
) -> EngramMCP:
    """The MCP server over `memory`: its role's tools (MemoryTools), the core profile as
    a resource and as a prompt.

    Every call is cut off after `timeout` seconds whatever the relays do. Give `memory` a
    slightly shorter deadline (`inner_timeout`), so that with a relay set its own deadline
    comes first and the relays that did answer still give a result. With `token`, its
    HTTP transport (served at `base_url`) answers only requests bearing it (mcp_auth).
    """
    owner = memory.role == "owner"
    server = EngramMCP(
        "engram",
        title="engram agent memory",
        instructions=OWNER_INSTRUCTIONS if owner else INSTRUCTIONS,
        version=_version(),
        log_level="WARNING",
        token_verifier=None if token is None else StaticToken(token),
        auth=None if token is None else auth_settings(base_url),
    )
    tools = MemoryTools(memory, timeout)
    texts = {**DESCRIPTIONS, **OWNER_DESCRIPTIONS} if owner else DESCRIPTIONS
    for fn, hints in tools.offered():
        server.add_tool(fn, description=texts[fn.__name__], annotations=hints)

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
        return await tools.core_text() or ""

    @server.prompt(
        name=CORE_PROMPT,
        title="Core profile",
        description=(
            "Your core profile for the start of a session; the nudge to create one when there "
            "is none; no message when it could not be read."
        ),
    )
    async def core_prompt() -> list[UserMessage]:
        text = await tools.core_text()
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
