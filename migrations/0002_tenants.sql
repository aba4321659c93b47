-- 0002_tenants: tenants bound by HTTP Host, their aliases, members and NIP-11 overrides.
--
-- An empty `tenants` table means single-tenant mode: one built-in tenant ('default')
-- serves every host. `events.tenant` holds the tenant's host (or 'default').

CREATE TABLE tenants (
    host          text PRIMARY KEY CHECK (host = lower(host) AND host <> ''),
    name          text,
    description   text,
    pubkey        text,
    contact       text,
    icon          text,
    write_policy  text    NOT NULL DEFAULT 'open' CHECK (write_policy IN ('open', 'members')),
    auth_required boolean NOT NULL DEFAULT false,
    -- NIP-11 `limitation` overrides, e.g. {"max_limit": 100}; keys are Limits fields.
    limits        jsonb   NOT NULL DEFAULT '{}'::jsonb,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE tenant_aliases (
    alias  text PRIMARY KEY CHECK (alias = lower(alias) AND alias <> ''),
    host   text NOT NULL REFERENCES tenants (host) ON DELETE CASCADE
);

CREATE TABLE tenant_members (
    host    text NOT NULL REFERENCES tenants (host) ON DELETE CASCADE,
    pubkey  text NOT NULL CHECK (pubkey ~ '^[0-9a-f]{64}$'),
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (host, pubkey)
);

-- Bumped by every change, so running relays reload with one cheap poll.
CREATE TABLE tenant_config_version (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   bigint  NOT NULL
);
INSERT INTO tenant_config_version VALUES (true, 0);

CREATE FUNCTION bump_tenant_config_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tenant_config_version SET version = version + 1;
    RETURN NULL;
END $$;

CREATE TRIGGER tenants_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION bump_tenant_config_version();
CREATE TRIGGER tenant_aliases_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON tenant_aliases FOR EACH STATEMENT EXECUTE FUNCTION bump_tenant_config_version();
CREATE TRIGGER tenant_members_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON tenant_members FOR EACH STATEMENT EXECUTE FUNCTION bump_tenant_config_version();
