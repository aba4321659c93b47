"""Who is speaking to which relay: keys and URL from flags and the environment.

Shared by `engram mem` and `engram acp`. The secret key is kept out of every repr and
every message: a traceback or an error line must never reveal it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from cli.nostr.errors import BadInputError
from engram.errors import KeyFormatError
from engram.nip01 import parse_public_key, parse_secret_key, pubkey_of
from engram.nip44 import conversation_key

DEFAULT_RELAY = "ws://127.0.0.1:7777"
ENV_KEY = "ENGRAM_PRIVATE_KEY"
ENV_OWNER = "ENGRAM_OWNER"
ENV_RELAY = "ENGRAM_RELAY"


# Bad input from the user (exit code 1); messages never carry a secret.
InputError = BadInputError


@dataclass(frozen=True)
class Identity:
    """The memory `(agent, owner)` and which of the two keys this process holds.

    `as_owner` means the held key is the owner's, reading the agent's memory (`--agent`).
    Both sides derive the same conversation key, so reading works from either end.
    """

    seckey: bytes = field(repr=False)
    agent: str
    owner: str
    as_owner: bool
    conversation_key: bytes = field(repr=False)

    @property
    def me(self) -> str:
        return self.owner if self.as_owner else self.agent

    @property
    def peer(self) -> str:
        return self.agent if self.as_owner else self.owner


def read_secret_key(key_file: Path | None, env: dict[str, str] | None = None) -> bytes:
    """`--key-file` wins over `ENGRAM_PRIVATE_KEY`; either holds 64-hex or an nsec."""
    env = os.environ if env is None else env
    if key_file is not None:
        try:
            text = key_file.read_text(encoding="utf-8")
        except OSError as exc:
            why = (exc.strerror or type(exc).__name__).lower()
            raise InputError(f"cannot read key file {key_file}: {why}") from exc
        except UnicodeDecodeError as exc:  # never echo its bytes: they may be a key
            raise InputError(f"key file {key_file} is not text (UTF-8)") from exc
        source = f"key file {key_file}"
    elif env.get(ENV_KEY):
        text, source = env[ENV_KEY], ENV_KEY
    else:
        raise InputError(f"no key: set {ENV_KEY} or pass --key-file PATH")
    try:
        return parse_secret_key(text)
    except KeyFormatError as exc:  # its message never echoes the key
        raise InputError(f"{source}: {exc}") from exc


def _public_key(value: str, what: str) -> str:
    try:
        return parse_public_key(value)
    except KeyFormatError as exc:
        raise InputError(f"{what}: {exc}") from exc


def load_identity(
    key_file: Path | None,
    owner: str | None,
    agent: str | None,
    env: dict[str, str] | None = None,
) -> Identity:
    """Resolve keys. With `agent` set the held key is the owner's (owner-side reads)."""
    env = os.environ if env is None else env
    seckey = read_secret_key(key_file, env)
    me = pubkey_of(seckey)
    if agent is not None:
        agent_pk = _public_key(agent, "--agent")
        if owner is not None and _public_key(owner, "--owner") != me:
            raise InputError("--owner must be the held key's own public key when --agent is set")
        owner_pk = me
    else:
        owner_value = owner if owner is not None else env.get(ENV_OWNER)
        if not owner_value:
            raise InputError(f"no owner: pass --owner or set {ENV_OWNER} (hex or npub)")
        agent_pk = me
        owner_pk = _public_key(owner_value, "owner")
    ck = conversation_key(seckey, owner_pk if agent is None else agent_pk)
    return Identity(seckey, agent_pk, owner_pk, agent is not None, ck)


def relay_url(value: str | None, env: dict[str, str] | None = None) -> str:
    """`--relay`, else `ENGRAM_RELAY`, else the local default; only ws:// and wss://."""
    env = os.environ if env is None else env
    url = value or env.get(ENV_RELAY) or DEFAULT_RELAY
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise InputError(f"relay URL must look like ws://host:port or wss://host: {url!r}")
    return url


def relay_urls(value: str | None, env: dict[str, str] | None = None) -> list[str]:
    """`--relay`, else `ENGRAM_RELAY`, else the local default: one URL or a comma-separated
    relay set, each ws:// or wss://."""
    from cli.nostr.relayset import parse_relays

    env = os.environ if env is None else env
    return parse_relays(value or env.get(ENV_RELAY) or DEFAULT_RELAY)
