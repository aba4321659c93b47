-- 0021: NIP-62 requests to vanish, on the database holding the tenant's events.
--
-- One row per (tenant, author): everything the author published up to `until` (the
-- latest request's created_at) is deleted, with the gift wraps (kind 1059) p-tagging
-- the author, and is refused if published again. The requests themselves stay stored.
CREATE TABLE vanished (
    tenant  text   NOT NULL,
    pubkey  bytea  NOT NULL,
    until   bigint NOT NULL,
    PRIMARY KEY (tenant, pubkey)
);
