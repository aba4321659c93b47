"""Host names of relay URLs, as NIP-42, NIP-62 and NIP-98 compare them (pure)."""

from __future__ import annotations

from urllib.parse import urlsplit


def host_of(url: str) -> str:
    """Lower-cased host name of a URL or Host header, port stripped ('' if none)."""
    if "//" not in url:
        url = "//" + url
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""
