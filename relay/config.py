"""Settings: every default of the relay in one place, layered file -> environment.

Pure data; reading a file or the environment happens only in `load_settings`.
Every number here that NIP-11 can advertise is the number the relay enforces.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import types
import typing
from typing import Any

import msgspec

from engram import KIND_ENGRAM as KIND_ENGRAM  # re-exported: relay code imports it here
from engram import MEMORY_KINDS as MEMORY_KINDS  # engrams and their history (engram.versions)
from engram.errors import KeyFormatError
from engram.negentropy import ITEM_BYTES
from engram.nip01 import parse_public_key
from engram.nip42 import KIND_AUTH as KIND_AUTH  # re-exported, as KIND_ENGRAM
from engram.urls import RelayUrl, parse_relay_url
from relay.durations import parse_duration
from relay.ratelimit import RateLimits

PRIVATE_KINDS = (4, 1059, 1060)  # Limits.private_kinds by default


def private_set(kinds: typing.Iterable[int]) -> frozenset[int]:
    """The kinds served only to their parties, given Limits.private_kinds: engrams and
    their history (revisions, owner verdicts) are always among them (spec "Relay-side
    rules: Reads"; docs/NIP-AE-HISTORY.md)."""
    return frozenset((*MEMORY_KINDS, *kinds))


DEFAULT_PRIVATE = private_set(PRIVATE_KINDS)  # a tenant's, unless configured
ENV_PREFIX = "ENGRAM_"


def parse_public_urls(urls: typing.Iterable[str], setting: str) -> frozenset[RelayUrl]:
    """Configured public URLs (`public_urls`, a tenant's `--public-url`), normalized;
    ValueError naming `setting` for one that is not a ws:// or wss:// URL with a host (and
    nothing after its path). Here, below relay.identity and relay.tenants, which use
    them: settings are checked without importing the modules that read them."""
    out = set()
    for raw in urls:
        parsed = parse_relay_url(raw)
        scheme = raw.strip().split(":", 1)[0].lower()
        if parsed is None or scheme not in ("ws", "wss") or any(c in raw for c in "?#"):
            raise ValueError(
                f"{setting}: {raw!r} is not a relay URL (ws://HOST[:PORT][/PATH] or"
                " wss://HOST[:PORT][/PATH])"
            )
        out.add(parsed)
    return frozenset(out)


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
    # ... and of all the filters of one REQ or COUNT together: each value is an index
    # range PostgreSQL reads (up to `limit` rows each), so this bounds one REQ's work
    max_req_values: int = 1_024
    # NIP-50: a query's characters and words (`\w+` runs); every live search is matched
    # against every published event that shares one of its words (relay.fanout)
    max_search_length: int = 256
    max_search_words: int = 32
    created_at_lower_limit: int = 0  # seconds into the past; 0 = events of any age
    created_at_upper_limit: int = 900  # seconds into the future
    auth_required: bool = False
    restricted_writes: bool = False
    min_pow_difficulty: int = 0  # NIP-13: leading zero bits an event id must have
    # Served only to a connection AUTHed as the author or the recipient (first `p`), like
    # engrams: NIP-04 direct messages and gift wraps (README "Private kinds"). Not a
    # NIP-11 field: relay.nip11 leaves it out of `limitation`.
    private_kinds: list[int] = msgspec.field(default_factory=lambda: list(PRIVATE_KINDS))

    def __post_init__(self) -> None:
        if any(not 0 <= k <= 65535 for k in self.private_kinds):
            raise ValueError("private_kinds must be kinds between 0 and 65535")


class Retention(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`[retention]`: prune old events in the background (relay.retention); off by default."""

    older_than: str = ""  # e.g. "90d"; empty = retention off
    kinds: list[int] | None = None  # only these kinds (default: every regular kind)
    include_replaceable: bool = False  # also replaceable/addressable heads (engrams 30174)
    interval: str = "1h"  # time between passes
    batch: int = 5_000  # rows per DELETE transaction

    def __post_init__(self) -> None:
        if self.older_than:  # ValueError here becomes a ConfigError naming the setting
            parse_duration(self.older_than)
            parse_duration(self.interval)
            if self.batch < 1:
                raise ValueError("retention.batch must be at least 1")


AUTH_CHALLENGES = ("on-connect", "when-needed")


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 7777
    # The URLs clients use for this relay (ws:// or wss://; env: comma-separated): NIP-42
    # AUTH, NIP-62 and NIP-98 must name one of them (relay.identity). None: only the URL
    # it listens on (ws://127.0.0.1:PORT, ws://localhost:PORT, the bind address). Behind
    # a proxy, or under a domain name, set it: wss://relay.example.com
    public_urls: list[str] = msgspec.field(default_factory=list)
    # NIP-42: send the AUTH challenge when a connection opens, or with the first
    # `auth-required:` answer (clients that do not speak NIP-42 then write public events
    # undisturbed); per tenant: `engram tenant set HOST --auth-challenge …`
    auth_challenge: str = "when-needed"
    # Who may read /metrics (every tenant's host names and traffic): addresses, networks
    # (CIDR) or host names of the scrapers; env: comma-separated. Loopback by default.
    metrics_allow: list[str] = msgspec.field(default_factory=lambda: ["127.0.0.0/8", "::1"])
    database_url: str | None = None
    data_dir: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    relay_name: str = "engram-relay"
    relay_description: str = "Nostr relay for encrypted agent memory (NIP-AE engrams)"
    relay_pubkey: str | None = None
    relay_contact: str | None = None
    # NIP-86: pubkeys (hex or npub) that may manage every tenant through the management
    # API (each tenant's own admins: `engram tenant admin add`); env: comma-separated
    operators: list[str] = msgspec.field(default_factory=list)
    limits: Limits = msgspec.field(default_factory=Limits)
    rate: RateLimits = msgspec.field(default_factory=RateLimits)
    retention: Retention = msgspec.field(default_factory=Retention)
    tenant_refresh_seconds: float = 2.0  # how soon `engram tenant …` changes take effect
    auth_window_seconds: int = 600  # NIP-42: AUTH created_at within 10 minutes
    # Slow consumers (relay.sendqueue; docs/OPERATING.md "Operating it" gives the reasoning):
    slow_consumer_seconds: float = 10.0  # drop a reader whose queue has not shrunk this long
    send_queue_bytes: int = 32 * 1024 * 1024  # hard cap of one connection's queued output
    send_queue_budget_bytes: int = 256 * 1024 * 1024  # all connections of one process
    in_flight_max: int = 256  # frames handled concurrently per connection (then backpressure)
    write_batch_max: int = 500  # events per group-commit transaction
    write_concurrency: int = 3  # group-commit transactions in flight at once
    # NIP-50: kinds whose content is copied into the full-text index (None: every kind
    # but engrams, whose content is ciphertext). Indexing costs PostgreSQL ~40 us of CPU
    # per kind-1 note (to_tsvector, stored in `words`, and the GIN entries; `bench
    # pgindex`); other kinds store an empty copy.
    search_kinds: list[int] | None = None
    # The search index's pending list (GIN fastupdate) is merged into the index by a
    # statement of the writer's own once this many bytes of searched content were stored
    # since the last merge (relay.store.pgwriter), off the OK path: left to PostgreSQL, the
    # insert that grows the list past gin_pending_list_limit (4 MB) merges it in its batch,
    # which waited 0.6-1.3 s (issue 47, sustained profile); the store's sessions raise that
    # limit to 16 MB instead. A list holds ~4 bytes per byte of content, so 1 MiB merges
    # about as often as PostgreSQL alone: smaller merges cost more per entry (every 2,000
    # notes: +30 % PostgreSQL CPU and +90 % WAL per EVENT; no list: +150 %). 0 (default):
    # PostgreSQL's. Off by default: measured alone (bench ab, sustained profile, 4 rounds),
    # 1 MiB cut the ingest p99 by a third (528 -> 358 ms) but cost 12 % more PostgreSQL CPU
    # per EVENT (198 -> 222 us: the merge chases the list's tail while inserts append) and
    # 4 % of the throughput; an operator who wants the latency sets 1048576.
    search_clean_bytes: int = 0
    # BIP-340 checks in a worker process beside the relay (relay.verifyproc), so the event
    # loop and the check use two cores; off: `verify_threads` threads beside the loop, or
    # inline when that is 0 (docs/OPERATING.md "Ingest tuning").
    verify_process: bool = True
    verify_threads: int = 0
    # RFC 7692 compression, offered to clients that ask. Off: Nostr frames are small JSON,
    # deflating each costs CPU on both ends, and uncompressed connections take the
    # relay's direct receive path (relay.wsserver).
    ws_per_message_deflate: bool = False
    ping_interval_seconds: float = 30.0  # websocket ping of every connection...
    ping_timeout_seconds: float = 20.0  # ...closed when the pong is this late (dead peer)
    query_timeout_seconds: float = 10.0  # statement timeout of every REQ/COUNT query
    read_concurrency: int = 4  # REQ/COUNT statements in flight at once (relay.store.readbatch)
    read_batch_max: int = 32  # concurrent REQs of one shape run as one statement, at most
    # REQs for authors' newest events answered from memory (relay/store/readcache.py):
    # at most this many bytes for the whole process (0: off), each author's rows read
    # again after this many seconds (what no event announces: pruned rows)
    read_cache_bytes: int = 64 * 1024 * 1024
    read_cache_seconds: float = 60.0
    # REQ filter texts remembered with what was worked out of them (relay/reqmemo.py), so
    # a REQ whose filters repeat one seen before (an agent polling its memory, readers of
    # one author) skips parsing them again: at most this many, and each at most
    # REQ_MEMO_TEXT_MAX characters (0: off)
    req_memo_entries: int = 4096
    # Store reads (REQ/COUNT) in flight per connection and per IP (relay.readgate): a
    # client sending costly REQs back to back waits for its own, not everyone else.
    reads_per_connection: int = 4
    reads_per_ip: int = 32
    # Live NIP-50 subscriptions of the whole process (every tenant); past it a search REQ
    # is refused `rate-limited: …` (per address: RateLimits.search_subscriptions_per_ip)
    search_subscriptions_max: int = 10_000
    # Rows one REQ may read per tag value or per searched word's matches (scan budget),
    # the newest rows a search tests before it reads the word's index entries, and the
    # newest rows whose index entries it reads before all of them (migration 0027).
    scan_max: int = 50_000
    search_walk: int = 1_000
    search_window: int = 20_000
    gc_threshold0: int = 20_000  # young-generation GC threshold, start-up frozen (0: off)
    expired_purge_seconds: float = 60.0  # NIP-40: how often expired events are purged
    bus_poll_seconds: float = 1.0  # cross-node tail read without a wake-up (fallback)
    # Read replicas (relay/store/replicas.py): REQ/COUNT read from streaming replicas.
    replica_urls: list[str] = msgspec.field(default_factory=list)  # env: comma-separated
    replica_max_lag_seconds: float = 10.0  # a replica further behind leaves the rotation
    replica_check_seconds: float = 1.0  # health and lag check of every replica
    replica_wait_seconds: float = 0.25  # read-your-writes: wait this long, then the primary
    db_pool_min: int = 2
    db_pool_max: int = 10
    log_level: str = "info"  # debug | info | warning | error | critical
    log_format: str = "text"  # text (human-readable) | json (one JSON object per line)
    # NIP-77 negentropy: items one NEG-OPEN may reconcile (past it: NEG-ERR "blocked: …",
    # ~40 bytes of relay memory per item), sessions open per connection, idle seconds
    negentropy_max_items: int = 500_000
    negentropy_max_sessions: int = 4
    negentropy_idle_seconds: float = 60.0
    negentropy_read_concurrency: int = 2  # NEG-OPEN set reads at once, off the REQ slots
    # the sets of every connection together (relay.negentropy); past it a NEG-OPEN is
    # answered NEG-ERR "blocked: …"
    negentropy_budget_bytes: int = 256 * 1024 * 1024
    # ...and the share of one client address (its connections together; 0: no share):
    # three sessions of negentropy_max_items at once, so one address cannot take the
    # whole budget. Loopback is exempt as from the rate limits (rate.exempt_loopback).
    negentropy_budget_per_ip_bytes: int = 64 * 1024 * 1024


class ConfigError(ValueError):
    """Invalid configuration; the message names the setting."""


def _coerce(value: str, tp: Any, name: str) -> Any:
    """An environment variable's text as its setting's declared type `tp` (a list is
    comma-separated, e.g. ENGRAM_REPLICA_URLS; a None-able setting as its type, so
    ENGRAM_SEARCH_KINDS, unset by default, is read as a list of kinds too)."""
    args = [a for a in (typing.get_args(tp) if _is_union(tp) else (tp,)) if a is not type(None)]
    if len(args) == 1:
        tp = args[0]
    if typing.get_origin(tp) is list:
        items = [v.strip() for v in value.split(",") if v.strip()]
        if typing.get_args(tp) == (int,):  # a list of kinds
            try:
                return [int(v) for v in items]
            except ValueError as exc:
                raise ConfigError(f"{name}: expected integers, got {value!r}") from exc
        return items
    if tp is bool:
        low = value.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{name}: expected a boolean, got {value!r}")
    if tp in (int, float):
        try:
            return tp(value)
        except ValueError as exc:
            raise ConfigError(f"{name}: expected {_TYPE_NAMES[tp]}, got {value!r}") from exc
    return value


_TYPE_NAMES: dict[Any, str] = {
    int: "an integer",
    float: "a number",
    bool: "a boolean (true/false)",
    str: "a string",
    list: "a list",
    dict: "a table",
}
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")


def _describe(tp: Any) -> str:
    """'an integer', 'a string', ... for a field's type (None-able types as the type)."""
    args = [a for a in (typing.get_args(tp) if _is_union(tp) else (tp,)) if a is not type(None)]
    names = []
    for a in args:
        name = _TYPE_NAMES.get(typing.get_origin(a) or a, f"a {getattr(a, '__name__', a)}")
        item = typing.get_args(a)
        if name == "a list" and len(item) == 1:  # list[int]: "a list of integers"
            name += " of " + _TYPE_NAMES.get(item[0], "a value").split(" ", 1)[1] + "s"
        names.append(name)
    return " or ".join(dict.fromkeys(names))


def _is_union(tp: Any) -> bool:
    return isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union


def _is_table(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _check_table(data: dict[str, Any], struct: type, prefix: str, source: str) -> None:
    """Every key of a TOML table is a known setting of the right type, or ConfigError."""
    fields = {f.name: f.type for f in msgspec.structs.fields(struct)}
    for key, value in data.items():
        name = prefix + key
        if key not in fields:
            raise ConfigError(f"unknown setting {name!r} in {source}")
        tp = fields[key]
        if _is_table(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"{name}: expected a table [{name}], got {value!r} in {source}")
            _check_table(value, tp, name + ".", source)
            continue
        try:
            msgspec.convert(value, tp)
        except msgspec.ValidationError as exc:
            raise ConfigError(
                f"{name}: expected {_describe(tp)}, got {value!r} in {source}"
            ) from exc


def _explain(exc: msgspec.ValidationError) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.limits.max_limit`", naming the setting."""
    text = str(exc)
    what, sep, where = text.rpartition(" - at `$")
    if not sep:
        return f"invalid setting: {text}"
    where = where.rstrip("`").lstrip(".")
    if what.startswith("Object contains unknown field `"):
        key = what.split("`")[1]
        return f"unknown setting {(where + '.' if where else '') + key!r}"
    return f"{where or 'settings'}: {what[:1].lower()}{what[1:]}"


def _check_values(settings: Settings) -> None:
    """Ranges and choices, each error naming its setting."""
    if settings.log_level.lower() not in LOG_LEVELS:
        raise ConfigError(
            f"log_level: expected one of {', '.join(LOG_LEVELS)}, got {settings.log_level!r}"
        )
    if settings.log_format not in LOG_FORMATS:
        raise ConfigError(
            f"log_format: expected one of {', '.join(LOG_FORMATS)}, got {settings.log_format!r}"
        )
    for pk in settings.operators:
        try:
            parse_public_key(pk)
        except KeyFormatError as exc:
            raise ConfigError(f"operators: {exc}") from exc
    if not 0 <= settings.port <= 65535:
        raise ConfigError(f"port: expected 0-65535, got {settings.port}")
    if settings.auth_challenge not in AUTH_CHALLENGES:
        raise ConfigError(
            f"auth_challenge: expected one of {', '.join(AUTH_CHALLENGES)},"
            f" got {settings.auth_challenge!r}"
        )
    from relay.allowlist import parse_allowlist

    try:
        parse_public_urls(settings.public_urls, "public_urls")
        parse_allowlist(settings.metrics_allow, "metrics_allow")
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    _check_negentropy_budget(settings)
    tables: list[tuple[str, msgspec.Struct]] = [("", settings)]
    while tables:
        prefix, table = tables.pop()
        for f in msgspec.structs.fields(table):
            value = getattr(table, f.name)
            if isinstance(value, msgspec.Struct):
                tables.append((f"{prefix}{f.name}.", value))
            elif isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ConfigError(f"{prefix}{f.name}: must not be negative, got {value}")
    for name in (
        "write_batch_max",
        "db_pool_max",
        "in_flight_max",
        "send_queue_bytes",
        "send_queue_budget_bytes",
    ):
        if getattr(settings, name) < 1:
            raise ConfigError(f"{name}: must be at least 1, got {getattr(settings, name)}")


def _check_negentropy_budget(settings: Settings) -> None:
    """A NEG-OPEN reserves room for its whole set before reading it: a budget below one
    such reservation would refuse every NEG-OPEN, silently turning NIP-77 off."""
    if settings.negentropy_max_sessions < 1:
        return  # NIP-77 is off anyway (and not advertised)
    reserve = (settings.negentropy_max_items + 1) * ITEM_BYTES
    budgets = [("negentropy_budget_bytes", settings.negentropy_budget_bytes, "every")]
    if settings.negentropy_budget_per_ip_bytes:  # 0: no per-address share
        share = settings.negentropy_budget_per_ip_bytes
        budgets.append(("negentropy_budget_per_ip_bytes", share, "a limited address's"))
    for name, budget, whose in budgets:
        if budget < reserve:
            raise ConfigError(
                f"{name} ({budget}) is below what one NEG-OPEN reserves"
                f" ((negentropy_max_items + 1) x {ITEM_BYTES} = {reserve} bytes), so {whose}"
                f" NEG-OPEN would be refused: raise {name}, lower negentropy_max_items, or"
                " set negentropy_max_sessions = 0 to turn NIP-77 off"
            )


# `ENGRAM_*` variables that other parts of the project read, not relay settings: the
# client's identity and relays (cli.nostr.identity), the MCP server's token, the ACP
# proxy's switch, recall's model, the review page's screenshots (tests); and the bench's
# and the tests' own (prefixes). `unknown_variables` does not report them.
OTHER_VARIABLES = frozenset(
    ENV_PREFIX + name
    for name in (
        "PRIVATE_KEY",
        "OWNER",
        "RELAY",
        "MCP_TOKEN",
        "ACP_NO_MEMORY",
        "RECALL_MODEL",
        "REVIEW_SCREENSHOTS",
    )
)
OTHER_PREFIXES = (ENV_PREFIX + "BENCH_", ENV_PREFIX + "TEST_")


def _variable(field: str, sub: str | None = None) -> str:
    """The variable of a setting: ENGRAM_<FIELD>, or ENGRAM_<TABLE>_<FIELD> in a table."""
    return ENV_PREFIX + (f"{field}_{sub}" if sub else field).upper()


def setting_variables() -> frozenset[str]:
    """Every `ENGRAM_*` variable `load_settings` reads."""
    names = {_variable("config")}
    for f in msgspec.structs.fields(Settings):
        if _is_table(f.type):
            names.update(_variable(f.name, sub.name) for sub in msgspec.structs.fields(f.type))
        else:
            names.add(_variable(f.name))
    return frozenset(names)


def unknown_variables(env: typing.Mapping[str, str]) -> list[str]:
    """One warning for each `ENGRAM_*` variable in `env` that is no setting (a misspelt
    one is otherwise silently ignored), naming the likely intended one when one is close."""
    known = setting_variables()
    out = []
    for name in sorted(env):
        if (
            not name.startswith(ENV_PREFIX)
            or name in known
            or name in OTHER_VARIABLES
            or name.startswith(OTHER_PREFIXES)
        ):
            continue
        close = difflib.get_close_matches(name, sorted(known | OTHER_VARIABLES), n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]}?" if close else " (engram config show lists them)"
        out.append(f"environment variable {name} is not a setting and is ignored{hint}")
    return out


def load_settings(
    config_file: str | None = None,
    env: dict[str, str] | None = None,
    **overrides: Any,
) -> Settings:
    """Defaults, then the TOML file, then `ENGRAM_*` variables, then explicit overrides.

    Nested tables are read from env as `ENGRAM_<TABLE>_<FIELD>`, e.g.
    `ENGRAM_LIMITS_MAX_LIMIT` or `ENGRAM_RATE_EVENTS_PER_SECOND`.
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
        _check_table(data, Settings, "", config_file)
    for f in msgspec.structs.fields(Settings):
        if _is_table(f.type):  # a nested table: ENGRAM_<TABLE>_<FIELD>
            table = dict(data.get(f.name) or {})
            for sub in msgspec.structs.fields(f.type):
                key = _variable(f.name, sub.name)
                if key in env:
                    table[sub.name] = _coerce(env[key], sub.type, key)
            if table:
                data[f.name] = table
            continue
        key = _variable(f.name)
        if key in env:
            data[f.name] = _coerce(env[key], f.type, key)
    for k, v in overrides.items():
        if v is not None:
            data[k] = v
    try:
        settings = msgspec.convert(data, Settings)
    except msgspec.ValidationError as exc:
        raise ConfigError(_explain(exc)) from exc
    _check_values(settings)
    lim = settings.limits
    if lim.default_limit > lim.max_limit:
        if "default_limit" in (data.get("limits") or {}):
            raise ConfigError("limits.default_limit must not exceed limits.max_limit")
        # lowering max_limit alone lowers the default with it
        settings.limits = msgspec.structs.replace(lim, default_limit=lim.max_limit)
    if settings.slow_consumer_seconds <= 0:
        raise ConfigError("slow_consumer_seconds: must be positive")
    return settings
