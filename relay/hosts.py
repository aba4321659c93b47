"""Host names as tenants are keyed: from a URL, a Host header or a NIP-42 `relay` tag.

A leaf module: tenant binding (`relay.tenants`) and AUTH checks (`relay.policy`) both use
it, so policy may depend on tenants without tenants reaching back up into policy.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def host_of(url: str) -> str:
    """Lower-cased host name of a URL or Host header, port stripped."""
    if "//" not in url:
        url = "//" + url
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""
