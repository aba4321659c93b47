"""NIP-77 negentropy sessions on the relay: NEG-OPEN, NEG-MSG, NEG-CLOSE, NEG-ERR.

A NEG-OPEN's filter is authorized exactly as a REQ filter (the engram read gate first:
a key that may not read an agent's engrams learns nothing about them, not even ids),
then its (created_at, id) set is read once from the store and kept, compactly, for the
session's later messages (~40 bytes per item, capped by `negentropy_max_items`). The
protocol itself is `engram.negentropy`; this module holds sessions and limits only.

Memory is bounded relay-wide too (`negentropy_budget_bytes`, in `/metrics`): a NEG-OPEN
reserves what its read may bring back (`negentropy_max_items` items) until the set is
read, then holds what the set costs until the session ends; one that would take the
relay past the budget is answered `NEG-ERR "blocked: …"`. One client address (its
connections together) holds at most `negentropy_budget_per_ip_bytes` of it, so one
client cannot take the whole budget and leave every other one refused; addresses the
rate limits exempt (loopback, relay.ratelimit) are held to the relay-wide bound only.
"""

from __future__ import annotations

import asyncio
import logging

from engram.negentropy import ITEM_BYTES as ITEM_BYTES  # a held item's bytes
from engram.negentropy import MIN_FRAME_SIZE, Items, Negentropy, NegentropyError
from relay import metrics, policy, wire
from relay.config import Settings
from relay.filters import FilterError, parse_filter
from relay.session import Session
from relay.store import EventStore, StoreError
from relay.tenants import Tenant
from relay.wire import Reason

log = logging.getLogger("engram.negentropy")

_FRAME_OVERHEAD = 32  # `["NEG-MSG","",""]` plus slack, on top of the subscription id


class _Open:
    """One negentropy session of a connection (state None while its set is read)."""

    __slots__ = ("cost", "ip", "neg", "timer")

    def __init__(self, ip: str | None) -> None:
        self.neg: Negentropy | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.cost = 0  # bytes charged to the relay-wide budget (and to `ip`'s share)
        self.ip = ip  # the client address whose share it counts against (None: exempt)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _sessions(session: Session) -> dict[str, _Open]:
    if session.negentropy is None:
        session.negentropy = {}
    return session.negentropy


