"""Issue 39: history, audit, tombstones that remember, trust and validity, on a relay set
of our relay AND nostr-sdk's LocalRelay (an implementation nobody here wrote), through
`engram mem` run as a real process (docs/NIP-AE-HISTORY.md).

One relay of ours and one LocalRelay serve the module; every test uses a fresh
agent/owner pair, so memories never mix.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from cli_support import Keys, engram, shared_local_relay, shared_relay
from relay_fixtures import RelayProcess

from cli.client import connect_relay
from cli.identity import load_identity
from cli.memory.api import AgentMemory


@pytest.fixture(scope="module")
def ours(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("history-relay")))


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from shared_local_relay(str(tmp_path_factory.mktemp("history-sdk")))


@pytest.fixture
def keys() -> Keys:
    return Keys.fresh()


@pytest.fixture
def relays(ours: RelayProcess, sdk: str) -> list[str]:
    return [ours.url, sdk]


def mem(keys: Keys, relays: list[str], *args: str, owner: bool = False) -> Any:
    """`engram mem ARGS…` as the agent (or, `owner`, as the owner naming the agent)."""
    if owner:
        env = keys.owner_env(",".join(relays))
        args = (*args, "--agent", keys.agent)
    else:
        env = keys.agent_env(",".join(relays))
    return engram("mem", *args, "--timeout", "120", env=env)


def ok(result: Any) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return str(result.stdout.decode())


def api(keys: Keys, relays: list[str]) -> AgentMemory:
    env = {"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()}
    return AgentMemory(load_identity(None, keys.owner, None, env=env), relays, timeout=60)


def test_five_versions_log_as_of_diff_revert_audit(keys: Keys, relays: list[str]) -> None:
    ids = []
    for i in range(5):
        trust = "stated" if i % 2 else "guess"
        out = ok(mem(keys, relays, "set", "notes/city", f"city {i}\n", "--trust", trust,
                     "--source", f"session {i}"))  # fmt: skip
        ids.append(out.strip())
    log = json.loads(ok(mem(keys, relays, "log", "notes/city", "--json")))
    assert [v["id"] for v in log] == ids[::-1]
    assert [v["trust"] for v in log] == ["guess", "stated", "guess", "stated", "guess"]
    assert {v["author"] for v in log} == {keys.agent} and {v["role"] for v in log} == {"agent"}
    assert [v["source"] for v in log] == [f"session {i}" for i in range(4, -1, -1)]
    for v, prev in zip(log, [*log[1:], None], strict=True):
        assert v["prev"] == (prev["id"] if prev else None)
    plain = ok(mem(keys, relays, "log", "notes/city")).splitlines()
    assert [line.split("\t")[0] for line in plain] == ids[::-1]
    for i, v in enumerate(reversed(log)):
        got = mem(keys, relays, "get", "notes/city", "--as-of", str(v["created_at"]))
        assert ok(got) == f"city {i}\n"
        assert ok(mem(keys, relays, "get", "notes/city", "--rev", v["id"][:8])) == f"city {i}\n"
    before = mem(keys, relays, "get", "notes/city", "--as-of", str(log[-1]["created_at"] - 1))
    assert before.returncode == 1
    diff = ok(mem(keys, relays, "diff", "notes/city"))
    assert "-city 3\n" in diff and "+city 4\n" in diff
    diff = ok(mem(keys, relays, "diff", "notes/city", ids[0], ids[2]))
    assert "-city 0\n" in diff and "+city 2\n" in diff
    reverted = ok(mem(keys, relays, "revert", "notes/city", ids[1][:10])).strip()
    assert ok(mem(keys, relays, "get", "notes/city")) == "city 1\n"
    latest = json.loads(ok(mem(keys, relays, "get", "notes/city", "--json")))
    assert latest["id"] == reverted and latest["trust"] == "stated"
    assert latest["source"] == f"revert of {ids[1]}"
    assert len(json.loads(ok(mem(keys, relays, "log", "notes/city", "--json")))) == 6
    audit = mem(keys, relays, "audit", "--json")
    report = json.loads(ok(audit))
    assert report["clean"] and report["findings"] == [] and report["versions"] == 6, report
