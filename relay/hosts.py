"""The HTTP Host header, parsed as RFC 9110 defines it (7.2: `uri-host [ ":" port ]`).

Tenants are routed by the host it names. Anything that is not a Host is refused (the app
answers 400) rather than guessed at: a URL parser would take `a.test@b.test` for `b.test`
and `a.test:abc` for `a.test`. A leaf module (tenant binding and the app both use it).
"""

from __future__ import annotations

import ipaddress
import re

from engram.urls import host_of as host_of  # configuration: tenant host names
from engram.urls import normalize_host

# RFC 3986 reg-name: *( unreserved / pct-encoded / sub-delims )
_REG_NAME = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*")
_IPV_FUTURE = re.compile(r"[vV][0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+")
_PORT = re.compile(r"[0-9]{0,5}")


def parse_host(value: str) -> tuple[str, int | None] | None:
    """(host, port) of a Host header value, or None when it is not one.

    The host is lower-cased; an IP-literal comes without its brackets, an IPv6 address in
    its canonical form. The port is None when absent (or empty, which the grammar allows).
    """
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        literal, rest = value[1:end], value[end + 1 :]
        try:
            host = str(ipaddress.IPv6Address(literal))
        except ValueError:
            if not _IPV_FUTURE.fullmatch(literal):
                return None
            host = literal.lower()
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else ""
    else:
        host, colon, port_text = value.partition(":")
        if not _REG_NAME.fullmatch(host) or (colon and not _PORT.fullmatch(port_text)):
            return None
        host = host.lower()
    if not _PORT.fullmatch(port_text):
        return None
    port = int(port_text) if port_text else None
    if port is not None and port > 65535:
        return None
    return host, port


def host_key(value: str) -> str:
    """The host a Host header names, as tenants are keyed ('' when it names none): by
    `normalize_host`, as configured host names are (`host_of`)."""
    parsed = parse_host(value)
    return normalize_host(parsed[0]) if parsed else ""
