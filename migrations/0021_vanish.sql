-- 0021: NIP-62 requests to vanish, on the database holding the tenant's events.
--
-- One row per (tenant, author): everything the author published up to `until` (the
-- latest request's created_at) is deleted, with the gift wraps (kind 1059) p-tagging
-- the author, and is refused if published again. The requests themselves stay stored.
-- `ptag` is the author as an element of `events.tagvals` ('p:' || hex), indexed so an
-- incoming gift wrap is checked with one probe per `p` tag, however many have vanished.
CREATE TABLE vanished (
    tenant  text   NOT NULL,
    pubkey  bytea  NOT NULL,
    until   bigint NOT NULL,
    ptag    text   GENERATED ALWAYS AS ('p:' || encode(pubkey, 'hex')) STORED,
    PRIMARY KEY (tenant, pubkey)
);
CREATE INDEX vanished_ptag ON vanished (tenant, ptag);
