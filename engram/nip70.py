"""NIP-70 protected events: an event carrying the `["-"]` tag may be published to a relay
only by its author, over a connection AUTHed (NIP-42) as that author.

Pure: this module says whether an event is protected; the relay's write policy
(`relay.policy.check_write`) decides what to answer.
"""

from __future__ import annotations

PROTECTED_TAG = "-"


def is_protected(tags: list[list[str]]) -> bool:
    """True if any tag is named `-` (NIP-70 gives it no value: `["-"]`)."""
    return any(t and t[0] == PROTECTED_TAG for t in tags)
