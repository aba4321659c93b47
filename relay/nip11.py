"""NIP-11 relay information document, per tenant, from the limits that are enforced."""

from __future__ import annotations

from typing import Any

import msgspec

from relay.tenants import Tenant

SUPPORTED_NIPS = [1, 9, 11, 13, 40, 42, 45, 50, 77]
SOFTWARE = "https://pypi.org/project/engram-relay/"


def document(tenant: Tenant, version: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": tenant.name,
        "description": tenant.description,
        "software": SOFTWARE,
        "version": version,
        "supported_nips": SUPPORTED_NIPS,
        "limitation": msgspec.to_builtins(tenant.limits),
    }
    for field in ("pubkey", "contact", "icon"):
        value = getattr(tenant, field)
        if value:
            doc[field] = value
    return doc
