"""The keepalive wheel (relay.wsserver.Keepalive) pings a crowd a few sockets at a time.

A storm of connections arriving together must not be pinged together: each tick's pings
(and the pongs that follow) hold the event loop, and another client's EVENT -> OK that
lands in that iteration waits for all of them (bench crowd). The end-to-end twin, a
relay that keeps who answers and closes who does not, is in tests/test_crowd.py.
"""

from __future__ import annotations

import asyncio

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


async def test_a_storm_is_pinged_as_it_came_and_each_once_a_turn() -> None:
    """10,000 connections in ten seconds (bench crowd's connect storm), 50 a tick: with
    one-second ticks the wheel pinged ~1,000 of them in one loop iteration; now each tick
    pings what connected in one tick, and each socket's first ping comes one interval
    after it connected."""
    wheel = Keepalive(asyncio.get_running_loop(), interval=30.0, timeout=20.0)
    assert wheel.tick == wsserver.KEEPALIVE_TICK and wheel.slots == round(30.0 / wheel.tick)
    per_tick_arrivals = round(1_000 * wheel.tick)  # 1,000 a second
    crowd: list[_Socket] = []
    first_ping: dict[int, int] = {}  # socket index -> ticks from its connection
    joined: dict[int, int] = {}
    pings_per_tick = []
    for tick in range(2 * wheel.slots):
        if len(crowd) < 10_000:
            for _ in range(per_tick_arrivals):
                joined[len(crowd)] = tick
                crowd.append(_Socket())
                wheel.add(crowd[-1])
        before = [s.pings for s in crowd]
        wheel.turn()
        pinged = [i for i, s in enumerate(crowd) if s.pings > before[i]]
        pings_per_tick.append(len(pinged))
        for i in pinged:
            first_ping.setdefault(i, tick - joined[i])
            crowd[i].pinged = None  # its pong
    assert wheel.timer is not None
    wheel.timer.cancel()
    assert max(pings_per_tick) == per_tick_arrivals <= 50  # not a second's worth at once
    assert set(first_ping.values()) == {wheel.slots - 1}  # one interval after it came
    assert len(first_ping) == len(crowd) == 10_000  # every one, once a turn
    assert sum(pings_per_tick) == len(crowd) + per_tick_arrivals  # the first tick's twice
    assert not any(s.timed_out for s in crowd)


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
