"""Per-connection state: identity (NIP-42), the AUTH challenge, and the way out.

The challenge goes out once: when the connection opens (`auth_challenge = "on-connect"`)
or with the first `auth-required:` answer (`"when-needed"`, `challenge_for`), so that a
client that does not speak NIP-42 never sees an AUTH frame it could take for the answer
to its first EVENT.

Transport-agnostic: the transport passes in `send` (non-blocking, enqueue or drop the
connection), `send_wait` (await room in the connection's bounded queue) and `offer`
(send_wait's synchronous fast path: False when it would have to wait), and may pass
`offer_events` (a REQ's whole answer in one call when its socket takes it now).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from engram.nipoa import Clause
from relay import wire
from relay.ratelimit import ConnectionAllowance
from relay.tenants import Tenant

if TYPE_CHECKING:
    from relay.readgate import Slots

AUTH_REQUIRED = wire.Reason.AUTH_REQUIRED + ":"


class Session:
    __slots__ = (
        "_challenge",
        "_offer",
        "_offer_all",
        "_offer_events",
        "_send",
        "_send_wait",
        "admitted",
        "allowance",
        "authed",
        "challenged",
        "closed",
        "host",
        "in_flight",
        "ip",
        "local",
        "negentropy",
        "on_event_done",
        "reads",
        "tenant",
    )

    def __init__(
        self,
        challenge: str | None,
        host: str,
        send: Callable[[bytes], None],
        send_wait: Callable[[bytes], Awaitable[None]],
        offer: Callable[[bytes], bool],
        tenant: Tenant,
        ip: str = "",
        allowance: ConnectionAllowance | None = None,
        *,
        offer_all: Callable[[list[bytes], int], int] | None = None,
        local: tuple[str, int] | None = None,
        offer_events: Callable[[bytes, list[bytes], bytes], bool] | None = None,
    ) -> None:
        self._challenge = challenge  # None: made when first needed (most never are)
        self.challenged = False  # the challenge was sent
        self.host = host
        # the address and port this connection reached on the relay (the socket's own,
        # never a header): which of its listening URLs it used (relay.identity)
        self.local = local
        self.tenant = tenant
        self.ip = ip
        self.allowance = allowance  # rate-limit buckets (None: unlimited, e.g. tests)
        self.authed: str | None = None
        # NIP-OA: the clauses of the member owner's attestation that admitted `authed`
        self.admitted: tuple[Clause, ...] | None = None
        self.closed = False
        self.in_flight = 0  # EVENTs waiting for their commit
        self.on_event_done: Callable[[], None] | None = None  # the transport's wake-up
        self.negentropy: dict[str, Any] | None = None  # NIP-77 sessions (relay.negentropy)
        self.reads: Slots | None = None  # store reads in flight (relay.readgate)
        self._send = send
        self._send_wait = send_wait
        self._offer = offer
        self._offer_all = offer_all or functools.partial(offer_each, offer)
        self._offer_events = offer_events

    @property
    def challenge(self) -> str:
        """The NIP-42 challenge of this connection, made on first use."""
        if self._challenge is None:
            self._challenge = secrets.token_hex(16)
        return self._challenge

    def event_started(self) -> None:
        self.in_flight += 1

    def event_done(self) -> None:
        self.in_flight -= 1
        if self.on_event_done is not None:
            self.on_event_done()

    def send_challenge(self) -> None:
        """The AUTH challenge, once per connection."""
        if not self.challenged:
            self.challenged = True
            self.send(wire.auth_challenge(self.challenge))

    def challenge_for(self, reason: str) -> None:
        """Before an answer refusing with `reason`: an `auth-required:` one comes with the
        challenge if it was not sent yet (NIP-42 lets a relay send it at any time)."""
        if not self.challenged and reason.startswith(AUTH_REQUIRED):
            self.send_challenge()

    def send(self, frame: bytes) -> None:
        """Non-blocking: replies and live events; a full queue disconnects the reader."""
        if not self.closed:
            self._send(frame)

    def offer(self, frame: bytes) -> bool:
        """Bulk output without awaiting, when there is room; False: await `send_wait`."""
        return self.closed or self._offer(frame)

    def offer_all(self, frames: list[bytes], start: int = 0) -> int:
        """`offer` for `frames[start:]`: the index of the first frame not taken (await
        `send_wait` for it), len(frames) once all were."""
        return len(frames) if self.closed else self._offer_all(frames, start)

    def offer_events(self, prefix: bytes, raws: list[bytes], last: bytes) -> bool:
        """A REQ's stored events (each frame `prefix + raw + "]"`, relay.wire.event_frame)
        and `last` (its EOSE) in one call, all of them or none (False: the caller sends
        them frame by frame), when the socket takes them now."""
        if self.closed:
            return True
        offer = self._offer_events
        return offer is not None and offer(prefix, raws, last)

    async def send_wait(self, frame: bytes) -> None:
        """Waits for queue room: bulk stored results must not look like a slow reader."""
        if not self.closed:
            await self._send_wait(frame)


def offer_each(offer: Callable[[bytes], bool], frames: list[bytes], start: int) -> int:
    """`offer_all` by one `offer` per frame: the index of the first frame not taken,
    len(frames) once all were."""
    for i in range(start, len(frames)):
        if not offer(frames[i]):
            return i
    return len(frames)
