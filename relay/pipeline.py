"""The relay's flow, top to bottom: parse -> validate -> authorize -> store -> fan out.

No Starlette, no SQL: the transport feeds frames in, the store is behind its interface.
Everything is per tenant: limits, policy, stored rows and the live fan-out.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable

import msgspec

from engram.nip01 import Event
from relay import policy, validate, wire
from relay.config import Limits, Settings
from relay.fanout import FanOut
from relay.filters import Filter, FilterError, parse_filter
from relay.session import Session
from relay.store import EventStore, SaveStatus, StoreError
from relay.tenants import Tenant, TenantRegistry
from relay.wire import Reason

log = logging.getLogger("engram.relay")

_SAVE_REPLY = {
    SaveStatus.DUPLICATE: "duplicate: already have this event",
    SaveStatus.STALE: "duplicate: a newer version of this replaceable event is stored",
}


class Relay:
    """One relay process: settings, tenants, a store and a live fan-out per tenant."""

    def __init__(
        self,
        settings: Settings,
        store: EventStore,
        clock: Callable[[], float] = time.time,
        tenants: TenantRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.tenants = tenants or TenantRegistry(settings)
        self.fanouts: defaultdict[str, FanOut] = defaultdict(FanOut)
        self.clock = clock

    def tenant_of(self, session: Session) -> Tenant:
        """The session's tenant as currently configured (members and limits change live)."""
        current = self.tenants.current(session.tenant)
        session.tenant = current
        return current

    # -- dispatch ---------------------------------------------------------------

    async def handle(self, session: Session, frame: bytes | str) -> None:
        """Handle one client frame; every bad input is answered, never raised."""
        tenant = self.tenant_of(session)
        limit = tenant.limits.max_message_length
        if len(frame) > limit:
            session.send(
                wire.notice(Reason.INVALID(f"message too large ({len(frame)} > {limit} bytes)"))
            )
            return
        try:
            msg = wire.decode(frame)
        except wire.WireError as exc:
            session.send(exc.reply)
            return
        if isinstance(msg, wire.EventMsg):
            session.send(await self.ingest(session, tenant, msg.event))
        elif isinstance(msg, wire.ReqMsg):
            await self.request(session, tenant, msg.sub_id, msg.filters)
        elif isinstance(msg, wire.CloseMsg):
            self.fanouts[tenant.key].unsubscribe(session, msg.sub_id)
        elif isinstance(msg, wire.AuthMsg):
            session.send(self.authenticate(session, tenant, msg.event))
        elif isinstance(msg, wire.CountMsg):
            session.send(wire.closed(msg.sub_id, Reason.INVALID("COUNT is not supported")))

    # -- EVENT ------------------------------------------------------------------

    async def ingest(self, session: Session, tenant: Tenant, event: Event) -> bytes:
        """Validate, authorize, store, then fan out; returns the OK frame."""
        now = int(self.clock())
        why = validate.check_event(event, tenant.limits, now) or policy.check_write(
            event, session.authed, session.admitted, tenant
        )
        if why:
            return wire.ok(event.id, False, why)
        raw = wire.encode_event(event)
        if validate.is_ephemeral(event.kind):
            self.fanouts[tenant.key].publish(event, raw)
            return wire.ok(event.id, True)
        result = await self.store.save(event, raw, tenant.key)
        if result.status is SaveStatus.STORED:
            self.fanouts[tenant.key].publish(event, raw)
            return wire.ok(event.id, True)
        if result.status is SaveStatus.ERROR:
            return wire.ok(event.id, False, result.message or Reason.ERROR("could not store"))
        return wire.ok(event.id, True, _SAVE_REPLY[result.status])

    # -- REQ --------------------------------------------------------------------

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
        try:
            return [parse_filter(bytes(r), lim) for r in raws]
        except FilterError as exc:
            return wire.closed(sub_id, Reason.INVALID(str(exc)))

    async def request(
        self, session: Session, tenant: Tenant, sub_id: str, raws: list[msgspec.Raw]
    ) -> None:
        """Stored events newest first, EOSE, then live events until CLOSE."""
        lim = tenant.limits
        filters = self.parse_filters(sub_id, raws, lim)
        if isinstance(filters, bytes):
            session.send(filters)
            return
        for f in filters:  # the read gate runs before anything else looks at the filter
            why = policy.check_read(f, session.authed, lim)
            if why:
                session.send(wire.closed(sub_id, why))
                return
        fanout = self.fanouts[tenant.key]
        if not fanout.has(session, sub_id) and fanout.count_for(session) >= lim.max_subscriptions:
            session.send(
                wire.closed(
                    sub_id,
                    Reason.BLOCKED(f"too many subscriptions (max {lim.max_subscriptions})"),
                )
            )
            return
        for f in filters:
            policy.clamp_limit(f, lim)
        sub = fanout.subscribe(session, sub_id, filters, pending=True)
        try:
            rows = await self.store.query(filters, tenant.key, session.authed)
        except StoreError as exc:
            fanout.unsubscribe(session, sub_id)
            session.send(wire.closed(sub_id, str(exc)))
            return
        if not fanout.is_current(sub):
            return  # closed or replaced while the query ran
        for raw in rows:
            await session.send_wait(wire.event_frame(sub.prefix, raw))
        if not fanout.is_current(sub):
            return
        session.send(wire.eose(sub_id))
        fanout.go_live(sub, {wire.raw_id(raw) for raw in rows})

    # -- AUTH -------------------------------------------------------------------

    def authenticate(self, session: Session, tenant: Tenant, event: Event) -> bytes:
        hosts = tenant.hosts or frozenset([policy.host_of(session.host)])
        why = policy.check_auth_event(
            event, session.challenge, hosts, int(self.clock()), self.settings.auth_window_seconds
        )
        if why:
            return wire.ok(event.id, False, why)
        admitted, why = policy.admit_agent(event, tenant)
        if why:
            return wire.ok(event.id, False, why)
        session.authed = event.pubkey
        session.admitted = admitted
        return wire.ok(event.id, True)

    def disconnect(self, session: Session) -> None:
        session.closed = True
        self.fanouts[session.tenant.key].drop_connection(session)
