"""`engram acp`: a stdio proxy that gives any ACP agent its memory at session start.

Editor <-> this proxy <-> the real agent (a subprocess). ACP over stdio is JSON-RPC,
one message per line. Every line passes through byte for byte except two:
- a `session/new|load|resume|fork` request starts the fetch hook; with `--inject meta`
  the request waits for it (never longer than the hook's timeout) and carries the result
  in `_meta.systemPrompt.append`;
- with `--inject prompt` (the default) the request goes on at once, the agent's reply
  names the session, and that session's first `session/prompt` gets the result as a
  leading text block (waiting, if needed, for what is left of the hook's timeout).
With `--recall N`, every `session/prompt` also gets, as a leading text block, the N memories
most relevant to the prompt's text (`cli.memory.hook.RecallHook`); a failed or timed-out
recall, or none found, injects nothing.
The proxy never writes anything but forwarded messages to stdout; diagnostics go to stderr.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from cli.memory.hook import HookResult, Nothing, Nudge, Profile

SESSION_OPENERS = frozenset({"session/new", "session/load", "session/resume", "session/fork"})
PROMPT = "session/prompt"
STREAM_LIMIT = 50 * 1024 * 1024  # one JSON-RPC line; prompts may carry images
ENV_NO_MEMORY = "ENGRAM_ACP_NO_MEMORY"

Hook = Callable[[], Awaitable[HookResult]]
Recaller = Callable[[str], Awaitable[str | None]]  # prompt text -> text to inject, or None


class Inject(StrEnum):
    prompt = "prompt"
    meta = "meta"


def log(message: str) -> None:
    print(f"engram acp: {message}", file=sys.stderr, flush=True)


def _decode(line: bytes) -> dict[str, Any] | None:
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def _encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def _id_key(msg: dict[str, Any]) -> str:
    """JSON-RPC ids may be numbers or strings; 1 and "1" are different requests."""
    return json.dumps(msg.get("id"))


def add_system_prompt(params: dict[str, Any], text: str) -> None:
    """Append `text` to `_meta.systemPrompt` (the `systemPrompt.append` convention),
    keeping whatever the editor already put there."""
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        meta = params["_meta"] = {}
    current = meta.get("systemPrompt")
    if isinstance(current, str):
        meta["systemPrompt"] = f"{current}\n\n{text}"
    elif isinstance(current, dict):
        before = current.get("append")
        current["append"] = f"{before}\n\n{text}" if isinstance(before, str) and before else text
    else:
        meta["systemPrompt"] = {"append": text}


async def _outcome(task: asyncio.Future[HookResult]) -> HookResult:
    try:
        result = await task
    except Exception as exc:
        result = Nothing(f"{type(exc).__name__}: {exc}")
    if isinstance(result, Profile):
        log(f"injecting the core profile ({len(result.profile)} characters)")
    elif isinstance(result, Nudge):
        log("no core profile on the relay: injecting the onboarding nudge")
    else:
        log(f"memory not injected: {result.reason}")
    return result


def prompt_text(prompt: list[Any]) -> str:
    """The text blocks of a prompt, joined: what recall is asked about."""
    parts = [
        b["text"]
        for b in prompt
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    ]
    return "\n".join(parts)


class Interceptor:
    """The proxy's only state: hook runs waiting for a session id or a first prompt."""

    def __init__(self, hook: Hook | None, inject: Inject, recall: Recaller | None = None) -> None:
        self.hook = hook
        self.inject = inject
        self.recall = recall
        self._opening: dict[str, tuple[dict[str, Any], asyncio.Future[HookResult]]] = {}
        self._first_prompt: dict[str, asyncio.Future[HookResult]] = {}

    async def from_editor(self, line: bytes) -> bytes:
        """The line to send to the agent (the same bytes unless something is injected)."""
        if self.hook is None and self.recall is None:
            return line
        msg = _decode(line)
        params = msg.get("params") if msg else None
        if msg is None or not isinstance(params, dict) or "id" not in msg:
            return line
        method = msg.get("method")
        if method in SESSION_OPENERS and self.hook is not None:
            task = asyncio.ensure_future(self.hook())
            if self.inject is Inject.prompt:
                self._opening[_id_key(msg)] = (params, task)
                return line
            text = (await _outcome(task)).text
            if text is None:
                return line
            add_system_prompt(params, text)
            return _encode(msg)
        if method == PROMPT:
            pending = self._first_prompt.pop(params.get("sessionId"), None)
            prompt = params.get("prompt")
            if not isinstance(prompt, list):
                return line
            blocks: list[str] = []
            if pending is not None and (text := (await _outcome(pending)).text) is not None:
                blocks.append(text)
            if self.recall is not None and (found := await self.recall(prompt_text(prompt))):
                blocks.append(found)
            if not blocks:
                return line
            params["prompt"] = [*({"type": "text", "text": b} for b in blocks), *prompt]
            return _encode(msg)
        return line

    def from_agent(self, line: bytes) -> None:
        """Watch replies to session openers for the session id; never alters the line."""
        if not self._opening:
            return
        msg = _decode(line)
        if msg is None or "method" in msg or "id" not in msg:
            return
        opened = self._opening.pop(_id_key(msg), None)
        if opened is None:
            return
        params, task = opened
        result = msg.get("result")
        # session/new and fork name the session in the result; load and resume in the request.
        sid = result.get("sessionId") if isinstance(result, dict) else None
        sid = sid or (params.get("sessionId") if isinstance(result, dict) else None)
        if isinstance(sid, str):
            self._first_prompt[sid] = task
        else:  # an error reply: no session was opened
            task.cancel()


async def run_proxy(
    command: list[str],
    interceptor: Interceptor,
    editor_in: asyncio.StreamReader,
    editor_out: asyncio.StreamWriter,
) -> int:
    """Run the agent and pump lines both ways until it exits; returns its exit status."""
    proc = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=STREAM_LIMIT
    )
    assert proc.stdin is not None and proc.stdout is not None
    agent_in, agent_out = proc.stdin, proc.stdout
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, proc.terminate)

    async def editor_to_agent() -> None:
        try:
            while line := await editor_in.readline():
                agent_in.write(await interceptor.from_editor(line))
                await agent_in.drain()
            agent_in.close()  # the editor hung up: EOF tells the agent to finish
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent is gone; agent_to_editor sees its EOF

    async def agent_to_editor() -> None:
        while line := await agent_out.readline():
            interceptor.from_agent(line)
            editor_out.write(line)
            await editor_out.drain()

    upstream = asyncio.ensure_future(editor_to_agent())
    try:
        await agent_to_editor()
    finally:
        upstream.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    code = await proc.wait()
    return code if code >= 0 else 128 - code
