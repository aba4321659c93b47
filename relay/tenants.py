"""Tenants: communities served by one relay, bound from the HTTP Host header.

Pure: configuration rows in, resolved `Tenant` objects out. The store loads the rows; the
app polls for changes, so `engram tenant …` takes effect on running relays within seconds.
With no tenant configured at all, one built-in tenant serves every host. It is the
relay's own settings, changed live by a row on its key, `default` (`engram tenant set
default …`), which is never a host: that row configures the built-in tenant and does
not make the relay one with tenants.
"""

from __future__ import annotations

from typing import Any

import msgspec

from engram.urls import RelayUrl
from relay.config import AUTH_CHALLENGES, Limits, Settings, parse_public_urls, private_set
from relay.hosts import host_key
from relay.moderation import NONE, Moderation

WRITE_POLICIES = ("open", "members")
DEFAULT_TENANT = "default"  # the built-in tenant's key (events.tenant); relay.store uses it


class TenantConfig(msgspec.Struct, kw_only=True):
    """One tenant as stored (and as `engram tenant show` prints it)."""

    host: str
    name: str | None = None
    description: str | None = None
    pubkey: str | None = None
    contact: str | None = None
    icon: str | None = None
    write_policy: str = "open"
    auth_required: bool = False
    limits: dict[str, Any] = msgspec.field(default_factory=dict)
    aliases: list[str] = msgspec.field(default_factory=list)
    members: list[str] = msgspec.field(default_factory=list)
    admins: list[str] = msgspec.field(default_factory=list)  # NIP-86 callers for this tenant
    database_url: str | None = None  # the tenant's own database (None: the relay's)
    # the URLs clients use for it (relay.identity); none: its hosts at the relay's
    public_urls: list[str] = msgspec.field(default_factory=list)
    auth_challenge: str | None = None  # on-connect | when-needed (None: the relay's setting)


