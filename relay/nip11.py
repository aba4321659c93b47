"""NIP-11 relay information document, built from the settings that are enforced."""

from __future__ import annotations

from typing import Any

import msgspec

from relay.config import Settings

SUPPORTED_NIPS = [1, 11, 42]
SOFTWARE = "https://pypi.org/project/engram-relay/"


def document(settings: Settings, version: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": settings.relay_name,
        "description": settings.relay_description,
        "software": SOFTWARE,
        "version": version,
        "supported_nips": SUPPORTED_NIPS,
        "limitation": msgspec.to_builtins(settings.limits),
    }
    if settings.relay_pubkey:
        doc["pubkey"] = settings.relay_pubkey
    if settings.relay_contact:
        doc["contact"] = settings.relay_contact
    return doc
