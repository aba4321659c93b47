"""NIP-42 on the relay: an AUTH frame checked and, when it holds, the connection's
identity set (`Session.authed`, and the NIP-OA clauses that admitted it).

The AUTH must name one of the tenant's URLs (relay.identity: configured, never the Host
header), so a relay in the middle cannot pass on an AUTH its victim signed for it. An
AUTH sent before the challenge was (`auth_challenge = "when-needed"`) is answered with it.
"""

from __future__ import annotations

from collections.abc import Callable

from engram.nip01 import Event
from relay import policy, wire
from relay.identity import RelayIdentity
from relay.session import Session
from relay.tenants import Tenant


class Auth:
    """Answers AUTH frames: the OK, after `Session.authed` is set (or the refusal)."""

    def __init__(self, identity: RelayIdentity, window: int, clock: Callable[[], float]) -> None:
        self.identity = identity
        self.window = window  # seconds an AUTH's created_at may be off (auth_window_seconds)
        self.clock = clock

    def answer(self, session: Session, tenant: Tenant, event: Event) -> bytes:
        why = policy.check_auth_event(
            event,
            session.challenge,
            self.identity.of_session(tenant, session),
            int(self.clock()),
            self.window,
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
