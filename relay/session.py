"""Per-connection state: identity (NIP-42), the AUTH challenge, and the way out.

Transport-agnostic: the transport passes in a non-blocking `send` that enqueues a frame
on the connection's bounded queue.
"""

from __future__ import annotations

from collections.abc import Callable

from relay.store import DEFAULT_TENANT


class Session:
    __slots__ = ("_send", "authed", "challenge", "closed", "host", "tenant")

    def __init__(
        self,
        challenge: str,
        host: str,
        send: Callable[[bytes], None],
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        self.challenge = challenge
        self.host = host
        self.tenant = tenant
        self.authed: str | None = None
        self.closed = False
        self._send = send

    def send(self, frame: bytes) -> None:
        if not self.closed:
            self._send(frame)