class NegentropyService:
    """The relay's NIP-77 side; the pipeline dispatches the three client verbs here."""

    def __init__(self, settings: Settings, store: EventStore) -> None:
        self.settings = settings
        self.store = store
        self.budget = settings.negentropy_budget_bytes
        self.per_ip = settings.negentropy_budget_per_ip_bytes  # 0: no per-address share
        self.held = 0  # bytes reserved or held by the sessions of every connection
        self.held_by_ip: dict[str, int] = {}  # the same, per limited address holding any
        self.peak = 0  # the most ever held at once
        metrics.watch_negentropy(self)

    def frame_size_limit(self, tenant: Tenant, sub_id: str) -> int:
        """Bytes of negentropy message that fit one frame of `max_message_length` as hex."""
        room = tenant.limits.max_message_length - _FRAME_OVERHEAD - len(wire.encode(sub_id))
        return max(MIN_FRAME_SIZE, room // 2)

    async def open(self, session: Session, tenant: Tenant, msg: wire.NegOpenMsg) -> None:
        """NEG-OPEN: authorize the filter as REQ would, read the set, answer the message."""
        sub_id = msg.sub_id
        lim = tenant.limits
        opened = _sessions(session)
        self.close(session, sub_id)  # NIP-77: a reused id replaces the open session
        if len(sub_id) > lim.max_subid_length:
            why = Reason.INVALID(f"subscription id longer than {lim.max_subid_length}")
            session.send(wire.neg_err(sub_id, why))
            return
        try:
            f = parse_filter(bytes(msg.filter), lim)
        except FilterError as exc:
            session.send(wire.neg_err(sub_id, Reason.INVALID(str(exc))))
            return
        why = policy.check_read(f, session.authed, tenant)
        if why:
            session.challenge_for(why)
            session.send(wire.neg_err(sub_id, why))
            return
        cap = self.settings.negentropy_max_sessions
        if len(opened) >= cap:
            why = Reason.BLOCKED(
                f"too many negentropy sessions (max {cap})" if cap else "NIP-77 is off here"
            )
            session.send(wire.neg_err(sub_id, why))
            return
        max_items = self.settings.negentropy_max_items
        reserve = (max_items + 1) * ITEM_BYTES  # the most the read below may bring back
        allow = session.allowance
        ip = session.ip if self.per_ip and allow is not None and not allow.exempt else None
        if ip is not None and self.held_by_ip.get(ip, 0) + reserve > self.per_ip:
            why = Reason.BLOCKED(
                f"your address holds too many negentropy sets now (at most {self.per_ip}"
                " bytes); close one (NEG-CLOSE) or try again later"
            )
            session.send(wire.neg_err(sub_id, why))
            return
        if self.held + reserve > self.budget:
            metrics.negentropy_refused()
            why = Reason.BLOCKED("the relay holds too many negentropy sets now; try again later")
            session.send(wire.neg_err(sub_id, why))
            return
        state = _Open(ip)
        opened[sub_id] = state
        self._charge(state, reserve)
        try:
            stamps, ids = await self.store.negentropy_items(
                f, tenant.key, session.authed, max_items + 1, private=tenant.private_kinds
            )
        except StoreError as exc:
            self._drop(session, sub_id, state)
            session.send(wire.neg_err(sub_id, str(exc)))
            return
        if opened.get(sub_id) is not state or session.closed:
            return  # closed or replaced while the set was read
        if len(stamps) > max_items:
            self._drop(session, sub_id, state)
            why = Reason.BLOCKED(f"this query is too big (more than {max_items} events)")
            session.send(wire.neg_err(sub_id, why))
            return
        items = Items.from_sorted(stamps, ids)
        del stamps, ids
        self._charge(state, len(items) * ITEM_BYTES)
        state.neg = Negentropy(items, self.frame_size_limit(tenant, sub_id))
        self._answer(session, sub_id, state, msg.message)

    def message(self, session: Session, msg: wire.NegMsg) -> None:
        """NEG-MSG: the next round of an open session."""
        state = (session.negentropy or {}).get(msg.sub_id)
        if state is None or state.neg is None:
            why = Reason.CLOSED("no open negentropy session with this id")
            session.send(wire.neg_err(msg.sub_id, why))
            return
        self._answer(session, msg.sub_id, state, msg.message)

    def close(self, session: Session, sub_id: str) -> None:
        """NEG-CLOSE (no answer), or the replacement of a reused id."""
        opened = session.negentropy
        if opened and sub_id in opened:
            self._end(opened.pop(sub_id))

    def drop_connection(self, session: Session) -> None:
        opened = session.negentropy or {}
        for state in opened.values():
            self._end(state)
        opened.clear()
        session.negentropy = None

    def _charge(self, state: _Open, cost: int) -> None:
        """`state` now costs `cost` bytes of the budget (a reservation, or its set), and
        of its address's share."""
        change = cost - state.cost
        self.held += change
        state.cost = cost
        self.peak = max(self.peak, self.held)
        if state.ip is not None:
            left = self.held_by_ip.get(state.ip, 0) + change
            if left:
                self.held_by_ip[state.ip] = left
            else:  # an address holding nothing is not kept
                self.held_by_ip.pop(state.ip, None)

    def _end(self, state: _Open) -> None:
        """A session ends: its timer stops and its bytes return to the budget."""
        state.stop()
        self._charge(state, 0)

    def _answer(self, session: Session, sub_id: str, state: _Open, message: bytes) -> None:
        assert state.neg is not None
        try:
            reply = state.neg.reconcile(message)
        except NegentropyError as exc:
            self._drop(session, sub_id, state)
            session.send(wire.neg_err(sub_id, Reason.INVALID(str(exc))))
            return
        state.stop()
        idle = self.settings.negentropy_idle_seconds
        if idle > 0:
            state.timer = asyncio.get_running_loop().call_later(
                idle, self._expire, session, sub_id, state
            )
        session.send(wire.neg_msg(sub_id, reply))

    def _expire(self, session: Session, sub_id: str, state: _Open) -> None:
        if self._drop(session, sub_id, state):
            idle = self.settings.negentropy_idle_seconds
            why = Reason.CLOSED(f"idle for more than {idle:g} seconds")
            session.send(wire.neg_err(sub_id, why))

    def _drop(self, session: Session, sub_id: str, state: _Open) -> bool:
        opened = session.negentropy
        if opened is not None and opened.get(sub_id) is state:
            del opened[sub_id]
            self._end(state)
            return True
        return False
