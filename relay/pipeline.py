"""The relay's flow, top to bottom: parse -> validate -> authorize -> store -> fan out.

No Starlette, no SQL: the transport feeds frames in, the store is behind its interface.
Everything is per tenant: limits, policy, stored rows and the live fan-out.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from engram.nip01 import Event
from engram.urls import RelayUrl
from relay import metrics, policy, wire
from relay.config import Limits, Settings
from relay.fanout import FanOut
from relay.filters import Filter, FilterError, parse_filter, restrict_search, value_count
from relay.identity import listen_urls, parse_public_urls, tenant_urls
from relay.ingest import Ingest
from relay.negentropy import NegentropyService
from relay.ratelimit import ConnectionAllowance, RateLimiter
from relay.readgate import ReadGate
from relay.session import Session
from relay.store import EventBus, EventStore, StoreError
from relay.tenants import Tenant, TenantRegistry
from relay.verifier import BatchVerifier, Verifier
from relay.verifyproc import ProcessVerifier
from relay.wire import Reason

log = logging.getLogger("engram.relay")
BLOCKED_ADDRESS = Reason.BLOCKED("your address is blocked here")


class Relay:
    """One relay process: settings, tenants, a store and a live fan-out per tenant."""

    def __init__(
        self,
        settings: Settings,
        store: EventStore,
        clock: Callable[[], float] = time.time,
        tenants: TenantRegistry | None = None,
        bus: EventBus | None = None,
        verifier: Verifier | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.tenants = tenants or TenantRegistry(settings)
        self.fanouts: defaultdict[str, FanOut] = defaultdict(FanOut)
        self.limiter = RateLimiter(settings.rate)
        self.reads = ReadGate(settings.reads_per_connection, settings.reads_per_ip)
        self.bus = bus
        self.clock = clock
        kinds = settings.search_kinds
        self.search_kinds = None if kinds is None else frozenset(kinds)
        if verifier is None:
            if settings.verify_process:
                verifier = ProcessVerifier()
            elif settings.verify_threads:
                verifier = BatchVerifier(settings.verify_threads)
        # who this relay is (relay.identity): configured, never from a Host header
        self.public_urls = parse_public_urls(settings.public_urls, "public_urls")
        self.ingest = Ingest(store, self.fanouts, bus, clock, verifier, self.session_identity)
        self.receive_event = self.ingest.receive
        self.negentropy = NegentropyService(settings, store)

    def identity(self, tenant: Tenant, local: tuple[str, int] | None) -> frozenset[RelayUrl]:
        """The URLs `tenant` is known by, for a client that reached the relay's socket
        at `local` (relay.identity)."""
        s = self.settings
        listen = listen_urls(bool(s.tls_cert), s.host, s.port, local)
        return tenant_urls(tenant, self.public_urls, listen)

    def session_identity(self, tenant: Tenant, session: Session | None) -> frozenset[RelayUrl]:
        return self.identity(tenant, session.local if session is not None else None)

    def tenant_of(self, session: Session) -> Tenant:
        """The session's tenant as currently configured (members and limits change live)."""
        current = self.tenants.current(session.tenant)
        session.tenant = current
        return current

    # -- dispatch ---------------------------------------------------------------

    def handle(self, session: Session, frame: bytes | str) -> Coroutine[Any, Any, None] | None:
        """Handle one client frame; every bad input is answered, never raised.

        EVENT, CLOSE and AUTH are dealt with here and now (an EVENT waiting for its
        commit answers from a callback); REQ and COUNT return the coroutine that reads
        the store, for the transport to run.
        """
        tenant = self.tenant_of(session)
        mod = tenant.moderation
        if mod.blocked_ips and mod.ip_blocked(session.ip):  # blocked since it connected
            session.send(wire.notice(BLOCKED_ADDRESS))
            return None
        limit = tenant.limits.max_message_length
        if len(frame) > limit:
            session.send(
                wire.notice(Reason.INVALID(f"message too large ({len(frame)} > {limit} bytes)"))
            )
            return None
        try:
            msg = wire.decode(frame)
        except wire.WireError as exc:
            metrics.message(tenant.key, None)
            session.send(exc.reply)
            return None
        metrics.message(tenant.key, msg)
        limited = self.rate_limited(session, msg)
        if limited:
            metrics.limited(tenant.key, msg)
            session.send(limited)
        elif isinstance(msg, wire.EventMsg):
            return self.receive_event(session, tenant, msg.event)
        elif isinstance(msg, wire.ReqMsg):
            return self.request(session, tenant, msg.sub_id, msg.filters)
        elif isinstance(msg, wire.CloseMsg):
            self.fanouts[tenant.key].unsubscribe(session, msg.sub_id)
        elif isinstance(msg, wire.AuthMsg):
            session.send(self.authenticate(session, tenant, msg.event))
        elif isinstance(msg, wire.CountMsg):
            return self.count_reply(session, tenant, msg.sub_id, msg.filters)
        elif isinstance(msg, wire.NegOpenMsg):
            return self.negentropy.open(session, tenant, msg)
        elif isinstance(msg, wire.NegMsg):
            self.negentropy.message(session, msg)
        elif isinstance(msg, wire.NegCloseMsg):
            self.negentropy.close(session, msg.sub_id)
        return None

    def rate_limited(self, session: Session, msg: wire.Message) -> bytes | None:
        """The reply refusing a message over the connection's or address's rate, if any."""
        allow = session.allowance
        if allow is None or allow.exempt:  # loopback (relay.ratelimit.RateLimiter.exempt)
            return None
        now = self.clock()
        why = RateLimiter.check_message(allow, now)
        if not why and isinstance(msg, wire.EventMsg):
            why = RateLimiter.check_event(allow, now)
        if not why and isinstance(msg, wire.CountMsg):  # a REQ is checked as it subscribes
            why = self.address_subscriptions_full(session, allow, msg.sub_id)
        if not why:
            return None
        if isinstance(msg, wire.EventMsg):
            return wire.ok(msg.event.id, False, why)
        if isinstance(msg, wire.ReqMsg | wire.CountMsg):
            return wire.closed(msg.sub_id, why)
        if isinstance(msg, wire.NegOpenMsg | wire.NegMsg):
            return wire.neg_err(msg.sub_id, why)
        return wire.notice(why)

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

    # -- EVENT ------------------------------------------------------------------

    def admit(
        self, tenant: Tenant, event: Event, session: Session | None = None
    ) -> Coroutine[Any, Any, tuple[bool, str]]:
        """`engram import`'s path: the EVENT steps, awaited (relay.ingest.Ingest.admit)."""
        return self.ingest.admit(tenant, event, session)

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
            async with self.reads.hold(session):
                n = await self.store.count(
                    filters, tenant.key, session.authed, private=tenant.private_kinds
                )
        except StoreError as exc:
            metrics.read_closed(tenant.key, str(exc))
            return wire.closed(sub_id, str(exc))
        return wire.count(sub_id, n)

    async def request(
        self, session: Session, tenant: Tenant, sub_id: str, raws: list[msgspec.Raw]
    ) -> None:
        """Stored events newest first, EOSE, then live events until CLOSE."""
        started = metrics.start()
        lim = tenant.limits
        filters = self.readable_filters(session, tenant, sub_id, raws)
        if isinstance(filters, bytes):
            session.send(filters)
            return
        fanout = self.fanouts[tenant.key]
        why = self.subscriptions_full(session, fanout, sub_id, filters)
        if why:
            session.send(wire.closed(sub_id, why))
            return
        for f in filters:
            policy.clamp_limit(f, lim)
        # no await since the checks above: counted and registered at once, so REQs sent
        # together (from many connections of one address) cannot all pass a cap
        sub = fanout.subscribe(session, sub_id, filters, pending=True)
        try:
            async with self.reads.hold(session):
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
        # Handed over without a pause while the connection takes them; only an await
        # (a full queue) lets a CLOSE or a live overflow end the subscription meanwhile.
        frames = [wire.event_frame(sub.prefix, raw) for raw in rows]
        i = session.offer_all(frames)
        while i < len(frames):
            await session.send_wait(frames[i])
            if not fanout.is_current(sub):
                return
            i = session.offer_all(frames, i + 1)
        metrics.req_done(tenant.key, started)
        session.send(wire.eose(sub_id))
        # ids of what was sent only if something was published meanwhile (rarely)
        fanout.go_live(sub, {wire.raw_id(raw) for raw in rows} if sub.pending else set())

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
        if all(f.search is None for f in filters) or (old is not None and old.terms is not None):
            return None  # no search, or one search replacing another
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

    # -- AUTH -------------------------------------------------------------------

    def authenticate(self, session: Session, tenant: Tenant, event: Event) -> bytes:
        """NIP-42: the AUTH must name one of the tenant's configured URLs (a relay in the
        middle cannot pass on an AUTH its victim signed for it); an AUTH sent before the
        challenge was (`when-needed`) is answered with it."""
        why = policy.check_auth_event(
            event,
            session.challenge,
            self.session_identity(tenant, session),
            int(self.clock()),
            self.settings.auth_window_seconds,
        )
        if why:
            session.challenge_for(why)
            return wire.ok(event.id, False, why)
        admitted, why = policy.admit_agent(event, tenant)
        if why:
            return wire.ok(event.id, False, why)
        session.authed = event.pubkey
        session.admitted = admitted
        return wire.ok(event.id, True)

    def deliver_remote(self, tenant: str, raw: bytes) -> None:
        """An event another node stored or published: to this node's subscribers."""
        fanout = self.fanouts.get(tenant)
        if fanout is None or not len(fanout):
            return
        try:
            event = wire.decode_stored(raw)
        except ValueError:
            log.warning("undecodable event from the bus ignored")
            return
        self.ingest.publish_live(self.tenants.by_key(tenant), event, raw)

    def connect(self, tenant: Tenant, ip: str) -> ConnectionAllowance | None:
        """Admit a new connection from `ip`, or None when the address has too many."""
        return self.limiter.connect(tenant.key, ip, self.clock())

    def start(self) -> None:
        """Starting up, in the loop: the signature worker (relay.verifyproc)."""
        self.ingest.start()

    def close(self) -> None:
        """Shutting down: every EVENT still waiting for a check is answered."""
        self.ingest.close()

    def disconnect(self, session: Session) -> None:
        session.closed = True
        self.fanouts[session.tenant.key].drop_connection(session)
        self.negentropy.drop_connection(session)
        if session.allowance is not None:
            self.limiter.disconnect(session.tenant.key, session.ip, session)
