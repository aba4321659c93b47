"""Signature checks beside the loop, in the worker process (`verify_process`, the default)
or in threads (`verify_threads`): the same answers as inline verification, for every
kind of EVENT, on a real relay."""

from __future__ import annotations

import time

import msgspec
import pytest
from nostr_client import Client

from engram.nip01 import Event, pubkey_of, sign_event

AUX = bytes(32)
SK = (0x7E57).to_bytes(32, "big")


def ev(kind: int = 1, content: str = "x", tags=()) -> Event:
    return sign_event(SK, int(time.time()), kind, [list(t) for t in tags], content, AUX)


CHECKERS = {
    "process": {},
    "threads": {"ENGRAM_VERIFY_PROCESS": "0", "ENGRAM_VERIFY_THREADS": "2"},
    "inline": {"ENGRAM_VERIFY_PROCESS": "0", "ENGRAM_VERIFY_THREADS": "0"},
}


@pytest.mark.parametrize("checker", list(CHECKERS))
async def test_every_checker_answers_like_inline(start_relay, checker):
    rp = start_relay(env=CHECKERS[checker])
    async with await Client.connect(rp.url) as c, await Client.connect(rp.url) as live:
        _, end = await live.req("live", {"kinds": [1, 20001]})
        assert end[0] == "EOSE"
        good = [ev(content=f"n{i}") for i in range(300)]
        forged = msgspec.structs.replace(ev(content="forged"), sig="0" * 128)
        bad_id = msgspec.structs.replace(ev(content="bad id"), content="changed")
        ephemeral = ev(20001, "now")
        oks = await c.publish_many([*good, forged, bad_id, ephemeral])
        assert all(oks[e.id][2] is True for e in good)
        assert oks[forged.id][2:] == [False, "invalid: signature verification failed"]
        assert oks[bad_id.id][2] is False and oks[bad_id.id][3].startswith("invalid: event id")
        assert oks[ephemeral.id][2:] == [True, ""]
        assert len(await c.query({"authors": [pubkey_of(SK)], "limit": 500})) == 300
        live_ids = set()
        while len(live_ids) < 301:
            live_ids.add((await live.recv())[2]["id"])
        assert live_ids == {e.id for e in good} | {ephemeral.id}


@pytest.mark.parametrize("checker", list(CHECKERS))
async def test_every_checker_keeps_the_write_policy(start_relay, checker):
    rp = start_relay(env={**CHECKERS[checker], "ENGRAM_LIMITS_RESTRICTED_WRITES": "1"})
    async with await Client.connect(rp.url) as c:
        msg = await c.publish(ev())
        assert msg[2] is False and msg[3].split(":")[0] in ("auth-required", "restricted")
