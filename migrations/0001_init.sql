-- 0001_init: the events table, its replace keys and the indexes of the common filters.
--
-- Forward-only; relay.store.migrate runs this file in one transaction and records it in
-- schema_migrations. Columns are derived by relay.store.sql (the only place that knows
-- how a tag value becomes an index key); `raw` is the exact event JSON as received and
-- the only column ever served back.

CREATE TABLE events (
    tenant      text    NOT NULL,
    id          bytea   NOT NULL,
    pubkey      bytea   NOT NULL,
    created_at  bigint  NOT NULL,
    kind        integer NOT NULL,
    -- NULL: regular event. '' for replaceable kinds (0, 3, 10000-19999); for addressable
    -- kinds (30000-39999) the first `d` tag value, or '' (values longer than 200 bytes,
    -- or holding NUL, as '\x01' || sha256 hex, like tagvals).
    d           text,
    -- Kind 30174 (NIP-AE engram): its first `p` tag, the owner who may read it.
    owner       bytea,
    -- `name:value` of every tag whose name is one character, values encoded as `d` is.
    tagvals     text[]  NOT NULL DEFAULT '{}',
    -- Copy of the content for search, NUL characters removed (Postgres text rejects NUL).
    content     text    NOT NULL,
    sig         bytea   NOT NULL,
    -- The event JSON exactly as received. bytea, not text or jsonb: served byte for byte,
    -- and a `\u0000` escape (which jsonb rejects) is no problem.
    raw         bytea   NOT NULL,
    CONSTRAINT events_pkey PRIMARY KEY (tenant, id),
    CONSTRAINT events_id_len CHECK (octet_length(id) = 32),
    CONSTRAINT events_pubkey_len CHECK (octet_length(pubkey) = 32),
    CONSTRAINT events_sig_len CHECK (octet_length(sig) = 64),
    -- Ephemeral kinds (20000-29999) are never stored.
    CONSTRAINT events_kind_stored CHECK (kind >= 0 AND (kind < 20000 OR kind >= 30000)),
    CONSTRAINT events_d_iff_replaceable CHECK (
        (d IS NOT NULL) = (kind IN (0, 3) OR kind BETWEEN 10000 AND 19999
                           OR kind BETWEEN 30000 AND 39999)
    )
);

-- One head per address: the replace rule is an INSERT ... ON CONFLICT against this index.
CREATE UNIQUE INDEX events_address ON events (tenant, pubkey, kind, d) WHERE d IS NOT NULL;

-- Filter shapes. Each ends in (created_at DESC, id) so `ORDER BY created_at DESC, id
-- LIMIT n` reads the first n index entries without a sort.
CREATE INDEX events_author_kind_time ON events (tenant, pubkey, kind, created_at DESC, id);
CREATE INDEX events_kind_time ON events (tenant, kind, created_at DESC, id);
CREATE INDEX events_time ON events (tenant, created_at DESC, id);
CREATE INDEX events_tagvals ON events USING gin (tagvals);
