"""Driving `engram acp` as an editor does: the real proxy process in front of a small real
ACP agent (tests/acp_agent_fixture.py) that logs every request it receives."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process
from cli_support import ENGRAM, ROOT

FIXTURE = str(Path(__file__).with_name("acp_agent_fixture.py"))
# How long a proxied request may take at most on a loaded machine: an outer bound that
# catches a hang, not a claim about speed (which timeout applied is read from stderr).
BOUND = 30.0
# The SDK gives the proxy 2 s to exit after stdin closes before SIGTERM; on a loaded machine
# that is too short for an orderly exit, so give it a generous one.
SHUTDOWN = 30.0


class Editor:
    """The editor side: collects session updates, refuses everything else."""

    def __init__(self) -> None:
        self.updates: list[Any] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise RequestError.method_not_found("session/request_permission")


class Run:
    def __init__(self, log: Path, editor: Editor, stderr: Path) -> None:
        self.log = log
        self.editor = editor
        self.stderr = stderr

    def diagnostics(self) -> str:
        """What the proxy wrote to stderr (its one line per hook outcome)."""
        return self.stderr.read_text() if self.stderr.exists() else ""

    def received(self, method: str) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [r for r in map(json.loads, lines) if r["method"] == method]


@asynccontextmanager
async def proxied(
    tmp_path: Path, env: dict[str, str], *options: str
) -> AsyncIterator[tuple[Any, Run]]:
    """`engram acp OPTIONS -- python acp_agent_fixture.py`, initialized, as a connection."""
    log = tmp_path / f"agent-{time.monotonic_ns()}.jsonl"
    stderr = log.with_suffix(".stderr")
    editor = Editor()
    with stderr.open("wb") as err:
        async with spawn_agent_process(
            editor,
            ENGRAM[0],
            *ENGRAM[1:],
            "acp",
            *options,
            "--",
            sys.executable,
            FIXTURE,
            env=env | {"ACP_FIXTURE_LOG": str(log)},
            cwd=ROOT,
            transport_kwargs={"stderr": err.fileno(), "shutdown_timeout": SHUTDOWN},
        ) as (conn, _proc):
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            yield conn, Run(log, editor, stderr)


def user_block(text: str = "hello") -> dict[str, str]:
    return {"type": "text", "text": text}
