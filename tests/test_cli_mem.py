"""`engram mem` end to end: real `engram` processes against a real relay on real PostgreSQL.

One relay serves the module; every test uses a fresh agent/owner pair, so memories never
mix. Exit codes are the contract: 0 ok, 1 bad input / not found, 2 relay, 3 auth, 5 conflict.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cli_support import (
    Keys,
    barrier_proxy,
    closed_port,
    engram,
    engram_async,
    publish,
    shared_relay,
)
from nostr_client import Client
from relay_fixtures import RelayProcess, free_port, proxied_env

from engram import CORE_SLUG, Core, Memory, build_event, d_tag, validate_and_decrypt
from engram.nip01 import Event
from engram.nip44 import conversation_key

PATCH_GOOD = "--- a\n+++ b\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("cli-relay")))


@pytest.fixture
def keys() -> Keys:
    return Keys.fresh()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def ok(result, stdout: bytes | None = None) -> bytes:  # type: ignore[no-untyped-def]
    assert result.returncode == 0, result.stderr.decode()
    if stdout is not None:
        assert result.stdout == stdout
    return result.stdout


def one_error_line(result) -> str:  # type: ignore[no-untyped-def]
    text = result.stderr.decode()
    assert text.endswith("\n") and text.count("\n") == 1, text
    return text


async def stored_events(relay: RelayProcess, keys: Keys) -> list[Event]:
    """Everything the relay holds for this pair, fetched as the agent (not via the CLI)."""
    async with await Client.connect(relay.url) as c:
        await c.auth(keys.agent_sk, relay.url, int(time.time()))
        raw = await c.query({"kinds": [30174], "authors": [keys.agent], "#p": [keys.owner]})
    return [Event(**e) for e in raw]


def test_lifecycle_set_get_hash_patch_ls_rm(relay: RelayProcess, keys: Keys) -> None:
    env = keys.agent_env(relay.url)
    ok(engram("mem", "set", "notes/x", "-", env=env, stdin=b"one\ntwo\nthree\n"))
    ok(engram("mem", "get", "notes/x", env=env), b"one\ntwo\nthree\n")
    ok(engram("mem", "get", "mem/notes/x", env=env), b"one\ntwo\nthree\n")
    base = ok(engram("mem", "hash", "notes/x", env=env)).decode().strip()
    assert base == sha("one\ntwo\nthree\n")

    # dry run: prints the result and its hash, publishes nothing
    dry = engram(
        "mem",
        "patch",
        "notes/x",
        "--base-hash",
        base,
        "--dry-run",
        env=env,
        stdin=PATCH_GOOD.encode(),
    )
    ok(dry, b"one\nTWO\nthree\n")
    assert sha("one\nTWO\nthree\n") in dry.stderr.decode()
    ok(engram("mem", "get", "notes/x", env=env), b"one\ntwo\nthree\n")

    # good base
    ok(
        engram(
            "mem", "patch", "notes/x", "--base-hash", base, "-", env=env, stdin=PATCH_GOOD.encode()
        )
    )
    ok(engram("mem", "get", "notes/x", env=env), b"one\nTWO\nthree\n")

    # stale base: conflict
    stale = engram(
        "mem",
        "patch",
        "notes/x",
        "--base-hash",
        base,
        env=env,
        stdin=b"--- a\n+++ b\n@@ -1,2 +1,2 @@\n one\n-TWO\n+2\n",
    )
    assert stale.returncode == 5
    assert "conflict" in one_error_line(stale)

    # a hunk at the wrong line is refused, even though its text exists one line lower
    wrong_line = engram(
        "mem",
        "patch",
        "notes/x",
        "--no-base-hash",
        env=env,
        stdin=b"@@ -1,2 +1,2 @@\n TWO\n-three\n+3\n",
    )
    assert wrong_line.returncode == 1
    assert "does not match" in one_error_line(wrong_line)

    # a patch touching two files is refused
    two_files = (PATCH_GOOD + "--- c\n+++ d\n@@ -1 +1 @@\n-x\n+y\n").encode()
    multi = engram("mem", "patch", "notes/x", "--no-base-hash", env=env, stdin=two_files)
    assert multi.returncode == 1
    assert "one file" in one_error_line(multi)
    ok(engram("mem", "get", "notes/x", env=env), b"one\nTWO\nthree\n")

    ok(engram("mem", "set", "b", "second", env=env))
    listing = ok(engram("mem", "ls", env=env)).decode().splitlines()
    assert [row.split("\t")[0] for row in listing] == ["mem/b", "mem/notes/x"]
    as_json = json.loads(ok(engram("mem", "ls", "--json", env=env)))
    assert [r["slug"] for r in as_json] == ["mem/b", "mem/notes/x"]
    assert {r["event_id"] for r in as_json} == {row.split("\t")[1] for row in listing}

    ok(engram("mem", "rm", "notes/x", env=env))
    gone = engram("mem", "get", "notes/x", env=env)
    assert gone.returncode == 1 and gone.stdout == b""
    assert "not found" in one_error_line(gone)
    assert ok(engram("mem", "ls", env=env)).decode().startswith("mem/b\t")
    again = engram("mem", "rm", "notes/x", env=env)
    assert again.returncode == 1


def test_get_prints_exact_bytes(relay: RelayProcess, keys: Keys) -> None:
    env = keys.agent_env(relay.url)
    value = "no newline, CRLF\r\nand unicode: é 😀"
    ok(engram("mem", "set", "exact", value, env=env))
    ok(engram("mem", "get", "exact", env=env), value.encode())
    ok(engram("mem", "hash", "exact", env=env), (sha(value) + "\n").encode())


def test_core_and_refs(relay: RelayProcess, keys: Keys) -> None:
    env = keys.agent_env(relay.url)
    missing = engram("mem", "get", "core", env=env)
    assert missing.returncode == 1 and "not found" in one_error_line(missing)
    ok(engram("mem", "set", "core", "I help Ada. See [[mem/a]] and [[mem/missing]].", env=env))
    ok(engram("mem", "set", "a", "links to [[mem/b]]", env=env))
    ok(engram("mem", "set", "b", "leaf", env=env))
    ok(engram("mem", "set", "lonely", "nobody links here", env=env))
    ok(engram("mem", "get", "core", env=env), b"I help Ada. See [[mem/a]] and [[mem/missing]].")
    rows = ok(engram("mem", "refs", env=env)).decode().splitlines()
    assert rows[:3] == [  # with each memory's trust and validity, as `ls` shows them
        "reachable\tmem/a\tguess\t-",
        "reachable\tmem/b\tguess\t-",
        "orphan\tmem/lonely\tguess\t-",
    ]
    assert rows[3].startswith("dangling\tmem/missing\t")
    report = json.loads(ok(engram("mem", "refs", "--json", env=env)))
    assert report == {
        "reachable": ["mem/a", "mem/b"],
        "orphans": ["mem/lonely"],
        "dangling": [{"from": "core", "to": "mem/missing"}],
        "trust": {"mem/a": "guess", "mem/b": "guess", "mem/lonely": "guess"},
        "ended": [],
    }
    # nothing is deleted by refs
    ok(engram("mem", "get", "lonely", env=env), b"nobody links here")
    # core is listed by neither ls nor rm
    assert "core" not in ok(engram("mem", "ls", env=env)).decode()
    refused = engram("mem", "rm", "core", env=env)
    assert refused.returncode == 1
    assert "set core ''" in one_error_line(refused)
    ok(engram("mem", "set", "core", "", env=env))
    ok(engram("mem", "get", "core", env=env), b"")


def test_owner_side_reads_with_agent_flag(relay: RelayProcess, keys: Keys) -> None:
    ok(engram("mem", "set", "shared", "for my owner", env=keys.agent_env(relay.url)))
    owner = keys.owner_env(relay.url)
    ok(engram("mem", "get", "shared", "--agent", keys.agent, env=owner), b"for my owner")
    ok(engram("mem", "hash", "shared", "--agent", keys.agent, env=owner))
    rows = ok(engram("mem", "ls", "--agent", keys.agent, env=owner)).decode().splitlines()
    assert [r.split("\t")[0] for r in rows] == ["mem/shared"]
    ok(engram("mem", "refs", "--agent", keys.agent, env=owner))
    # the owner's writes are corrections (issue 39); removing stays the agent's
    corrected = ok(engram("mem", "set", "shared", "x", "--agent", keys.agent, env=owner))
    assert len(corrected.strip()) == 64
    refused = engram("mem", "rm", "shared", "--agent", keys.agent, env=owner)
    assert refused.returncode == 1
    one_error_line(refused)
    # a stranger (neither author nor owner) reads nothing
    stranger = Keys.fresh()
    denied = engram(
        "mem", "get", "shared", "--agent", keys.agent, env=stranger.owner_env(relay.url)
    )
    assert denied.returncode == 1


def test_stdin_cap_and_empty_stdin(relay: RelayProcess, keys: Keys) -> None:
    env = keys.agent_env(relay.url)
    ok(engram("mem", "set", "big", "before", env=env))
    too_big = engram("mem", "set", "big", "-", env=env, stdin=b"a" * 65_536)
    assert too_big.returncode == 1
    assert "65,535" in one_error_line(too_big)
    ok(engram("mem", "get", "big", env=env), b"before")  # not truncated and stored
    # at the cap, stdin is read whole; the body limit (value + JSON) then refuses it
    at_cap = engram("mem", "set", "big", "-", env=env, stdin=b"a" * 65_535)
    assert at_cap.returncode == 1
    assert "65535" in one_error_line(at_cap)
    fits = b"a" * 65_000
    ok(engram("mem", "set", "big", "-", env=env, stdin=fits))
    ok(engram("mem", "get", "big", env=env), fits)

    empty = engram("mem", "set", "blank", "-", env=env, stdin=b"")
    assert empty.returncode == 1
    assert "mem rm" in one_error_line(empty)
    assert engram("mem", "get", "blank", env=env).returncode == 1
    ok(engram("mem", "set", "blank", "-", "--allow-empty", env=env, stdin=b""))
    ok(engram("mem", "get", "blank", env=env), b"")


def test_bad_input_exit_1(relay: RelayProcess, keys: Keys) -> None:
    env = keys.agent_env(relay.url)
    for args in (
        ("mem", "get", "Bad.Slug"),
        ("mem", "set", "mem//x", "v"),
        ("mem", "get"),
        ("mem", "ls", "--bogus"),
        ("mem", "patch", "x", "-"),  # neither hash flag
        ("mem", "patch", "x", "--no-base-hash", "--base-hash", "0" * 64, "-"),
        ("mem", "patch", "x", "--base-hash", "xyz", "-"),
    ):
        result = engram(*args, env=env)
        assert result.returncode == 1, (args, result.stderr)
        one_error_line(result)


def test_keys_from_file_and_bech32_never_printed(relay: RelayProcess, keys: Keys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from engram.nip19 import npub, nsec

    key_file = tmp_path / "agent.key"
    key_file.write_text(nsec(keys.agent_sk) + "\n")
    env = keys.agent_env(relay.url)
    del env["ENGRAM_PRIVATE_KEY"]
    env["ENGRAM_OWNER"] = npub(keys.owner)
    ok(engram("mem", "set", "k", "v", "--key-file", str(key_file), env=env))
    ok(engram("mem", "get", "k", env=keys.agent_env(relay.url)), b"v")
    secret_hex, secret_nsec = keys.agent_sk.hex(), nsec(keys.agent_sk)
    bad = keys.agent_env(relay.url, ENGRAM_PRIVATE_KEY=secret_hex[:-1] + "z")
    runs = [
        engram("mem", "get", "k", env=keys.agent_env(relay.url)),
        engram("mem", "get", "nope", env=keys.agent_env(relay.url)),
        engram("mem", "get", "k", env=bad),
        engram("mem", "get", "k", env=keys.agent_env(f"ws://127.0.0.1:{closed_port()}")),
    ]
    assert runs[2].returncode == 1
    for run in runs:
        for secret in (secret_hex, secret_hex[:-1], secret_nsec):
            assert secret.encode() not in run.stdout + run.stderr


def test_relay_down_is_exit_2(keys: Keys) -> None:
    env = keys.agent_env(f"ws://127.0.0.1:{closed_port()}")
    for args in (("mem", "get", "x"), ("mem", "set", "x", "v"), ("mem", "ls")):
        result = engram(*args, env=env)
        assert result.returncode == 2, result.stderr
        one_error_line(result)


def test_clock_poisoned_head_is_a_conflict(relay: RelayProcess, keys: Keys) -> None:
    ck = conversation_key(keys.agent_sk, keys.owner)
    future = int(time.time()) + 700  # more than 10 minutes ahead; the relay accepts 15
    event = build_event(
        keys.agent_sk,
        keys.owner,
        Memory("mem/clock", "from the future"),
        future,
        os.urandom(32),
        os.urandom(32),
    )

    asyncio.run(publish(relay.url, event))
    env = keys.agent_env(relay.url)
    ok(engram("mem", "get", "clock", env=env), b"from the future")
    poisoned = engram("mem", "set", "clock", "now", env=env)
    assert poisoned.returncode == 5
    assert "conflict" in one_error_line(poisoned)
    assert d_tag(ck, "mem/clock") in [t[1] for t in event.tags]


def test_written_events_pass_validate_and_decrypt(relay: RelayProcess, keys: Keys) -> None:
    env = keys.agent_env(relay.url)
    ok(engram("mem", "set", "core", "profile", env=env))
    ok(engram("mem", "set", "v", "value", env=env))
    ok(engram("mem", "rm", "v", env=env))
    events = asyncio.run(stored_events(relay, keys))
    ck = conversation_key(keys.agent_sk, keys.owner)
    bodies = [validate_and_decrypt(e, keys.agent, keys.owner, ck) for e in events]
    assert Core("profile") in bodies
    assert {b.slug for b in bodies} == {CORE_SLUG, "mem/v"}
    for e in events:
        assert sorted(t[0] for t in e.tags) == ["d", "p"]
        assert "mem/v" not in json.dumps(e.tags)  # the slug never leaks into a tag


async def test_concurrent_set_loser_reports_conflict(start_relay: Any, keys: Keys) -> None:
    proxy_port = free_port()  # the relay's public URLs: its own and the proxy's
    relay = start_relay(env=proxied_env(proxy_port))
    env = keys.agent_env(relay.url)
    first = await engram_async("mem", "set", "race", "base", env=env)
    assert first.returncode == 0, first.stderr
    async with barrier_proxy(relay.url, writers=2, port=proxy_port) as proxied:
        racing = keys.agent_env(proxied)
        a, b = await asyncio.gather(
            engram_async("mem", "set", "race", "from A", env=racing),
            engram_async("mem", "set", "race", "from B", env=racing),
        )
    assert sorted([a.returncode, b.returncode]) == [0, 5], (a.stderr, b.stderr)
    winner, loser = (a, b) if a.returncode == 0 else (b, a)
    assert b"conflict" in loser.stderr
    head = await engram_async("mem", "get", "race", env=env)
    assert head.stdout == (b"from A" if winner is a else b"from B")
    assert head.returncode == 0


def test_ls_pages_past_max_limit(start_relay, keys: Keys) -> None:  # type: ignore[no-untyped-def]
    # Issue 13: a listing is no longer cut at max_limit; `until` paging lists everything.
    rp = start_relay(env={"ENGRAM_LIMITS_MAX_LIMIT": "3", "ENGRAM_LIMITS_DEFAULT_LIMIT": "2"})
    env = keys.agent_env(rp.url)
    ok(engram("mem", "set", "a", "1", env=env))
    ok(engram("mem", "set", "b", "2", env=env))
    quiet = engram("mem", "ls", env=env)
    assert ok(quiet).count(b"\n") == 2 and quiet.stderr == b""
    # at most two events per second: a page of three always gets past a second
    now = int(time.time())
    for i, slug in enumerate("cdefg"):
        body = Memory(slug=f"mem/{slug}", value=slug)
        event = build_event(
            keys.agent_sk, keys.owner, body, now - 100 + i // 2, os.urandom(32), os.urandom(32)
        )
        asyncio.run(publish(rp.url, event))
    full = engram("mem", "ls", env=env)
    assert [r.split(b"\t")[0] for r in ok(full).splitlines()] == [
        f"mem/{s}".encode() for s in "abcdefg"
    ]
    assert full.stderr == b""


def _bad_key_files(tmp_path, keys: Keys) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    """(path, what the error must say, text that must never be printed)."""
    secret = keys.agent_sk.hex()
    malformed = tmp_path / "malformed.key"
    malformed.write_text(secret[:-2] + "zz\n")  # a key with one bad byte: never echoed
    binary = tmp_path / "binary.key"
    binary.write_bytes(b"\xff\xfe" + keys.agent_sk)
    cases = [
        (str(tmp_path / "missing.key"), "cannot read key file", "no such file"),
        (str(tmp_path), "cannot read key file", "is a directory"),  # unreadable as a file
        (str(binary), "is not text", "utf-8"),
        (str(malformed), "key file", str(malformed)),
    ]
    if os.geteuid() != 0:  # root reads a mode-000 file anyway
        locked = tmp_path / "locked.key"
        locked.write_text(secret)
        locked.chmod(0)
        cases.append((str(locked), "cannot read key file", "permission denied"))
    return [(path, said, also) for path, said, also in cases]


def test_missing_unreadable_or_malformed_key_file_is_bad_input(
    keys: Keys,
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    """`engram mem` and `engram sync` name the file and the problem, exit 1, and never
    print the file's content. No relay is contacted (the URL is never listened on)."""
    relay = f"ws://127.0.0.1:{closed_port()}"
    env = keys.agent_env(relay)
    del env["ENGRAM_PRIVATE_KEY"]
    for path, said, also in _bad_key_files(tmp_path, keys):
        for args in (
            ("mem", "get", "k", "--key-file", path),
            ("sync", "--from", relay, "--to", relay, "--key-file", path),
        ):
            result = engram(*args, env=env)
            err = result.stderr.decode()
            assert result.returncode == 1, (args, err)
            one_error_line(result)
            assert said in err and also.lower() in err.lower(), (args, err)
            assert keys.agent_sk.hex()[:-2].encode() not in result.stdout + result.stderr


def test_search_refuses_a_pattern_past_the_limits_with_exit_1(
    relay: RelayProcess, keys: Keys
) -> None:
    """Issue 46 item 7: `mem search --regex` refuses, before compiling, a pattern whose
    compiled form would be enormous, naming the limit; a pattern within them still works."""
    env = keys.agent_env(relay.url)
    ok(engram("mem", "set", "notes/xs", "x" * 50, env=env))
    for pattern, limit in (
        ("((a{200}){200}){100}", "10,000 elements"),
        ("(?:x{65535}){1000}", "10,000 elements"),
        ("(" * 30 + "x" + ")" * 30, "20 deep"),
        ("x" * 1_001, "at most 1,000"),
    ):
        refused = engram("mem", "search", pattern, "--regex", env=env)
        assert refused.returncode == 1 and refused.stdout == b"", refused.stderr
        assert limit in one_error_line(refused), refused.stderr
    assert ok(engram("mem", "search", "(?:x{5}){10}", "--regex", env=env)).startswith(
        b"mem/notes/xs"
    )
