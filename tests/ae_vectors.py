"""The NIP-AE vectors (tests/vectors/nip-ae.vectors.json) as the tests use them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from engram.nip01 import Event

AE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "vectors" / "nip-ae.vectors.json").read_text()
)
SECKEY_A = bytes.fromhex(AE["inputs"]["seckey_a"])
SECKEY_O = bytes.fromhex(AE["inputs"]["seckey_o"])


def ae_events() -> list[Event]:
    """Events 1-4 of the vectors, in publication order."""
    return [msgspec.convert(e, Event, from_attributes=False, strict=False) for e in AE["events"]]
