"""NIP-11 relay information document, per tenant, from the limits that are enforced.

Every field describes what the relay enforces: a limit that is off is omitted rather than
shown as 0 (`created_at_lower_limit: 0` would read as "nothing older than now").
"""

from __future__ import annotations

from typing import Any

import msgspec

from relay.config import Settings
from relay.tenants import Tenant

SUPPORTED_NIPS = [1, 9, 11, 13, 40, 42, 45, 50, 62, 70, 77, 86]
# NIP-11 asks for a URL identifying the software; engram-relay is not on PyPI and publishes
# no public URL, so the field names the distribution (what `pip show` and the relay's page
# name) rather than point at a package index page that does not exist.
SOFTWARE = "engram-relay"


def supported_nips(settings: Settings) -> list[int]:
    """The NIPs served with these settings: 77 only while negentropy sessions are allowed."""
    return [n for n in SUPPORTED_NIPS if n != 77 or settings.negentropy_max_sessions > 0]


def document(tenant: Tenant, version: str, nips: list[int] = SUPPORTED_NIPS) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": tenant.name,
        "description": tenant.description,
        "software": SOFTWARE,
        "version": version,
        "supported_nips": nips,
        "limitation": limitation(tenant),
    }
    for field in ("pubkey", "contact", "icon"):
        value = getattr(tenant, field)
        if value:
            doc[field] = value
    return doc


# limits where 0 means "not enforced" (NIP-11 has no value for "off")
_OFF_WHEN_ZERO = ("created_at_lower_limit",)
# per-tenant policy kept with the limits that NIP-11 does not define
_NOT_NIP11 = ("private_kinds",)


def limitation(tenant: Tenant) -> dict[str, Any]:
    lim = msgspec.to_builtins(tenant.limits)
    for name in _NOT_NIP11:
        lim.pop(name, None)
    for name in _OFF_WHEN_ZERO:
        if not lim.get(name):
            lim.pop(name, None)
    return lim
