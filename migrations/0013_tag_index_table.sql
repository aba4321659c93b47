-- 0013: tag filters read an index ordered by time within each tag value.
--
-- `#e`/`#p`/`#t` filters were served by the GIN index on `tagvals`, which knows which
-- rows carry a value but not in what order: with a LIMIT the planner either read every
-- match and sorted (cost: the value's popularity) or walked `events_time` newest-first
-- hoping to meet matches soon, and which one it took followed its estimate. On a skewed
-- store (one value on every row) every other value looks common, and a REQ for an absent
-- value walked the whole table (1.3 s at 1M events). Here each (tenant, tag value) owns a
-- range of `event_tags_time`, newest first: a REQ with a limit reads about `limit`
-- entries of each value it names, and an absent value costs one index probe, whatever
-- the statistics say (the design strfry and nostr-rs-relay keep).
--
-- The value is stored as `tag_hash(key)`: 8 bytes instead of a 66-byte `e:<hex>` key, so
-- the table and its index stay small; every read rechecks `tagvals` on the event row, so a
-- hash collision costs a row read, never a wrong answer. Rows follow `events` through
-- statement-level triggers (one set-based statement per batch, whatever path wrote:
-- group commit, replace, NIP-09, expiry, import, purge, COPY), so nothing else has to
-- remember them.
-- STABLE (convert_to is) and not STRICT, so that PostgreSQL inlines it: as an IMMUTABLE
-- or STRICT function every tag of every stored event cost a nested SQL-function call
-- (auto_explain: 3,000 of them for a batch of 500 replaces). The value is the same.
CREATE FUNCTION tag_hash(key text) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN ('x' || encode(substr(sha256(convert_to(key, 'UTF8')), 1, 8), 'hex'))::bit(64)::bigint;

CREATE TABLE event_tags (
    tenant      text   NOT NULL,
    tag         bigint NOT NULL,
    created_at  bigint NOT NULL,
    id          bytea  NOT NULL
);
ALTER TABLE event_tags SET (autovacuum_vacuum_scale_factor = 0.05,
                            autovacuum_analyze_scale_factor = 0.05);

CREATE FUNCTION event_tags_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_tags (tenant, tag, created_at, id)
        SELECT n.tenant, tag_hash(v.key), n.created_at, n.id
        FROM added n CROSS JOIN LATERAL unnest(n.tagvals) AS v(key);
    RETURN NULL;
END $$;

CREATE FUNCTION event_tags_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- the keys first (materialized), so that each old entry is one probe of all four
    -- index columns
    WITH k AS MATERIALIZED (SELECT o.tenant, tag_hash(v.key) AS tag, o.created_at, o.id
                            FROM removed o CROSS JOIN LATERAL unnest(o.tagvals) AS v(key))
    DELETE FROM event_tags x USING k
        WHERE x.tenant = k.tenant AND x.tag = k.tag
          AND x.created_at = k.created_at AND x.id = k.id;
    RETURN NULL;
END $$;

-- A replace (ON CONFLICT DO UPDATE) is a removal of the old version and an addition of
-- the new one; an update that changes neither the row's tags nor its identity is neither.
-- Old and new versions pair on their address with plain equality (only rows with a `d`
-- are ever updated): `IS NOT DISTINCT FROM` cannot be hashed or merged, and a batch of
-- replaces of one agent's engrams compared every old row with every new one
-- (249,500 comparisons for 500 rows; PostgreSQL ~400 us per engram in `bench pgindex`).
CREATE FUNCTION event_tags_replaced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH k AS MATERIALIZED (
        SELECT o.tenant, tag_hash(v.key) AS tag, o.created_at, o.id
        FROM removed o JOIN added n ON n.tenant = o.tenant AND n.pubkey = o.pubkey
            AND n.kind = o.kind AND n.d = o.d
        CROSS JOIN LATERAL unnest(o.tagvals) AS v(key)
        WHERE (n.id, n.created_at, n.tagvals) IS DISTINCT FROM (o.id, o.created_at, o.tagvals))
    DELETE FROM event_tags x USING k
        WHERE x.tenant = k.tenant AND x.tag = k.tag
          AND x.created_at = k.created_at AND x.id = k.id;
    INSERT INTO event_tags (tenant, tag, created_at, id)
        SELECT n.tenant, tag_hash(v.key), n.created_at, n.id
        FROM added n JOIN removed o ON n.tenant = o.tenant AND n.pubkey = o.pubkey
            AND n.kind = o.kind AND n.d = o.d
        CROSS JOIN LATERAL unnest(n.tagvals) AS v(key)
        WHERE (n.id, n.created_at, n.tagvals) IS DISTINCT FROM (o.id, o.created_at, o.tagvals);
    RETURN NULL;
END $$;

-- Existing rows first, then the index (one sort instead of a million inserts).
INSERT INTO event_tags (tenant, tag, created_at, id)
    SELECT e.tenant, tag_hash(v.key), e.created_at, e.id
    FROM events e CROSS JOIN LATERAL unnest(e.tagvals) AS v(key);
CREATE INDEX event_tags_time ON event_tags (tenant, tag, created_at DESC, id);

CREATE TRIGGER event_tags_insert AFTER INSERT ON events
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION event_tags_added();
CREATE TRIGGER event_tags_delete AFTER DELETE ON events
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION event_tags_removed();
CREATE TRIGGER event_tags_update AFTER UPDATE ON events
    REFERENCING OLD TABLE AS removed NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION event_tags_replaced();

CREATE FUNCTION event_tags_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE event_tags;
    RETURN NULL;
END $$;
CREATE TRIGGER event_tags_truncate AFTER TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION event_tags_truncated();

-- The GIN index is no longer read by any plan (tag conditions go through event_tags, and
-- `tagvals` is only rechecked on rows already found).
DROP INDEX events_tagvals;

-- Overlapping author indexes: (tenant, pubkey, created_at) serves `authors` feeds in time
-- order; `authors` + `kinds` walks it and checks the kind (replaceable and addressable
-- kinds go through the unique address index). One btree fewer on every insert.
DROP INDEX events_author_kind_time;
