"""Who the relay is: the URLs a NIP-42 AUTH, a NIP-62 request to vanish and a NIP-98
token must name to be taken here.

From configuration only, never from what a client says (its Host header routes it to a
tenant, nothing more):
- a tenant's own public URLs (`engram tenant set HOST --public-url …`);
- else its host names at the scheme, port and path of the relay's public URLs
  (`public_urls`, `--public-url`), which the built-in tenant answers as they are;
- with no public URL configured, the URL the relay actually listens on: its port on
  127.0.0.1, localhost, [::1] and the bind address (not a wildcard one: which of the
  machine's addresses a client uses is not known here); wss:// when it serves TLS.
Pure: the transport passes in the local port a connection reached (the port the relay
was given may be 0).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from engram.urls import RelayUrl, normalize_host
from relay.config import parse_public_urls as parse_public_urls  # the settings' check

if TYPE_CHECKING:
    from relay.config import Settings
    from relay.session import Session
    from relay.tenants import Tenant

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
WILDCARD_BINDS = ("", "0.0.0.0", "::")


def listen_urls(
    secure: bool, bind: str, port: int, local: tuple[str, int] | None = None
) -> frozenset[RelayUrl]:
    """The URLs of the socket the relay listens on: loopback names and the bind address,
    at the port a connection actually reached (`local`: the socket's own address, never
    a header; the port matters when the relay was started on port 0)."""
    if local is not None:
        port = local[1]
    hosts = set(LOOPBACK_NAMES)
    if bind not in WILDCARD_BINDS:
        hosts.add(bind)
    return frozenset(RelayUrl(secure, normalize_host(h), port, "") for h in hosts)


def tenant_urls(
    tenant: Tenant, public: frozenset[RelayUrl], listen: frozenset[RelayUrl]
) -> frozenset[RelayUrl]:
    """The URLs `tenant` is known by (see the module docstring for the order)."""
    if tenant.public_urls:
        return tenant.public_urls
    bases = public or listen
    if not tenant.hosts:  # the built-in tenant of a relay without tenants
        return bases
    return frozenset(b.with_host(h) for b in bases for h in tenant.hosts)


class RelayIdentity:
    """Who this relay is, for a connection: its configured public URLs (validated once,
    here), else the URLs of the socket the connection reached."""

    def __init__(self, settings: Settings) -> None:
        self.public_urls = parse_public_urls(settings.public_urls, "public_urls")
        self._secure = bool(settings.tls_cert)
        self._bind = settings.host
        self._port = settings.port

    def urls(self, tenant: Tenant, local: tuple[str, int] | None) -> frozenset[RelayUrl]:
        """The URLs `tenant` is known by, for a client that reached the relay's socket at
        `local` (its own address and port, from the transport)."""
        listen = listen_urls(self._secure, self._bind, self._port, local)
        return tenant_urls(tenant, self.public_urls, listen)

    def of_session(self, tenant: Tenant, session: Session | None) -> frozenset[RelayUrl]:
        """`urls` for a connection's session (None: `engram import`, no socket)."""
        return self.urls(tenant, session.local if session is not None else None)


def ordered(urls: Iterable[RelayUrl]) -> list[str]:
    """URLs as text, the way to show them: secure first, then names before addresses."""
    return sorted(
        map(str, set(urls)), key=lambda u: (not u.startswith("wss"), u[u.find("//") + 2] == "[", u)
    )


def startup_note(public: frozenset[RelayUrl], listen: frozenset[RelayUrl]) -> str | None:
    """What the operator reads once at start-up when no public URL is configured."""
    if public:
        return None
    return (
        "no public URL is configured: NIP-42 AUTH, NIP-62 and NIP-98 are accepted only for "
        + ", ".join(ordered(listen))
        + ". Clients that reach this relay by another name (a domain, behind a proxy that"
        " terminates TLS) must be named: --public-url wss://relay.example.com (repeatable;"
        " ENGRAM_PUBLIC_URLS, or public_urls in the config file)"
    )
