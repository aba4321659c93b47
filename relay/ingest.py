"""The EVENT path: validate, verify, authorize, store, then the OK and the fan-out.

`Ingest.receive` states it, in order, with each step's home; read it first. The steps
that wait (the signature worker, the batch's commit) continue in callbacks named as
steps there, and every checked EVENT ends in one tail, `_store`: the OK with its metrics,
the fan-out of what was stored or published, and the connection's in-flight count.
`admit` is the same steps awaited (`engram import`).
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
from relay.store import EventBus, EventWrites, SaveResult, SaveStatus
from relay.tenants import Tenant
from relay.verifier import Verdict, Verifier
from relay.wire import Reason

# the URLs a tenant is known by, for a connection (None: `engram import`), relay.identity
Identity = Callable[[Tenant, Session | None], frozenset[RelayUrl]]


class Ingest:
    """EVENTs of every connection, into the store and out to subscribers."""

    def __init__(
        self,
        store: EventWrites,
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
        """An EVENT from a connection, parsed (relay.pipeline: wire.decode). The path, in
        order; where a step waits, the next is a callback named here, so no task and no
        future is made per EVENT (a future each cost ~3 us an EVENT,
        bench/RESULTS-HISTORY.md, issue 24):

        1. validate   validate.check_unsigned: shape and limits, NIP-40, kind rules and
                      the engram envelope, NIP-13, the id; cheapest first
        2. verify     verifier.submit: the BIP-340 check, batched off the loop; its
                      verdict comes back to `_authorize`
        3. authorize  `_authorize` -> `may_write`: NIP-62, moderation, the write policy
        4. store      `_store` -> store.enqueue; the commit comes back to `_committed`
        5. answer     `_committed` -> `outcome`: the store's answer is the OK
        6. fan out    `outcome` -> `publish_live`: a stored event to this node's
                      subscribers; other nodes read it from the bus (relay.store.pgbus)

        A refusal at any step is answered at once (`answer`); so is an ephemeral event,
        published instead of stored (`publish_ephemeral`: the only coroutine returned,
        the bus hand-off). Without a verifier, steps 1-3 run inline (`check`).
        """
        if self.verifier is None:
            return self._store(session, tenant, event, self.check(tenant, event, session), False)
        why = validate.check_unsigned(event, tenant.limits, int(self.clock()))  # 1. validate
        if why:
            self.answer(session, tenant, event, False, why)
            return None
        session.event_started()
        # 2. verify; 3. authorize when the verdict comes
        self.verifier.submit(
            event, lambda verdict: self._authorize(session, tenant, event, verdict)
        )
        return None

    def _authorize(self, session: Session, tenant: Tenant, event: Event, verdict: Verdict) -> None:
        """Step 3, with the verifier's verdict (the event is counted in flight); then 4."""
        if verdict is True:
            why = self.may_write(session, tenant, event)
        elif verdict is False:
            why = validate.INVALID_SIGNATURE
        else:  # not checked: the `error: …` reason why, never `invalid:`
            why = verdict
        work = self._store(session, tenant, event, why, True)
        if work is not None:
            task = asyncio.ensure_future(work)
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _store(
        self, session: Session, tenant: Tenant, event: Event, why: str | None, counted: bool
    ) -> Coroutine[Any, Any, None] | None:
        """Step 4, the one tail of a connection's EVENT once checked: refused or ephemeral,
        the OK now; otherwise stored, the OK when its batch commits (step 5, `_committed`).
        `counted`: in flight."""
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
        """Steps 5 and 6, once the event's batch committed (or could not)."""
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
