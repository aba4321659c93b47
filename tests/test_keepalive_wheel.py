"""The keepalive wheel (relay.wsserver.Keepalive) pings a crowd a few sockets at a time.

A storm of connections arriving together must not be pinged together: each tick's pings
(and the pongs that follow) hold the event loop, and another client's EVENT -> OK that
lands in that iteration waits for all of them (bench crowd). The end-to-end twin, a
relay that keeps who answers and closes who does not, is in tests/test_crowd.py.
"""

from __future__ import annotations

import asyncio
import math

from relay import wsserver
from relay.wsserver import Keepalive


class _Socket:
    """What the wheel reads and calls of a DirectSocket."""

    def __init__(self) -> None:
        self.bucket = 0
        self.pinged: bytes | None = None
        self.pings = 0
        self.timed_out = False

    def ping(self, frame: bytes, payload: bytes) -> None:
        self.pinged = payload
        self.pings += 1

    def ping_timeout(self) -> None:
        self.timed_out = True


async def test_a_storm_is_pinged_a_few_at_a_time_and_each_once_a_turn() -> None:
    wheel = Keepalive(asyncio.get_running_loop(), interval=30.0, timeout=20.0)
    assert wheel.tick == wsserver.KEEPALIVE_TICK and wheel.slots == round(30.0 / wheel.tick)
    crowd = [_Socket() for _ in range(10_000)]  # all connected within one tick
    for sock in crowd:
        wheel.add(sock)
    per_tick = []
    for _ in range(wheel.slots):  # one turn: every tick's pings counted
        before = sum(s.pings for s in crowd)
        wheel.turn()
        per_tick.append(sum(s.pings for s in crowd) - before)
        for sock in crowd:  # every pong comes back at once
            sock.pinged = None
    assert wheel.timer is not None
    wheel.timer.cancel()
    assert max(per_tick) <= math.ceil(len(crowd) / wheel.slots)  # not 10,000 in one
    assert all(s.pings == 1 for s in crowd) and not any(s.timed_out for s in crowd)


async def test_who_leaves_is_not_pinged_and_a_silent_socket_times_out() -> None:
    wheel = Keepalive(asyncio.get_running_loop(), interval=1.0, timeout=0.5)
    stays, leaves, silent = _Socket(), _Socket(), _Socket()
    for sock in (stays, leaves, silent):
        wheel.add(sock)
    wheel.remove(leaves)
    for _ in range(wheel.slots * 2):  # two turns; `stays` answers, `silent` never does
        wheel.turn()
        stays.pinged = None
    assert wheel.timer is not None
    wheel.timer.cancel()
    assert stays.pings == 2 and not stays.timed_out
    assert leaves.pings == 0 and not leaves.timed_out
    assert silent.timed_out
