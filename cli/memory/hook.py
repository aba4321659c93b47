"""The fetch hook: read `core` once, with a deadline, at session creation (spec: *Read-path
hygiene for agents*).

Three outcomes, one type each, so no caller can confuse them:
- `Profile`: core reads as live (the rule of `engram.live`: owner corrections outrank the
  agent's own); its profile is rendered under a fixed header with its trust.
- `Nudge`: every relay of the set answered and none holds anything at core's address, or
  core reads as denied by the owner (or forgotten): tell the agent to create one.
- `Nothing`: timeout, transport or auth failure, or candidates that all failed
  validation. A failed read must never teach the agent that it has no memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cli.memory.api import AgentMemory
from cli.nostr.identity import Identity

DEFAULT_HOOK_TIMEOUT = 3.0
CLOSE_GRACE = 0.25  # past the read's own deadline, for closing connections
HEADER = "# Persistent memory: your core profile (engram)"
USAGE = (
    "Your memory lives on a Nostr relay and survives across sessions. Read more with "
    "`engram mem get SLUG` and `engram mem ls`; save with `engram mem set SLUG VALUE`; "
    "link entries from your profile as [[mem/...]]; update this profile with "
    '`engram mem set core "…"`.'
)
NUDGE = (
    "# Persistent memory: no core profile yet (engram)\n\n"
    "You have persistent memory on a Nostr relay, but no core profile: nothing tells you who "
    "you are or who you work for. Early in this session, ask your user about themselves "
    "(name, role, preferences, what they want from you), then create your profile with "
    '`engram mem set core "…"` (a short text about you, your user and how you work '
    "together). Save other facts with `engram mem set SLUG VALUE` and link them from the "
    "profile as [[mem/...]]."
)


class Trusted(Protocol):
    trust: str | None
    role: str
    ended: bool


def trust_line(read: Trusted) -> str:
    """One line saying how far the profile is to be trusted and who wrote it."""
    who = "your owner" if read.role == "owner" else "you"
    ended = "; its validity has ended" if read.ended else ""
    return f"Profile trust: {read.trust or 'not recorded'}; written by {who}{ended}."


@dataclass(frozen=True)
class Profile:
    """A live core was read; `text` is what to inject: the profile, its trust, usage."""

    profile: str
    trust: str | None = None
    role: str = "agent"
    ended: bool = False

    @property
    def text(self) -> str:
        return f"{HEADER}\n\n{self.profile}\n\n{trust_line(self)}\n\n{USAGE}"


@dataclass(frozen=True)
class Nudge:
    """The relay confirmed there is no core: ask the agent to create one."""

    @property
    def text(self) -> str:
        return NUDGE


@dataclass(frozen=True)
class Nothing:
    """The read failed or was inconclusive: inject nothing. `reason` is for stderr only."""

    reason: str

    @property
    def text(self) -> None:
        return None


HookResult = Profile | Nudge | Nothing


async def _read_core(ident: Identity, urls: str | Sequence[str], timeout: float) -> HookResult:
    read = await AgentMemory(ident, urls, timeout=timeout).core()
    if read.status == "profile" and read.profile is not None:
        return Profile(read.profile, read.trust, read.role, read.ended)
    if read.status == "absent":
        return Nudge()
    return Nothing(read.reason)


async def fetch_core(
    ident: Identity, url: str | Sequence[str], timeout: float = DEFAULT_HOOK_TIMEOUT
) -> HookResult:
    """Fetch core once from a relay or a relay set (a list, or comma-separated URLs);
    return within `timeout` seconds whatever the relays do.

    The deadline bounds the whole read, not each relay. The read runs as its own task
    so the deadline holds even while connections are being torn down: past it, the task
    is cancelled and left to finish in the background.
    """
    task = asyncio.ensure_future(_read_core(ident, url, timeout))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout + CLOSE_GRACE)
    finally:  # past the deadline, or the caller gave up: stop reading either way
        if not task.done():
            task.cancel()
            task.add_done_callback(_retrieve)
    if not done:
        return Nothing(f"no answer from {url} within {timeout:g} s")
    try:
        return task.result()
    except Exception as exc:  # any failure to read is "nothing", never the nudge
        return Nothing(f"{type(exc).__name__}: {exc}")


RECALL_HEADER = "# Memories relevant to this prompt (engram recall)"
RECALL_VALUE_CHARS = 600  # of each memory's value, on one line


class RecallHook:
    """`engram acp --recall N`: the N memories most relevant to a prompt, as text to
    inject, or None (same rule as core: a failed, timed-out or empty recall injects
    nothing, never "you have no memory").

    One `AgentMemory` for the proxy's life, so its recall index stays in memory and follows
    changes. A recall past `timeout` is not cancelled: it goes on warming the index for the
    next prompt."""

    def __init__(self, memory: AgentMemory, n: int, timeout: float) -> None:
        self.memory = memory
        self.n = n
        self.timeout = timeout

    async def __call__(self, text: str) -> str | None:
        if not text.strip():
            return None
        task = asyncio.ensure_future(self.memory.recall(text[:4000], self.n))
        done, _ = await asyncio.wait({task}, timeout=self.timeout)
        if not done:
            task.add_done_callback(_retrieve)
            log_reason(f"recall not injected: no answer within {self.timeout:g} s")
            return None
        try:
            found = task.result()
        except Exception as exc:
            log_reason(f"recall not injected: {type(exc).__name__}: {exc}")
            return None
        if not found.hits:
            return None
        from cli.memory.recall.present import ended  # loaded with recall, as the hits were

        lines = [RECALL_HEADER, ""]
        for h in found.hits:
            value = " ".join(h.value.split())
            if len(value) > RECALL_VALUE_CHARS:
                value = value[:RECALL_VALUE_CHARS] + "…"
            about = f"created_at {h.created_at}, trust {h.trust or 'not recorded'}"
            if h.role == "owner":
                about += ", from your owner"
            if ended(h):
                about += ", validity ended"
            lines.append(f"- [[{h.slug}]] ({about}): {value}")
        return "\n".join(lines)


def log_reason(message: str) -> None:
    import sys

    print(f"engram acp: {message}", file=sys.stderr, flush=True)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Consume a cancelled read's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()
