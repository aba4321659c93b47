"""The bearer token that guards `engram mcp --http`.

Whoever calls the HTTP server's tools uses the memory with the key it holds, so the port
asks for a token even on loopback: another local account (or a process of another user
in a shared container) must not read or write the agent's memory. The token is given
(`--token`, `ENGRAM_MCP_TOKEN`) or kept in the user's config directory, readable by its
owner only (made at the first start and printed once; delete the file for a new one).

Checked by the `mcp` SDK's own bearer middleware (`TokenVerifier`): a request without the
token, or with another, is answered 401 before any MCP message is read.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import stat
from pathlib import Path

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

from cli.nostr.identity import InputError

TOKEN_FILE = "mcp-token"
MIN_LENGTH = 16
# RFC 6750 b64token: what an Authorization header carries without quoting
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def config_dir(env: dict[str, str] | None = None) -> Path:
    """`$XDG_CONFIG_HOME/engram`, else `~/.config/engram`."""
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "engram"


def check_token(token: str, where: str) -> str:
    """`token` if a client can send it as a bearer token and it is long enough to guess."""
    if len(token) < MIN_LENGTH or not _TOKEN.fullmatch(token):
        raise InputError(
            f"{where}: a bearer token is at least {MIN_LENGTH} characters of letters, digits"
            " and - . _ ~ + / (e.g. from `openssl rand -hex 32`)"
        )
    return token


def stored_token(path: Path) -> tuple[str, bool]:
    """(the token kept in `path`, True if it was made now). A new one is written with mode
    0600 (its directory 0700); an existing file others may read, or that another user
    owns, is refused rather than trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another `engram mcp` made it meanwhile: use that one
            return stored_token(path)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
        return token, True
    except OSError as exc:
        raise InputError(f"cannot read the MCP token file {path}: {exc.strerror}") from None
    with os.fdopen(fd) as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path} is not a regular file")
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise InputError(
                f"{path} may be read by other users (mode {stat.S_IMODE(info.st_mode):04o});"
                " `chmod 600` it, or delete it for a new token"
            )
        token = fh.read().strip()
    return check_token(token, str(path)), False


class StaticToken:
    """`TokenVerifier` for one shared secret, compared in constant time."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token="", client_id="engram-mcp", scopes=[])
        return None


def auth_settings(base_url: str) -> AuthSettings:
    """The SDK's settings for a server that checks bearer tokens itself: no authorization
    server and no protected-resource metadata (there is nothing to discover: the token
    is configured, not obtained), so a refused request is a plain 401."""
    return AuthSettings(issuer_url=base_url, resource_server_url=None)  # type: ignore[arg-type]
