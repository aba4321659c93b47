"""The exceptions of `engram mem` and its Python API: one class per CLI exit code.

Each carries a stable machine-readable `code` and the `exit_code` the CLI uses, so an
agent framework can branch on the class or the code and the CLI maps both in one place.
Messages name relays and slugs, never a secret key or decrypted content.
"""

from __future__ import annotations


class AgentMemoryError(Exception):
    """Base class; also "any other error" (exit code 4)."""

    code: str = "error"
    exit_code: int = 4


class BadInputError(AgentMemoryError, ValueError):
    """Bad input: an invalid slug, key, URL, patch or value (exit code 1)."""

    code = "bad_input"
    exit_code = 1


class NotFoundError(AgentMemoryError):
    """The slug has no live value: absent or removed (exit code 1)."""

    code = "not_found"
    exit_code = 1


class RelayError(AgentMemoryError):
    """No relay could be reached, answered in time, or accepted the request (exit code 2)."""

    code = "relay"
    exit_code = 2


class AuthError(AgentMemoryError):
    """NIP-42 authentication failed or the relay gated the request (exit code 3)."""

    code = "auth"
    exit_code = 3


class ConflictError(AgentMemoryError):
    """Another write got in the way, or the head is clock-poisoned (exit code 5)."""

    code = "conflict"
    exit_code = 5


class BaseChangedError(ConflictError):
    """The value changed since the caller read it (a `base_hash` that no longer matches):
    nothing was written (exit code 5)."""


class RefusedError(BadInputError):
    """A write the memory's rules refuse (exit code 1): a value a tombstone rejected or the
    owner denied, or an agent write over the owner's correction. `version_id` names the
    tombstone or verdict, `reason` is its reason; `overridable` says whether force helps."""

    code = "refused"

    def __init__(
        self, message: str, version_id: str, reason: str | None, overridable: bool
    ) -> None:
        super().__init__(message)
        self.version_id = version_id
        self.reason = reason
        self.overridable = overridable
