-- 0003: deletion (NIP-09), expiration (NIP-40) and full-text search (NIP-50).

-- NIP-40: the `expiration` tag as unix seconds; expired rows are never served and are
-- purged in the background.
ALTER TABLE events ADD COLUMN expires_at bigint;
CREATE INDEX events_expires ON events (expires_at) WHERE expires_at IS NOT NULL;

-- NIP-50: engram content is ciphertext and never searchable, so it is not indexed.
CREATE INDEX events_search ON events USING gin (to_tsvector('simple', content))
    WHERE kind <> 30174;

-- NIP-09: what authors deleted, so a deleted event cannot be published again. Only the
-- author's own events: the pubkey is part of every key.
CREATE TABLE deleted_events (
    tenant  text  NOT NULL,
    id      bytea NOT NULL,
    pubkey  bytea NOT NULL,
    PRIMARY KEY (tenant, id, pubkey)
);

-- `a` deletions: every version of the address up to `until` (the request's created_at).
CREATE TABLE deleted_addresses (
    tenant  text    NOT NULL,
    pubkey  bytea   NOT NULL,
    kind    integer NOT NULL,
    d       text    NOT NULL,
    until   bigint  NOT NULL,
    PRIMARY KEY (tenant, pubkey, kind, d)
);
