"""The agent-memory client: a library that the `engram mem`, `engram mcp` and `engram acp`
commands wrap.

`AgentMemory` (api) is the asyncio API; heads, replication, results, search and patch are
its parts; hook is the ACP/MCP core fetch; mcp_server and acp_proxy are the servers, imported
only by their commands (the MCP SDK's import cost is paid by `engram mcp` alone).
"""

from cli.memory.api import AgentMemory
from cli.nostr.errors import (
    AgentMemoryError,
    AuthError,
    BadInputError,
    ConflictError,
    NotFoundError,
    RelayError,
)

__all__ = [
    "AgentMemory",
    "AgentMemoryError",
    "AuthError",
    "BadInputError",
    "ConflictError",
    "NotFoundError",
    "RelayError",
]
