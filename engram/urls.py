"""Relay URLs as NIP-42, NIP-62 and NIP-98 compare them (pure).

A relay is known by the URL clients use for it: whether it is secure (wss/https), its
host, its port (the scheme's default when none is written) and its path. Two spellings of
one URL compare equal (`wss://Relay.example:443/` and `wss://relay.example`; `https` is
`wss` seen from HTTP, as NIP-98 and NIP-86 use it); a different scheme, host, port or path
is another relay.
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple
from urllib.parse import urlsplit

_SECURE = {"wss": True, "https": True, "ws": False, "http": False}
_DEFAULT_PORT = {True: 443, False: 80}


class RelayUrl(NamedTuple):
    """A relay URL, normalized: compare with `==` (or `in` a set of them)."""

    secure: bool
    host: str  # lower case; an IPv6 address without brackets, in its shortest form
    port: int
    path: str  # without trailing slashes: "" for the root

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if self.port == _DEFAULT_PORT[self.secure] else f":{self.port}"
        return f"{'wss' if self.secure else 'ws'}://{host}{port}{self.path}"

    def with_host(self, host: str) -> RelayUrl:
        """The same scheme, port and path on another host name."""
        return self._replace(host=normalize_host(host))


def normalize_host(host: str) -> str:
    """Lower case, without the trailing dot of an absolute name; IP addresses in their
    canonical form (so `[0:0::1]` is `::1`)."""
    host = host.strip().lower().removesuffix(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def parse_relay_url(url: str) -> RelayUrl | None:
    """The URL normalized, or None when it is not an absolute ws/wss/http/https URL with
    a host (credentials in it, a bad port, a query-only oddity: not a relay's URL)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    secure = _SECURE.get(parts.scheme.lower())
    host = parts.hostname
    if secure is None or not host or "@" in parts.netloc:
        return None
    return RelayUrl(
        secure,
        normalize_host(host),
        _DEFAULT_PORT[secure] if port is None else port,
        parts.path.rstrip("/"),
    )


def host_of(url: str) -> str:
    """The host name of a URL or a bare host name as `normalize_host` writes it, port
    stripped ('' if none). For configuration (tenant host names); a request's Host header
    is parsed by `relay.hosts.parse_host`, which refuses what is not a Host, and keyed by
    `relay.hosts.host_key` through the same `normalize_host`."""
    if "//" not in url:
        url = "//" + url
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return ""
    return normalize_host(host) if host else ""
