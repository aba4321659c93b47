"""`engram sync` between real relays: ours twice (negentropy through the client), ours
and nostr-sdk's LocalRelay, and relays that do not serve negentropy (REQ fallback)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import time

import msgspec
import pytest
import websockets
from ae_vectors import SECKEY_A, ae_events
from cli_support import (
    ENGRAM,
    ROOT,
    clean_env,
    engram_async,
    fake_relay,
    ok_dropping_proxy,
    stalling_relays,
)
from negentropy_support import BASE, event, local_relay, same_second_pair
from nostr_client import Client, pub
from websockets.asyncio.server import ServerConnection


def sets() -> tuple[list, list]:
    """Overlapping sets, different at the edges and within one second."""
    common = [event(i, BASE + 10 + i // 4) for i in range(120)]
    x, y = same_second_pair(BASE + 30)
    return (
        [*common, event(1000, BASE), x, event(1001, BASE + 900)],
        [*common, event(2000, BASE + 1), y, event(2001, BASE + 899)],
    )


async def publish(url: str, events: list) -> None:
    async with websockets.connect(url, max_size=None) as ws:
        for e in events:
            await ws.send(msgspec.json.encode(["EVENT", e]).decode())
        want = {e.id for e in events}
        while want:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if msg[0] == "OK":
                assert msg[2], msg
                want.discard(msg[1])


async def ids_on(url: str, flt: dict | None = None, key: bytes | None = None) -> set[str]:
    async with websockets.connect(url, max_size=None) as ws:
        if key is not None:  # the challenge comes when needed: Client.auth asks for it
            assert (await Client(ws).auth(key, url, int(time.time())))[2]
        await ws.send(json.dumps(["REQ", "q", {**(flt or {}), "limit": 5000}]))
        out: set[str] = set()
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if msg[0] == "EVENT" and msg[1] == "q":
                out.add(msg[2]["id"])
            elif msg[0] in ("EOSE", "CLOSED") and msg[1] == "q":
                return out


async def held(url: str, ids: set[str]) -> set[str]:
    """Which of `ids` a relay serving at most 7 events per REQ holds."""
    wanted = sorted(ids)
    found: set[str] = set()
    for k in range(0, len(wanted), 7):
        found |= await ids_on(url, {"ids": wanted[k : k + 7]})
    return found


async def sync(*args: str, env: dict | None = None) -> dict:
    done = await engram_async("sync", *args, "--json", env=env or clean_env())
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


async def test_sync_between_two_of_our_relays_uses_negentropy_and_is_idempotent(
    start_relay,
) -> None:
    ra, rb = start_relay(), start_relay()
    a, b = sets()
    await publish(ra.url, a)
    await publish(rb.url, b)
    ids_a, ids_b = {e.id for e in a}, {e.id for e in b}
    up = await sync("--from", ra.url, "--to", rb.url, "--filter", '{"kinds":[1]}')
    assert up["method"] == "negentropy"
    assert (up["have"], up["need"], up["copied_up"], up["copied_down"]) == (3, 3, 3, 0)
    assert await ids_on(rb.url) == ids_a | ids_b and await ids_on(ra.url) == ids_a
    down = await sync("--from", ra.url, "--to", rb.url, "--direction", "down")
    assert (down["have"], down["need"], down["copied_down"]) == (0, 3, 3)
    assert await ids_on(ra.url) == ids_a | ids_b
    again = await sync("--from", ra.url, "--to", rb.url, "--direction", "both")
    assert (again["have"], again["need"], again["copied_up"], again["copied_down"]) == (0,) * 4
    assert again["refused"] == {}
    plain = await engram_async("sync", "--from", ra.url, "--to", rb.url, env=clean_env())
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.decode().splitlines()
    assert lines[0].startswith("method: negentropy (") and "refused: none" in lines
    assert f"have: 0 (only on {ra.url})" in lines and "copied: 0 up, 0 down" in lines
    assert plain.stderr == b""  # not a terminal: no progress bar


async def test_sync_with_nostr_sdk_local_relay_both_directions(start_relay) -> None:
    ours = start_relay()
    a, b = sets()
    await publish(ours.url, a)
    with local_relay() as theirs:
        await publish(theirs, b)
        up = await sync("--from", ours.url, "--to", theirs, "--direction", "up")
        assert up["method"] == "negentropy", up
        assert (up["have"], up["need"], up["copied_up"]) == (3, 3, 3)
        assert await ids_on(theirs) == {e.id for e in a} | {e.id for e in b}
        down = await sync("--from", theirs, "--to", ours.url, "--direction", "up")
        assert (down["have"], down["need"], down["copied_up"]) == (3, 0, 3)
        assert await ids_on(ours.url) == {e.id for e in a} | {e.id for e in b}
        again = await sync("--from", ours.url, "--to", theirs, "--direction", "both")
        assert (again["have"], again["need"]) == (0, 0)


async def test_falls_back_to_req_paging_when_a_relay_refuses_negentropy(start_relay) -> None:
    # page size 7 and many events per second: the (created_at, id) tie-break matters;
    # NIP-11 lists 77 but every NEG-OPEN over its set is too big (NEG-ERR blocked:)
    plain = start_relay(env={"ENGRAM_NEGENTROPY_MAX_ITEMS": "2", "ENGRAM_LIMITS_MAX_LIMIT": "7"})
    neg = start_relay()
    a, b = sets()
    await publish(plain.url, a)
    await publish(neg.url, b)
    out = await sync("--from", plain.url, "--to", neg.url, "--direction", "both")
    assert out["method"] == "negentropy+req"
    assert "NEG-ERR blocked:" in out["fallback"][plain.url]
    assert (out["have"], out["need"], out["copied_up"], out["copied_down"]) == (3, 3, 3, 3)
    union = {e.id for e in a} | {e.id for e in b}
    assert await held(plain.url, union) == union == await ids_on(neg.url)
    # both refusing (this one has NIP-77 off, so NIP-11 omits 77): REQ paging on both sides
    other = start_relay(env={"ENGRAM_NEGENTROPY_MAX_SESSIONS": "0"})
    out = await sync("--from", plain.url, "--to", other.url)
    assert out["method"] == "req" and out["have"] == len(union) and out["copied_up"] == len(union)
    assert out["fallback"][other.url] == "NIP-11 does not list 77"
    assert await ids_on(other.url) == union


@pytest.mark.parametrize("answer", ["nothing", "notice"])
async def test_falls_back_when_negentropy_is_not_understood(start_relay, answer: str) -> None:
    """A relay behind a proxy that does not know NEG-* frames: it answers a NOTICE, as
    relays do for an unknown verb, or nothing at all."""
    real = start_relay()
    a, b = sets()
    await publish(real.url, a)

    async def proxy(ws: ServerConnection) -> None:
        async with websockets.connect(real.url, max_size=None) as up:

            async def client_to_relay() -> None:
                async for frame in ws:
                    if not str(frame).startswith('["NEG-'):
                        await up.send(frame)
                    elif answer == "notice":
                        await ws.send('["NOTICE","invalid: unknown message type"]')

            async def relay_to_client() -> None:
                async for frame in up:
                    await ws.send(frame)

            pumps = [asyncio.create_task(p()) for p in (client_to_relay, relay_to_client)]
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()

    other = start_relay()
    await publish(other.url, b)
    async with fake_relay(proxy) as url:
        out = await sync("--from", url, "--to", other.url, "--step-timeout", "3")
    assert out["method"] == "negentropy+req", out
    why = "no negentropy answer" if answer == "nothing" else "NOTICE"
    assert why in out["fallback"][url]
    assert (out["have"], out["need"], out["copied_up"]) == (3, 3, 3)


async def test_engrams_sync_only_with_their_key(start_relay, tmp_path) -> None:
    src, dst = start_relay(), start_relay()
    engrams = ae_events()
    await publish(src.url, engrams)
    agent = pub(SECKEY_A)
    flt = json.dumps({"kinds": [30174], "authors": [agent]})
    # no key: the read is refused, as a REQ would be (exit 3), nothing copied
    done = await engram_async(
        "sync", "--from", src.url, "--to", dst.url, "--filter", flt, env=clean_env()
    )
    assert done.returncode == 3, done.stderr
    assert "auth-required" in done.stderr.decode()
    # the agent's key: AUTH when asked, then negentropy on both sides
    key = tmp_path / "agent.key"
    key.write_text(SECKEY_A.hex())
    out = await sync("--from", src.url, "--to", dst.url, "--filter", flt, "--key-file", str(key))
    assert out["method"] == "negentropy", out
    heads = await ids_on(src.url, {"kinds": [30174], "authors": [agent]}, SECKEY_A)
    assert out["have"] == len(heads) and out["copied_up"] == len(heads)
    assert await ids_on(dst.url, {"kinds": [30174], "authors": [agent]}, SECKEY_A) == heads


async def test_progress_bar_on_a_terminal(start_relay) -> None:
    ra, rb = start_relay(), start_relay()
    a, b = sets()
    await publish(ra.url, a)
    await publish(rb.url, b)
    leader, follower = pty.openpty()
    try:
        proc = await asyncio.create_subprocess_exec(
            *ENGRAM,
            "sync",
            "--from",
            ra.url,
            "--to",
            rb.url,
            stdout=subprocess.PIPE,
            stderr=follower,
            env=clean_env(),
            cwd=ROOT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 180)  # outer bound
        assert proc.returncode == 0
        os.close(follower)
        follower = -1
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert b"copying up [" in shown and b"] 3/3" in shown  # the bar, redrawn in place
    assert b"\r" in shown
    assert b"copied: 3 up, 0 down" in out  # the summary still goes to stdout


# --- bounded in time, and nothing hidden -------------------------------------------------


async def test_a_relay_that_accepts_and_never_answers_is_named_exit_2(start_relay) -> None:
    """Silent before the websocket handshake and silent after it, on either side: each
    step has its deadline (--step-timeout), the run has one (--timeout), and the error
    names the relay that stalled; nothing is reported as done."""
    real = start_relay()
    await publish(real.url, sets()[0][:5])

    async def named(url: str, args: tuple[str, ...]) -> None:
        done = await engram_async("sync", *args, "--json", env=clean_env())
        err = done.stderr.decode()
        assert done.returncode == 2, err
        assert url in err and err.count("\n") == 1, err
        assert done.stdout == b""  # no summary: nothing reported as done

    async with stalling_relays() as stalled:
        runs = [
            named(url, args)
            for url in stalled
            for args in (  # steps long enough for the real relay's, on a loaded machine
                ("--from", url, "--to", real.url, "--step-timeout", "3"),
                ("--from", real.url, "--to", url, "--step-timeout", "3"),
                ("--from", url, "--to", real.url, "--timeout", "3"),  # the run's deadline
            )
        ]
        await asyncio.gather(*runs)  # each waits out its own deadline, not the others'


async def test_a_stall_while_copying_says_the_sync_is_not_complete(start_relay) -> None:
    """The destination stores the events but never answers OK: exit 2, naming it and
    saying the run stopped part-way, never a summary of a finished copy."""
    src, dst = start_relay(), start_relay()
    events = sets()[0][:5]
    await publish(src.url, events)
    async with ok_dropping_proxy(dst.url) as mute:
        done = await engram_async(
            "sync", "--from", src.url, "--to", mute, "--step-timeout", "5", env=clean_env()
        )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert mute in err and "NOT complete" in err and "run it again" in err
    assert done.stdout == b""


def _frozen_relay(events: list) -> object:
    """A relay without NIP-77 that ignores `until`: every REQ gets the same page (the
    events asked for by id when `ids` is given)."""

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            msg = json.loads(frame)
            if msg[0] == "NEG-OPEN":
                await ws.send(json.dumps(["NEG-ERR", msg[1], "blocked: not here"]))
            elif msg[0] == "REQ":
                ids = msg[2].get("ids")
                for e in events:
                    if ids is None or e.id in ids:
                        await ws.send(msgspec.json.encode(["EVENT", msg[1], e]).decode())
                await ws.send(json.dumps(["EOSE", msg[1]]))

    return handler


async def test_paging_a_relay_that_ignores_until_ends_and_says_so(start_relay) -> None:
    """REQ paging used to ask the same `until` forever of a relay that ignores it."""
    dst = start_relay()
    events = sets()[0][0:16:4]  # four seconds, one event each
    async with fake_relay(_frozen_relay(events)) as frozen:
        done = await engram_async(
            "sync", "--from", frozen, "--to", dst.url, "--json", env=clean_env()
        )
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    assert "ignores `until`" in out["incomplete"][frozen]
    assert (out["have"], out["copied_up"]) == (4, 4)
    assert "may be incomplete" in done.stderr.decode()
    assert await ids_on(dst.url) == {e.id for e in events}


async def test_more_events_in_one_second_than_a_page_is_reported(start_relay) -> None:
    """Ten events share a second on a relay serving seven per REQ: paging used to step
    below that second and skip three without a word."""
    small = start_relay(env={"ENGRAM_LIMITS_MAX_LIMIT": "7", "ENGRAM_NEGENTROPY_MAX_SESSIONS": "0"})
    dst = start_relay()
    crowd = [event(3000 + i, BASE + 500) for i in range(10)]
    await publish(small.url, [*crowd, event(3100, BASE + 400)])
    out = await sync("--from", small.url, "--to", dst.url)
    assert out["method"] == "negentropy+req"
    assert f"({BASE + 500})" in out["incomplete"][small.url]
    assert "share one second" in out["incomplete"][small.url]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--filter", "{not json"), "--filter must be a JSON object"),
        (("--filter", "[1, 2]"), "--filter must be a JSON object"),
        (("--direction", "sideways"), "--direction must be one of up, down, both"),
    ],
)
async def test_bad_filter_or_direction_is_a_clear_error(args: tuple[str, ...], words: str) -> None:
    done = await engram_async(
        "sync", "--from", "ws://127.0.0.1:1", "--to", "ws://127.0.0.1:2", *args, env=clean_env()
    )
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert err.startswith("engram: ") and words in err and err.count("\n") == 1


async def test_a_memory_filter_without_authors_says_to_name_them(start_relay, tmp_path) -> None:
    """The read gate serves kind 30174 only to its author or owner, so a filter that names
    neither is refused even with the agent's key: the error says what to add (issue 46)."""
    src, dst = start_relay(), start_relay()
    await publish(src.url, ae_events())
    key = tmp_path / "agent.key"
    key.write_text(SECKEY_A.hex())
    agent = pub(SECKEY_A)
    flt = json.dumps({"kinds": [30174]})
    done = await engram_async(
        "sync",
        "--from",
        src.url,
        "--to",
        dst.url,
        "--filter",
        flt,
        "--key-file",
        str(key),
        env=clean_env(),
    )
    err = done.stderr.decode()
    assert done.returncode == 3, err
    assert "restricted:" in err  # the relay's own answer stays in the message
    assert f'"authors": ["{agent}"]' in err and "#p" in err, err
    assert await ids_on(dst.url, {"kinds": [30174], "authors": [agent]}, SECKEY_A) == set()


async def test_a_refusal_of_a_filter_naming_authors_gives_no_authors_hint(
    start_relay, tmp_path
) -> None:
    """The negative twin: another key's memory, asked for by its author, is refused as
    before, without advice to name authors the filter already names."""
    src, dst = start_relay(), start_relay()
    await publish(src.url, ae_events())
    key = tmp_path / "other.key"
    key.write_text(os.urandom(32).hex())
    flt = json.dumps({"kinds": [30174], "authors": [pub(SECKEY_A)]})
    done = await engram_async(
        "sync",
        "--from",
        src.url,
        "--to",
        dst.url,
        "--filter",
        flt,
        "--key-file",
        str(key),
        env=clean_env(),
    )
    err = done.stderr.decode()
    assert done.returncode == 3, err
    assert "restricted:" in err and "name the authors" not in err, err
