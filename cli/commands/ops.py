"""Operator commands: `engram config show` and `engram keygen`."""

from __future__ import annotations

import json
import os
import re
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import typer

from cli.commands.common import ConfigOpt, settings_or_exit

config_app = typer.Typer(help="Relay configuration.", no_args_is_help=True)

MASK = "***"
# A setting is secret when a part of its name says so (`relay_pubkey` is not: public; nor
# `private_kinds`, a list of kinds: "private" alone names no secret, a private key has
# "key" in its name).
_SECRET_PARTS = frozenset(
    {"key", "secret", "password", "passwd", "token", "seckey", "nsec", "credentials"}
)
_MASKED_NOTE = "  # masked: put the secret back to use this line"
_PATHS = frozenset({"tls_key"})  # names a PEM file: the path is shown, never the file
_DSN_PASSWORD = re.compile(r"(?i)([?&]password=)[^&]*")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of TOML.")]


def is_secret(name: str) -> bool:
    return name not in _PATHS and bool(_SECRET_PARTS.intersection(name.lower().split("_")))


def mask_url(value: str) -> str:
    """A URL with its password (userinfo or `?password=`) replaced by ***."""
    masked = _DSN_PASSWORD.sub(lambda m: m.group(1) + MASK, value)
    try:
        parts = urlsplit(masked)
        password = parts.password
    except ValueError:
        return masked
    if not password:
        return masked
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))


def masked(data: dict[str, Any]) -> dict[str, Any]:
    """Settings as plain data, secrets replaced by ***; nested tables alike."""
    out: dict[str, Any] = {}
    for name, value in data.items():
        if isinstance(value, dict):
            out[name] = masked(value)
        elif value not in (None, "") and is_secret(name):
            out[name] = MASK
        elif isinstance(value, str) and ("://" in value or name.endswith("_url")):
            out[name] = mask_url(value)
        elif isinstance(value, list) and name.endswith("_urls"):  # replica_urls
            out[name] = [mask_url(v) if isinstance(v, str) else v for v in value]
        else:
            out[name] = value
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)  # strings and lists: valid TOML as well


def _toml_line(name: str, value: Any) -> str:
    if value is None:
        return f"# {name} = (unset)"
    text = _toml_value(value)
    return f"{name} = {text}" + (_MASKED_NOTE if MASK in text else "")


def to_toml(data: dict[str, Any]) -> str:
    """TOML text of the settings, which `--config` reads back as they are (a masked
    secret is marked so on its line); unset (None) values appear as comments."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for name, value in data.items():
        if isinstance(value, dict):
            tables.append((name, value))
        else:
            lines.append(_toml_line(name, value))
    for table, values in tables:
        lines.append("")
        lines.append(f"[{table}]")
        lines.extend(_toml_line(name, value) for name, value in values.items())
    return "\n".join(lines) + "\n"


@config_app.command("show")
def config_show(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Print the effective configuration (defaults < TOML file < ENGRAM_* env), secrets masked."""
    settings = settings_or_exit(config_file=config)
    data = masked(msgspec.to_builtins(settings))
    if as_json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        typer.echo(to_toml(data), nl=False)


def new_secret_key() -> bytes:
    """32 random bytes that are a valid secp256k1 secret key."""
    from coincurve import PrivateKey

    while True:
        seckey = os.urandom(32)
        try:
            PrivateKey(seckey)
        except ValueError:  # zero or >= the group order: practically never
            continue
        return seckey


def keygen(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON instead of aligned name and value lines.")
    ] = False,
) -> None:
    """Print a new key pair (nsec/npub and hex). The only command that prints a secret key."""
    from engram.nip01 import pubkey_of
    from engram.nip19 import npub, nsec

    seckey = new_secret_key()
    public = pubkey_of(seckey)
    keys = {
        "nsec": nsec(seckey),
        "npub": npub(public),
        "secret_hex": seckey.hex(),
        "public_hex": public,
    }
    if as_json:
        typer.echo(json.dumps(keys, indent=2))
    else:
        width = max(map(len, keys))
        for name, value in keys.items():
            typer.echo(f"{name.ljust(width)}  {value}")
    typer.echo("engram: keep the nsec / secret hex private: it is the identity.", err=True)
