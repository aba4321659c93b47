-- 0020: moderation (NIP-86 relay management and `engram tenant`), in the relay's database.
--
-- One home for both: the management API and the CLI read and write these tables. Each
-- is keyed by the tenant key (`tenants.host`, or 'default' for the built-in tenant of a
-- relay without tenants), so there is no foreign key; `engram tenant rm` clears them.
-- Every change bumps `tenant_config_version`, so running relays reload them within
-- `tenant_refresh_seconds`, exactly like the tenant configuration itself.

-- Who may call the management API for one tenant (operators in settings: every tenant).
CREATE TABLE tenant_admins (
    host     text NOT NULL REFERENCES tenants (host) ON DELETE CASCADE,
    pubkey   text NOT NULL CHECK (pubkey ~ '^[0-9a-f]{64}$'),
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (host, pubkey)
);

-- Banned authors: their events are deleted and new ones refused `blocked:`.
CREATE TABLE banned_pubkeys (
    tenant   text NOT NULL,
    pubkey   text NOT NULL CHECK (pubkey ~ '^[0-9a-f]{64}$'),
    reason   text NOT NULL DEFAULT '',
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, pubkey)
);

-- Moderated events: banned (deleted, refused if sent again) or allowed (off the queue
-- of reported events; a later ban replaces it, and an allow lifts a ban).
CREATE TABLE moderated_events (
    tenant   text    NOT NULL,
    id       text    NOT NULL CHECK (id ~ '^[0-9a-f]{64}$'),
    banned   boolean NOT NULL,
    reason   text    NOT NULL DEFAULT '',
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id)
);

-- Kinds: once any kind is allowed, only allowed kinds are accepted; a disallowed kind is
-- refused whatever else is allowed.
CREATE TABLE moderated_kinds (
    tenant  text    NOT NULL,
    kind    integer NOT NULL CHECK (kind >= 0),
    allowed boolean NOT NULL,
    PRIMARY KEY (tenant, kind)
);

-- Blocked client addresses: a websocket upgrade from one is refused.
CREATE TABLE blocked_ips (
    tenant   text NOT NULL,
    ip       inet NOT NULL,
    reason   text NOT NULL DEFAULT '',
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, ip)
);

CREATE TRIGGER tenant_admins_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON tenant_admins FOR EACH STATEMENT EXECUTE FUNCTION bump_tenant_config_version();
CREATE TRIGGER banned_pubkeys_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON banned_pubkeys FOR EACH STATEMENT EXECUTE FUNCTION bump_tenant_config_version();
CREATE TRIGGER moderated_events_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON moderated_events FOR EACH STATEMENT EXECUTE FUNCTION bump_tenant_config_version();
CREATE TRIGGER moderated_kinds_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON moderated_kinds FOR EACH STATEMENT EXECUTE FUNCTION bump_tenant_config_version();
CREATE TRIGGER blocked_ips_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON blocked_ips FOR EACH STATEMENT EXECUTE FUNCTION bump_tenant_config_version();
