"""The relay's front door: each client frame dispatched to the path that handles it.

`Relay.handle` is the dispatcher: the tenant as currently configured, a blocked address,
the frame size, parsing (relay.wire), the rate limits, then the message's verb:

  EVENT               relay.ingest: Ingest.receive states the EVENT path, in order
  REQ, COUNT, CLOSE   relay.reads: Reads.request, Reads.count_reply; CLOSE ends a live
                      subscription (relay.fanout)
  AUTH                relay.auth (NIP-42)
  NEG-OPEN, NEG-MSG,  relay.negentropy (NIP-77)
  NEG-CLOSE

`Relay` is otherwise wiring: one store (relay.store.EventStore) and one live fan-out per
tenant shared by those paths, the signature checker, the rate limiter, who the relay is
(relay.identity), and the connection's start and end. No Starlette, no SQL: the
transport feeds frames in, the store is behind its interface.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from typing import Any

from engram.nip01 import Event
from relay import metrics, wire
from relay.auth import Auth
from relay.config import Settings
from relay.fanout import FanOut
from relay.identity import RelayIdentity
from relay.ingest import Ingest
from relay.negentropy import NegentropyService
from relay.ratelimit import ConnectionAllowance, RateLimiter
from relay.reads import Reads
from relay.reqmemo import REQ_START, split_req
from relay.session import Session
from relay.store import EventBus, EventStore
from relay.tenants import Tenant, TenantRegistry
from relay.verifier import BatchVerifier, Verifier
from relay.verifyproc import ProcessVerifier
from relay.wire import Reason

log = logging.getLogger("engram.relay")
BLOCKED_ADDRESS = Reason.BLOCKED("your address is blocked here")


def default_verifier(settings: Settings) -> Verifier | None:
    """The signature checker the settings ask for: a worker process (relay.verifyproc),
    else `verify_threads` threads (relay.verifier), else None (inline, on the loop)."""
    if settings.verify_process:
        return ProcessVerifier()
    if settings.verify_threads:
        return BatchVerifier(settings.verify_threads)
    return None


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
        self.bus = bus
        self.clock = clock
        # who this relay is (relay.identity): configured, never from a Host header
        self.identity = RelayIdentity(settings)
        self.ingest = Ingest(
            store,
            self.fanouts,
            bus,
            clock,
            verifier if verifier is not None else default_verifier(settings),
            self.identity.of_session,
        )
        self.reads = Reads(settings, store, self.fanouts, self.limiter)
        self.auth = Auth(self.identity, settings.auth_window_seconds, clock)
        self.negentropy = NegentropyService(settings, store)

    # -- dispatch ---------------------------------------------------------------

    def handle(self, session: Session, frame: bytes | str) -> Coroutine[Any, Any, None] | None:
        """Handle one client frame; every bad input is answered, never raised.

        EVENT, CLOSE and AUTH are dealt with here and now (an EVENT waiting for its
        commit answers from a callback); REQ and COUNT return the coroutine that reads
        the store, for the transport to run.
        """
        # the session's tenant as currently configured (members and limits change live)
        tenant = session.tenant = self.tenants.current(session.tenant)
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
        msg: wire.Message | None = None
        req = None  # a compact REQ's (id, filter text): relay.reqmemo
        if type(frame) is str and frame.startswith(REQ_START) and self.reads.memo is not None:
            req = split_req(frame)
            if req is not None:  # filters a REQ of this text had: the frame is not decoded
                kept = self.reads.kept(req[0], req[1], tenant, session.authed)
                if kept is not None:
                    msg = wire.ReqMsg(req[0], kept)  # type: ignore[arg-type]
        if msg is None:
            try:
                msg = wire.decode(frame)
            except wire.WireError as exc:
                metrics.message(tenant.key, None)
                session.send(exc.reply)
                return None
        metrics.message(tenant.key, msg)
        allow = session.allowance
        # loopback (relay.ratelimit.RateLimiter.exempt) is never limited: no call for it
        limited = None if allow is None or allow.exempt else self.rate_limited(session, allow, msg)
        if limited:
            metrics.limited(tenant.key, msg)
            session.send(limited)
        elif isinstance(msg, wire.EventMsg):
            return self.ingest.receive(session, tenant, msg.event)
        elif isinstance(msg, wire.ReqMsg):
            text = req[1] if req is not None and req[0] == msg.sub_id else None
            return self.reads.request(session, tenant, msg.sub_id, msg.filters, text)
        elif isinstance(msg, wire.CloseMsg):
            self.fanouts[tenant.key].unsubscribe(session, msg.sub_id)
        elif isinstance(msg, wire.AuthMsg):
            session.send(self.auth.answer(session, tenant, msg.event))
        elif isinstance(msg, wire.CountMsg):
            return self.reads.count_reply(session, tenant, msg.sub_id, msg.filters)
        elif isinstance(msg, wire.NegOpenMsg):
            return self.negentropy.open(session, tenant, msg)
        elif isinstance(msg, wire.NegMsg):
            self.negentropy.message(session, msg)
        elif isinstance(msg, wire.NegCloseMsg):
            self.negentropy.close(session, msg.sub_id)
        return None

    def rate_limited(
        self, session: Session, allow: ConnectionAllowance, msg: wire.Message
    ) -> bytes | None:
        """The reply refusing a message over the connection's or address's rate (`allow`,
        the session's, not exempt), if any."""
        now = self.clock()
        why = RateLimiter.check_message(allow, now)
        if not why and isinstance(msg, wire.EventMsg):
            why = RateLimiter.check_event(allow, now)
        if not why and isinstance(msg, wire.CountMsg):  # a REQ is checked as it subscribes
            why = self.reads.address_subscriptions_full(session, allow, msg.sub_id)
        if not why:
            return None
        if isinstance(msg, wire.EventMsg):
            return wire.ok(msg.event.id, False, why)
        if isinstance(msg, wire.ReqMsg | wire.CountMsg):
            return wire.closed(msg.sub_id, why)
        if isinstance(msg, wire.NegOpenMsg | wire.NegMsg):
            return wire.neg_err(msg.sub_id, why)
        return wire.notice(why)

    # -- wiring ------------------------------------------------------------------------

    def admit(
        self, tenant: Tenant, event: Event, session: Session | None = None
    ) -> Coroutine[Any, Any, tuple[bool, str]]:
        """`engram import`'s path: the EVENT steps, awaited (relay.ingest.Ingest.admit)."""
        return self.ingest.admit(tenant, event, session)

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
