"""REQ and COUNT: the read path, beside the EVENT path (relay.ingest).

A REQ, in order (`Reads.request`): its filters parsed strictly (relay.filters) and
authorized (`readable_filters`: the private read gate, relay.policy.check_read, before
anything looks at them, search included; NIP-50 kept to the searchable kinds); the
subscription caps (`subscriptions_full`: the connection's, its address's, the live
search budgets) checked and the subscription registered, pending, with no await between,
as the frame is read (a CLOSE right behind it finds it); the stored events from the
store's memory when it holds them (relay.store.EventReads.cached: answered in line, no
task, no slot), else from its read (EventReads.query) on one of the connection's and the
address's read slots (relay.readgate), in a task; sent as they were stored, then EOSE,
and the subscription goes live (relay.fanout). A COUNT (NIP-45, `count`) takes the same
parsing, gate and slots and answers one number.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Coroutine
from typing import Any

import msgspec

from relay import metrics, policy, wire
from relay.config import Limits, Settings
from relay.fanout import FanOut, Subscription
from relay.filters import (
    Filter,
    FilterError,
    SharedFilters,
    from_plain,
    parse_filter,
    restrict_search,
    value_count,
)
from relay.ratelimit import ConnectionAllowance, RateLimiter
from relay.readgate import ReadGate
from relay.reqmemo import ReqMemo
from relay.session import Session
from relay.store import EventReads, StoreError
from relay.tenants import Tenant
from relay.wire import Reason


class Reads:
    """REQ and COUNT of every connection: authorized, read from the store, then live."""

    def __init__(
        self,
        settings: Settings,
        store: EventReads,
        fanouts: defaultdict[str, FanOut],
        limiter: RateLimiter,
    ) -> None:
        self.settings = settings
        self.store = store
        self.fanouts = fanouts
        self.limiter = limiter
        self.gate = ReadGate(settings.reads_per_connection, settings.reads_per_ip)
        kinds = settings.search_kinds
        self.search_kinds = None if kinds is None else frozenset(kinds)
        entries = settings.req_memo_entries
        self.memo = ReqMemo(entries) if entries > 0 else None

    def request(
        self,
        session: Session,
        tenant: Tenant,
        sub_id: str,
        raws: list[msgspec.Raw],
        text: str | None = None,
    ) -> Coroutine[Any, Any, None] | None:
        """Stored events newest first, EOSE, then live events until CLOSE.

        Answered here and now when the store holds the answer in memory
        (EventReads.cached: no task, no read slot, no await); otherwise the returned
        coroutine reads the store (the transport runs it as a task), as it does when the
        connection's queue is full. `raws` are the kept filters of `kept` when a REQ of the
        same filter text (`text`, relay.reqmemo.split_req) had them."""
        started = metrics.start()
        filters = self._allowed(session, tenant, sub_id, raws, text)
        if isinstance(filters, bytes):
            session.send(filters)
            return None
        fanout = self.fanouts[tenant.key]
        why = self.subscriptions_full(session, fanout, sub_id, filters)
        if why:
            session.send(wire.closed(sub_id, why))
            return None
        # no await since the checks above: counted and registered at once, so REQs sent
        # together (from many connections of one address) cannot all pass a cap
        sub = fanout.subscribe(session, sub_id, filters, pending=True)
        rows = self.store.cached(filters, tenant.key, session.authed, tenant.private_kinds)
        if rows is None:
            return self._read(session, tenant, sub_id, filters, sub, started)
        return self._answer(session, tenant, sub_id, sub, rows, started)

    def kept(
        self, sub_id: str, text: str, tenant: Tenant, viewer: str | None
    ) -> SharedFilters | None:
        """The filters a REQ of this filter text had, parsed, allowed and clamped, for
        this tenant and viewer (relay.reqmemo), if kept and the id is within its bound."""
        if self.memo is None or len(sub_id) > tenant.limits.max_subid_length:
            return None
        return self.memo.get(text, tenant, viewer)

    def _allowed(
        self,
        session: Session,
        tenant: Tenant,
        sub_id: str,
        raws: list[msgspec.Raw],
        text: str | None,
    ) -> list[Filter] | bytes:
        """A REQ's filters parsed, authorized and their limits clamped, or the CLOSED frame
        refusing them; kept for the next REQ of the same filter text (`text`) when they
        pass and have no search."""
        if type(raws) is SharedFilters:  # `kept`: a REQ of this text had them
            return raws
        filters = self.readable_filters(session, tenant, sub_id, raws)
        if isinstance(filters, bytes):
            return filters
        lim = tenant.limits
        for f in filters:
            policy.clamp_limit(f, lim)
        memo = self.memo
        if text is not None and memo is not None and all(f.search is None for f in filters):
            filters = SharedFilters(filters)
            memo.put(text, tenant, session.authed, filters)
        return filters

    async def _read(
        self,
        session: Session,
        tenant: Tenant,
        sub_id: str,
        filters: list[Filter],
        sub: Subscription,
        started: float,
    ) -> None:
        """The stored part of a REQ from the store, on one of the client's read slots."""
        fanout = self.fanouts[tenant.key]
        try:
            async with self.gate.hold(session):
                rows = await self.store.query(
                    filters, tenant.key, session.authed, private=tenant.private_kinds
                )
        except StoreError as exc:
            metrics.read_closed(tenant.key, str(exc))
            fanout.unsubscribe(session, sub_id)
            session.send(wire.closed(sub_id, str(exc)))
            return
        if not fanout.is_current(sub):
            return  # closed or replaced while the query ran
        rest = self._answer(session, tenant, sub_id, sub, rows, started)
        if rest is not None:
            await rest

    def _answer(
        self,
        session: Session,
        tenant: Tenant,
        sub_id: str,
        sub: Subscription,
        rows: list[bytes],
        started: float,
    ) -> Coroutine[Any, Any, None] | None:
        """The stored events, EOSE, and the subscription live; a coroutine for the rest
        when the connection's queue is full."""
        # Handed over without a pause while the connection takes them; only an await
        # (a full queue) lets a CLOSE or a live overflow end the subscription meanwhile.
        if session.offer_events(sub.prefix, rows, wire.eose(sub_id)):  # all, and EOSE
            self._live(tenant, sub, rows, started)
            return None
        frames = [wire.event_frame(sub.prefix, raw) for raw in rows]
        i = session.offer_all(frames)
        if i < len(frames):
            return self._answer_rest(session, tenant, sub_id, sub, rows, started, frames, i)
        self._end_of_stored(session, tenant, sub_id, sub, rows, started)
        return None

    async def _answer_rest(
        self,
        session: Session,
        tenant: Tenant,
        sub_id: str,
        sub: Subscription,
        rows: list[bytes],
        started: float,
        frames: list[bytes],
        i: int,
    ) -> None:
        fanout = self.fanouts[tenant.key]
        while i < len(frames):
            await session.send_wait(frames[i])
            if not fanout.is_current(sub):
                return
            i = session.offer_all(frames, i + 1)
        self._end_of_stored(session, tenant, sub_id, sub, rows, started)

    def _end_of_stored(
        self,
        session: Session,
        tenant: Tenant,
        sub_id: str,
        sub: Subscription,
        rows: list[bytes],
        started: float,
    ) -> None:
        session.send(wire.eose(sub_id))
        self._live(tenant, sub, rows, started)

    def _live(self, tenant: Tenant, sub: Subscription, rows: list[bytes], started: float) -> None:
        """After EOSE: the REQ is done, and its subscription live."""
        metrics.req_done(tenant.key, started)
        if sub.pending:  # something was published meanwhile (rarely): what was not sent
            self.fanouts[tenant.key].go_live(sub, {wire.raw_id(raw) for raw in rows})
        else:
            sub.pending = None  # live

    async def count_reply(
        self, session: Session, tenant: Tenant, sub_id: str, raws: list[msgspec.Raw]
    ) -> None:
        session.send(await self.count(session, tenant, sub_id, raws))

    async def count(
        self, session: Session, tenant: Tenant, sub_id: str, raws: list[msgspec.Raw]
    ) -> bytes:
        """NIP-45: the number of matching events, under the same authorization as REQ."""
        filters = self.readable_filters(session, tenant, sub_id, raws)
        if isinstance(filters, bytes):
            return filters
        try:
            async with self.gate.hold(session):
                n = await self.store.count(
                    filters, tenant.key, session.authed, private=tenant.private_kinds
                )
        except StoreError as exc:
            metrics.read_closed(tenant.key, str(exc))
            return wire.closed(sub_id, str(exc))
        return wire.count(sub_id, n)

    def readable_filters(
        self, session: Session, tenant: Tenant, sub_id: str, raws: list[msgspec.Raw]
    ) -> list[Filter] | bytes:
        """Parsed filters the session may run, or the CLOSED frame refusing them.

        The private read gate runs here, before anything (search included) looks at them.
        """
        filters = self.parse_filters(sub_id, raws, tenant.limits)
        if isinstance(filters, bytes):
            return filters
        for f in filters:
            why = policy.check_read(f, session.authed, tenant)
            if why:
                session.challenge_for(why)
                return wire.closed(sub_id, why)
            restrict_search(f, self.search_kinds)
        return filters

    @staticmethod
    def parse_filters(sub_id: str, raws: list[msgspec.Raw], lim: Limits) -> list[Filter] | bytes:
        """Filters of a REQ, or the CLOSED frame that refuses them."""
        if len(sub_id) > lim.max_subid_length:
            return wire.closed(
                sub_id, Reason.INVALID(f"subscription id longer than {lim.max_subid_length}")
            )
        if not raws:
            return wire.closed(sub_id, Reason.INVALID("REQ needs at least one filter"))
        if len(raws) > lim.max_filters:
            return wire.closed(sub_id, Reason.INVALID(f"too many filters (max {lim.max_filters})"))
        filters: list[Filter] | None = None
        if type(raws) is wire.PlainFilters:  # decoded by wire's fast path
            filters = []
            for p in raws:
                f = from_plain(p, lim)
                if f is None:  # refused: parse_filter says why
                    filters, raws = None, wire.raw_filters(raws.frame)
                    break
                filters.append(f)
        if filters is None:
            try:
                filters = [parse_filter(bytes(r), lim) for r in raws]
            except FilterError as exc:
                return wire.closed(sub_id, Reason.INVALID(str(exc)))
        values = sum(map(value_count, filters))
        if values > lim.max_req_values:
            return wire.closed(
                sub_id,
                Reason.INVALID(f"too many values in one REQ ({values} > {lim.max_req_values})"),
            )
        return filters

    def subscriptions_full(
        self, session: Session, fanout: FanOut, sub_id: str, filters: list[Filter]
    ) -> str | None:
        """Why a REQ may not subscribe (a reason for CLOSED), else None: the connection's
        subscription cap, its address's, and for a NIP-50 search the address's and the
        process's search budgets. Called right before `subscribe`, with no await between."""
        lim = session.tenant.limits
        old = fanout.get(session, sub_id)  # a REQ with an open sub_id replaces it
        if old is None and fanout.count_for(session) >= lim.max_subscriptions:
            return Reason.BLOCKED(f"too many subscriptions (max {lim.max_subscriptions})")
        allow = session.allowance
        limited = allow is not None and not allow.exempt
        if limited and old is None:
            why = self.address_subscriptions_full(session, allow, sub_id)  # type: ignore[arg-type]
            if why:
                return why
        for f in filters:
            if f.search is not None:
                break
        else:
            return None  # no search
        if old is not None and old.terms is not None:
            return None  # one search replacing another
        cap = self.settings.search_subscriptions_max
        if cap and sum(f.searches for f in self.fanouts.values()) >= cap:
            return Reason.RATE_LIMITED("too many live searches on this relay; try again later")
        per_ip = self.settings.rate.search_subscriptions_per_ip
        if limited and per_ip:
            sessions = allow.address.sessions  # type: ignore[union-attr]
            if sum(fanout.searches_for(s) for s in sessions) >= per_ip:  # type: ignore[arg-type]
                return Reason.RATE_LIMITED(
                    f"too many live searches from your address (max {per_ip})"
                )
        return None

    def address_subscriptions_full(
        self, session: Session, allow: ConnectionAllowance, sub_id: str
    ) -> str | None:
        """The per-address subscription cap, for a REQ that would open a new one.

        Counting walks the address's connections, so it is skipped while they could not
        reach the cap even with every connection at `max_subscriptions`.
        """
        fanout = self.fanouts[session.tenant.key]
        cap = self.settings.rate.subscriptions_per_ip
        sessions = allow.address.sessions
        if not cap or fanout.has(session, sub_id):
            return None
        if len(sessions) * session.tenant.limits.max_subscriptions < cap:
            return None
        open_subs = sum(fanout.count_for(s) for s in sessions)  # type: ignore[arg-type]
        return self.limiter.check_subscriptions(allow, open_subs)
