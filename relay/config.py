"""Settings: every default of the relay in one place, layered file -> environment.

Pure data; reading a file or the environment happens only in `load_settings`.
Every number here that NIP-11 can advertise is the number the relay enforces.
"""

from __future__ import annotations

import os
import tomllib
from typing import Any

import msgspec

KIND_ENGRAM = 30174
KIND_AUTH = 22242
ENV_PREFIX = "ENGRAM_"


class Limits(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """NIP-11 `limitation` fields, enforced exactly as advertised."""

    max_message_length: int = 524_288
    max_subscriptions: int = 64
    max_filters: int = 16
    max_limit: int = 500
    default_limit: int = 100
    max_subid_length: int = 64
    max_event_tags: int = 2_000
    max_content_length: int = 131_072
    max_filter_values: int = 256  # ids/authors/kinds/tag values per filter
    created_at_lower_limit: int = 0  # seconds into the past; 0 = events of any age
    created_at_upper_limit: int = 900  # seconds into the future
    auth_required: bool = False
    restricted_writes: bool = False


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 7777
    database_url: str | None = None
    data_dir: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    relay_name: str = "engram-relay"
    relay_description: str = "Nostr relay for encrypted agent memory (NIP-AE engrams)"
    relay_pubkey: str | None = None
    relay_contact: str | None = None
    limits: Limits = msgspec.field(default_factory=Limits)
    tenant_refresh_seconds: float = 2.0  # how soon `engram tenant …` changes take effect
    auth_window_seconds: int = 600  # NIP-42: AUTH created_at within 10 minutes
    send_queue_max: int = 1_000  # frames buffered per connection before it is dropped
    send_queue_bytes: int = 4 * 1024 * 1024  # ... or bytes buffered, whichever comes first
    in_flight_max: int = 256  # frames handled concurrently per connection (then backpressure)
    write_batch_max: int = 500  # events per group-commit transaction
    db_pool_min: int = 2
    db_pool_max: int = 10
    log_level: str = "info"


class ConfigError(ValueError):
    """Invalid configuration; the message names the setting."""


def _coerce(value: str, current: Any, name: str) -> Any:
    if isinstance(current, bool):
        low = value.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{name}: expected a boolean, got {value!r}")
    if isinstance(current, int | float):
        kind = type(current)
        try:
            return kind(value)
        except ValueError as exc:
            raise ConfigError(f"{name}: expected a number, got {value!r}") from exc
    return value


def load_settings(
    config_file: str | None = None,
    env: dict[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Defaults, then the TOML file, then `ENGRAM_*` variables, then explicit overrides.

    Nested limit fields are read from env as `ENGRAM_LIMITS_MAX_LIMIT` etc.
    """
    env = dict(os.environ if env is None else env)
    data: dict[str, Any] = {}
    config_file = config_file or env.get(ENV_PREFIX + "CONFIG")
    if config_file:
        try:
            with open(config_file, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from exc
    base = msgspec.to_builtins(Settings())
    for field, default in base.items():
        if field == "limits":
            continue
        key = ENV_PREFIX + field.upper()
        if key in env:
            data[field] = _coerce(env[key], default, key)
    limits = dict(data.get("limits") or {})
    for field, default in base["limits"].items():
        key = f"{ENV_PREFIX}LIMITS_{field.upper()}"
        if key in env:
            limits[field] = _coerce(env[key], default, key)
    if limits:
        data["limits"] = limits
    for k, v in overrides.items():
        if v is not None:
            data[k] = v
    try:
        settings = msgspec.convert(data, Settings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid setting: {exc}") from exc
    lim = settings.limits
    if lim.default_limit > lim.max_limit:
        raise ConfigError("limits.default_limit must not exceed limits.max_limit")
    if settings.send_queue_max <= settings.in_flight_max:
        # a burst of OKs for every in-flight EVENT must fit, or a fast client looks slow
        raise ConfigError("send_queue_max must be larger than in_flight_max")
    return settings