class Tenant(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant as the relay uses it: merged limits, member set, the hosts it answers."""

    key: str  # the value of events.tenant
    hosts: frozenset[str]
    name: str
    description: str
    pubkey: str | None
    contact: str | None
    icon: str | None
    members_only: bool
    members: frozenset[str]
    limits: Limits
    # served only to their author and recipient (relay.policy): engrams, always, and the
    # tenant's private kinds (limits.private_kinds)
    private_kinds: frozenset[int]
    admins: frozenset[str] = frozenset()
    moderation: Moderation = NONE
    public_urls: frozenset[RelayUrl] = frozenset()  # its own (relay.identity.tenant_urls)
    auth_challenge: str = "when-needed"  # relay.config.AUTH_CHALLENGES

    def is_member(self, pubkey: str) -> bool:
        return pubkey in self.members


def merged_limits(base: Limits, overrides: dict[str, Any]) -> Limits:
    """Global limits with a tenant's overrides; unknown or mistyped keys raise ValueError."""
    data = msgspec.to_builtins(base)
    unknown = set(overrides) - set(data)
    if unknown:
        raise ValueError(f"unknown limit(s): {', '.join(sorted(unknown))}")
    data.update(overrides)
    if "default_limit" not in overrides:  # lowering max_limit alone lowers the default too
        data["default_limit"] = min(data["default_limit"], data["max_limit"])
    try:
        limits = msgspec.convert(data, Limits)
    except msgspec.ValidationError as exc:
        raise ValueError(f"invalid limit: {exc}") from exc
    if limits.default_limit > limits.max_limit:
        raise ValueError("default_limit must not exceed max_limit")
    return limits


def default_tenant(settings: Settings, cfg: TenantConfig | None = None) -> Tenant:
    """The built-in tenant: the relay's settings, under the overrides of its row `cfg`
    (`engram tenant set default …`). Its write policy and AUTH requirement are limits
    there (`restricted_writes`, `auth_required`), so a row that does not name them leaves
    the settings' own; a relay-wide `auth_required` binds it as every tenant."""
    own = cfg or TenantConfig(host=DEFAULT_TENANT)
    overrides = dict(own.limits)
    if settings.limits.auth_required:
        overrides["auth_required"] = True
    limits = merged_limits(settings.limits, overrides) if overrides else settings.limits
    return Tenant(
        key=DEFAULT_TENANT,
        hosts=frozenset(),
        name=own.name or settings.relay_name,
        description=own.description or settings.relay_description,
        pubkey=own.pubkey or settings.relay_pubkey,
        contact=own.contact or settings.relay_contact,
        icon=own.icon,
        members_only=limits.restricted_writes,
        members=frozenset(own.members),
        limits=limits,
        private_kinds=private_set(limits.private_kinds),
        admins=frozenset(own.admins),
        auth_challenge=own.auth_challenge or settings.auth_challenge,
    )


def check_identity(cfg: TenantConfig) -> frozenset[RelayUrl]:
    """The tenant's public URLs, parsed: each on one of its own hosts (the Host header
    routes a client to it), else ValueError; and its AUTH challenge setting."""
    urls = parse_public_urls(cfg.public_urls, f"tenant {cfg.host}: public URL")
    hosts = {cfg.host, *cfg.aliases}
    for url in urls:
        if url.host not in hosts:
            raise ValueError(
                f"tenant {cfg.host}: public URL {url} is not on one of its hosts"
                f" ({', '.join(sorted(hosts))}); add the host as an alias first"
            )
    if cfg.auth_challenge is not None and cfg.auth_challenge not in AUTH_CHALLENGES:
        raise ValueError(
            f"tenant {cfg.host}: auth_challenge must be one of {', '.join(AUTH_CHALLENGES)}"
        )
    return urls


def build_tenant(cfg: TenantConfig, settings: Settings) -> Tenant:
    overrides = dict(cfg.limits)
    overrides["auth_required"] = (
        cfg.auth_required
        or bool(overrides.get("auth_required"))
        or settings.limits.auth_required  # a relay-wide requirement binds every tenant
    )
    overrides["restricted_writes"] = cfg.write_policy == "members"
    limits = merged_limits(settings.limits, overrides)
    return Tenant(
        key=cfg.host,
        hosts=frozenset([cfg.host, *cfg.aliases]),
        name=cfg.name or cfg.host,
        description=cfg.description or settings.relay_description,
        pubkey=cfg.pubkey,
        contact=cfg.contact,
        icon=cfg.icon,
        members_only=cfg.write_policy == "members",
        members=frozenset(cfg.members),
        limits=limits,
        private_kinds=private_set(limits.private_kinds),
        admins=frozenset(cfg.admins),
        public_urls=check_identity(cfg),
        auth_challenge=cfg.auth_challenge or settings.auth_challenge,
    )


class TenantRegistry:
    """Host -> Tenant, swapped whole on every reload (readers never see a half state)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.default = default_tenant(settings)
        self.version = -1
        self._by_host: dict[str, Tenant] = {}

    def load(
        self,
        configs: list[TenantConfig],
        version: int,
        moderation: dict[str, Moderation] | None = None,
    ) -> None:
        """Swap in a configuration: tenants, and each tenant's moderation (by key)."""
        mods = moderation or {}
        by_host: dict[str, Tenant] = {}
        own: TenantConfig | None = None  # the built-in tenant's row, if any
        for cfg in configs:
            if cfg.host == DEFAULT_TENANT:
                own = cfg
                continue
            tenant = build_tenant(cfg, self.settings)
            if cfg.host in mods:
                tenant = msgspec.structs.replace(tenant, moderation=mods[cfg.host])
            for host in tenant.hosts:
                by_host[host] = tenant
        default = default_tenant(self.settings, own)
        if DEFAULT_TENANT in mods:
            default = msgspec.structs.replace(default, moderation=mods[DEFAULT_TENANT])
        self.default = default
        self._by_host = by_host
        self.version = version

    def by_key(self, key: str) -> Tenant:
        """The tenant whose events are stored under `key` (the default if none is)."""
        return self._by_host.get(key, self.default)

    def current(self, tenant: Tenant) -> Tenant:
        """The live version of a tenant a connection was bound to (itself if removed;
        the built-in tenant is never removed)."""
        if tenant.key == DEFAULT_TENANT:
            return self.default
        return self._by_host.get(tenant.key, tenant)

    def bans(self) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
        """(banned pubkeys, banned event ids) of every tenant that has any, by key."""
        tenants = [self.default, *self._by_host.values()]
        return {
            t.key: (t.moderation.banned_pubkeys, t.moderation.banned_events)
            for t in tenants
            if t.moderation.banned_pubkeys or t.moderation.banned_events
        }

    @property
    def multi(self) -> bool:
        return bool(self._by_host)

    def resolve(self, host_header: str) -> Tenant | None:
        """The tenant for a Host header; None means "unknown host" (answer 404)."""
        if not self._by_host:
            return self.default
        return self._by_host.get(host_key(host_header))
