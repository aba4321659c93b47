"""The EVENT path after parsing: validate, verify, authorize, store, then OK and fan out.

Whichever way an EVENT is checked (inline, or its signature in the verify thread) it ends
in one tail, `_accept`: the OK with its metrics, the fan-out of what was stored or
published, and the connection's in-flight count. `admit` is the same steps awaited.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from typing import Any

from engram.kinds import is_ephemeral
from engram.nip01 import Event
from engram.nip62 import KIND_VANISH
from engram.urls import RelayUrl
from relay import metrics, policy, validate, wire
from relay.fanout import FanOut
from relay.session import Session
from relay.store import EventBus, EventStore, SaveResult, SaveStatus
from relay.tenants import Tenant
from relay.verifier import Verdict, Verifier
from relay.wire import Reason

# the URLs a tenant is known by, for a connection (None: `engram import`), relay.identity
Identity = Callable[[Tenant, Session | None], frozenset[RelayUrl]]


class Ingest:
    """EVENTs of every connection, into the store and out to subscribers."""

    def __init__(
        self,
        store: EventStore,
        fanouts: defaultdict[str, FanOut],
        bus: EventBus | None = None,
        clock: Callable[[], float] = time.time,
        verifier: Verifier | None = None,
        identity: Identity | None = None,
    ) -> None:
        self.store = store
        self.fanouts = fanouts
        self.bus = bus
        self.clock = clock
        self.verifier = verifier
        self.identity: Identity = identity or (lambda tenant, session: tenant.public_urls)
        self._background: set[asyncio.Future[None]] = set()

    def receive(
        self, session: Session, tenant: Tenant, event: Event
    ) -> Coroutine[Any, Any, None] | None:
        """An EVENT from a connection. A stored event's OK is sent by a callback when its
        batch commits (no task per event); only an ephemeral one returns a coroutine (the
        bus hand-off)."""
        if self.verifier is None:
            return self._accept(session, tenant, event, self.check(tenant, event, session), False)
        why = validate.check_unsigned(event, tenant.limits, int(self.clock()))
        if why:
            self.answer(session, tenant, event, False, why)
            return None
        session.event_started()
        self.verifier.submit(event, lambda verdict: self._verified(session, tenant, event, verdict))
        return None

    def _verified(self, session: Session, tenant: Tenant, event: Event, verdict: Verdict) -> None:
        """`receive` after the verifier's verdict (the event is counted in flight)."""
        if verdict is True:
            why = self.may_write(session, tenant, event)
        elif verdict is False:
            why = validate.INVALID_SIGNATURE
        else:  # not checked: the `error: …` reason why, never `invalid:`
            why = verdict
        work = self._accept(session, tenant, event, why, True)
        if work is not None:
            task = asyncio.ensure_future(work)
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _accept(
        self, session: Session, tenant: Tenant, event: Event, why: str | None, counted: bool
    ) -> Coroutine[Any, Any, None] | None:
        """The one tail of a connection's EVENT once checked: refused or ephemeral, the OK
        now; otherwise stored, the OK when its batch commits. `counted`: in flight."""
        if why or is_ephemeral(event.kind):
            if counted:
                session.event_done()
            if why:
                self.answer(session, tenant, event, False, why)
                return None
            self.answer(session, tenant, event, True, "")
            return self.publish_ephemeral(tenant, event, wire.encode_event(event))
        if not counted:
            session.event_started()
        raw = wire.encode_event(event)
        self.store.enqueue(
            event,
            raw,
            tenant.key,
            lambda result: self._committed(session, tenant, event, raw, result),
        )
        return None

    def _committed(
        self, session: Session, tenant: Tenant, event: Event, raw: bytes, result: SaveResult
    ) -> None:
        session.event_done()
        accepted, message = self.outcome(tenant, event, raw, result)
        self.answer(session, tenant, event, accepted, message)

    @staticmethod
    def answer(session: Session, tenant: Tenant, event: Event, ok: bool, message: str) -> None:
        metrics.event_result(tenant.key, event.kind, ok, message)
        if not ok:
            session.challenge_for(message)
        session.send(wire.ok(event.id, ok, message))

    async def admit(
        self, tenant: Tenant, event: Event, session: Session | None = None
    ) -> tuple[bool, str]:
        """Validate, authorize, store, then fan out: (accepted, OK message).

        The same steps as `receive`, awaited: `engram import` uses it with `session` None
        (the operator's own path: same validation and store rules, no per-connection
        write policy).
        """
        why = self.check(tenant, event, session)
        if why:
            return False, why
        raw = wire.encode_event(event)
        if is_ephemeral(event.kind):
            await self.publish_ephemeral(tenant, event, raw)
            return True, ""
        return self.outcome(tenant, event, raw, await self.store.save(event, raw, tenant.key))

    def check(self, tenant: Tenant, event: Event, session: Session | None) -> str | None:
        """Validation (cheapest first), then the write policy: None, or the refusal."""
        return validate.check_event(event, tenant.limits, int(self.clock())) or self.may_write(
            session, tenant, event
        )

    def may_write(self, session: Session | None, tenant: Tenant, event: Event) -> str | None:
        """Whether the tenant takes a valid event: its moderation (NIP-86), then its write
        policy (none for `engram import`, session None). A request to vanish naming this
        relay (by one of its configured URLs, never the Host header) is taken from
        anyone: NIP-62 binds relays whatever the author's status."""
        if event.kind == KIND_VANISH:
            return policy.check_vanish(event, self.identity(tenant, session))
        why = policy.check_moderated(event, tenant)
        if why is None and session is not None:
            why = policy.check_write(event, session.authed, session.admitted, tenant)
        return why

    def outcome(
        self, tenant: Tenant, event: Event, raw: bytes, result: SaveResult
    ) -> tuple[bool, str]:
        """What the store said, as (accepted, OK message); a new head is fanned out."""
        if result.status is SaveStatus.STORED:
            self.publish_live(tenant, event, raw)
            return True, ""
        if result.status in (SaveStatus.ERROR, SaveStatus.BLOCKED):
            return False, result.message or Reason.ERROR("could not store")
        return True, result.message  # DUPLICATE or STALE: "duplicate: …", from the store

    async def publish_ephemeral(self, tenant: Tenant, event: Event, raw: bytes) -> None:
        """Ephemeral events are never stored: this node's subscribers, then the bus."""
        self.publish_live(tenant, event, raw)
        if self.bus is not None:
            await self.bus.publish_ephemeral(tenant.key, raw)

    def publish_live(self, tenant: Tenant, event: Event, raw: bytes) -> None:
        """To this node's matching subscribers that may see it (the tenant's private
        kinds go to their parties only), counted."""
        sent = self.fanouts[tenant.key].publish(event, raw, tenant.private_kinds)
        metrics.live_sent(tenant.key, sent)

    def start(self) -> None:
        """Starting up (in the loop): the signature checker's worker, if it has one."""
        if self.verifier is not None:
            self.verifier.start()

    def close(self) -> None:
        """Shutting down: EVENTs still waiting for their signature check are answered."""
        if self.verifier is not None:
            self.verifier.close()
