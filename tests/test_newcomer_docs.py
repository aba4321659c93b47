"""What a newcomer reads agrees with what the code does (issue 46): the MCP tool table names
every tool the server offers, the README names every setting the embedded server writes and
counts them right, and `engram keygen --help` describes the output keygen prints."""

from __future__ import annotations

import os
import re
import subprocess

from cli_support import ENGRAM, ROOT, clean_env

from cli.memory.api import AgentMemory
from cli.memory.mcp_server import MemoryTools
from cli.nostr.identity import load_identity
from engram.nip01 import pubkey_of
from relay.store.embedded import TUNING_FILE, tuning

NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}


def offered(role: str) -> set[str]:
    """The tools `engram mcp` offers with the agent's key, or with the owner's."""
    agent_sk, owner_sk = os.urandom(32), os.urandom(32)
    if role == "agent":
        env = {"ENGRAM_PRIVATE_KEY": agent_sk.hex()}
        me = load_identity(None, pubkey_of(owner_sk), None, env=env)
    else:
        env = {"ENGRAM_PRIVATE_KEY": owner_sk.hex()}
        me = load_identity(None, None, pubkey_of(agent_sk), env=env)
    memory = AgentMemory(me, ["ws://127.0.0.1:9"], timeout=1)  # never connected
    return {fn.__name__ for fn, _ in MemoryTools(memory, 1).offered()}


def test_the_mcp_tool_table_names_every_tool() -> None:
    doc = (ROOT / "docs" / "AGENT-MEMORY.md").read_text()
    mcp = doc[doc.index("## Agent memory over MCP") :]
    table = set(re.findall(r"^\| `(memory_\w+)\(", mcp, re.M))
    agent, owner = offered("agent"), offered("owner")
    assert "memory_recall" in agent
    assert agent <= table, f"the tool table omits {sorted(agent - table)}"
    for name in owner - table:  # the owner's own tools are named just below the table
        assert f"`{name}(" in mcp, name
    assert table <= agent | owner, (
        f"the table names tools no server offers: {table - agent - owner}"
    )


def test_the_readme_names_every_embedded_setting_and_counts_them() -> None:
    written = re.findall(r"^(\w+) = ", tuning(4 << 30), re.M)
    readme = (ROOT / "README.md").read_text()
    passage = readme[readme.index("PostgreSQL's defaults except") :]
    passage = passage[: passage.index("restart to change")]
    assert TUNING_FILE in passage
    assert f"except for {NUMBERS[len(written)]} settings" in " ".join(passage.split())
    for name in written:
        assert f"`{name}" in passage, name


def test_keygen_help_describes_what_it_prints() -> None:
    env = clean_env()
    help_text = subprocess.run(
        [*ENGRAM, "keygen", "--help"], capture_output=True, text=True, env=env, cwd=ROOT
    ).stdout
    assert "TOML" not in help_text and "aligned name and value lines" in help_text
    plain = subprocess.run(
        [*ENGRAM, "keygen"], capture_output=True, text=True, env=env, cwd=ROOT, check=True
    ).stdout
    rows = [line.split() for line in plain.splitlines()]
    assert [r[0] for r in rows] == ["nsec", "npub", "secret_hex", "public_hex"]
    assert all(len(r) == 2 for r in rows)
