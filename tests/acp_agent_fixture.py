"""A small real ACP agent, written with the `acp` SDK, for the `engram acp` proxy tests.

It answers initialize, session/new, session/load and session/prompt, and appends one JSON
line per request it receives to the file named by `ACP_FIXTURE_LOG`: the tests read that
file to see exactly what reached the agent through the proxy.
Run as a script: `python tests/acp_agent_fixture.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    update_agent_message_text,
)
from acp.schema import AgentCapabilities


def record(entry: dict[str, Any]) -> None:
    path = os.environ.get("ACP_FIXTURE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")


class RecordingAgent:
    """Records each request; replies with the minimum the protocol requires."""

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        record({"method": "initialize"})
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(load_session=True),
        )

    async def new_session(self, cwd: str, mcp_servers: Any = None, **meta: Any) -> Any:
        session_id = uuid.uuid4().hex
        record({"method": "session/new", "session_id": session_id, "cwd": cwd, "meta": meta})
        return NewSessionResponse(session_id=session_id)

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, **meta: Any
    ) -> LoadSessionResponse:
        record({"method": "session/load", "session_id": session_id, "meta": meta})
        return LoadSessionResponse()

    async def prompt(self, session_id: str, prompt: list[Any], **meta: Any) -> PromptResponse:
        blocks = [block.model_dump(by_alias=True, exclude_none=True) for block in prompt]
        record({"method": "session/prompt", "session_id": session_id, "prompt": blocks})
        await self.conn.session_update(session_id, update_agent_message_text("ok"))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **meta: Any) -> None:
        record({"method": "session/cancel", "session_id": session_id})


if __name__ == "__main__":
    asyncio.run(run_agent(RecordingAgent()))
