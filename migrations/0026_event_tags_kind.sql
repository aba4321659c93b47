-- 0026: a NIP-45 COUNT of a tag filter reads the tag's index entries only.
--
-- `{"kinds":[7],"#e":[<a note>]}` counted through `events`: every entry of the note in
-- event_tags cost a random heap fetch of its event, only to read the kind (p99 59-82 ms
-- at 1M events for a popular note, 1.4 ms at 10k). Each entry now carries its event's
-- `kind`, included in event_tags_time (not a key column: the newest-first range of a
-- (tenant, tag) that REQs read stays one range whatever the kinds), so relay.store.sql
-- counts such a filter with an index-only scan of the value's range, the kinds checked
-- on the index entry. The key columns are unchanged, so REQ plans are too. The 4 bytes
-- fit in the alignment padding of the index tuple and of the heap row (for tenant keys
-- up to 7 bytes, 'default' included): the table and its index keep their size.
--
-- Existing entries get their kind the way 0013 made them: emptied and refilled from
-- `events`, then the index is built with one sort (an UPDATE would leave a dead copy of
-- every entry behind and maintain the index row by row).
DROP INDEX event_tags_time;
TRUNCATE event_tags;
ALTER TABLE event_tags ADD COLUMN kind int4 NOT NULL;
-- An index-only scan reads the heap for pages not yet marked all-visible; event_tags is
-- mostly appended to, so vacuum it after 5% new rows (not the default 20%): the newest
-- entries, which counts read most, stay index-only.
ALTER TABLE event_tags SET (autovacuum_vacuum_insert_scale_factor = 0.05);

-- The insert and replace triggers of 0013, carrying the kind from the transition tables
-- (a column of the rows they already read: no extra call per row). The delete trigger
-- stays as it is: it finds entries by the four key columns, and a row's kind never
-- changes.
CREATE OR REPLACE FUNCTION event_tags_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO event_tags (tenant, tag, created_at, id, kind)
        SELECT n.tenant, tag_hash(v.key), n.created_at, n.id, n.kind
        FROM added n CROSS JOIN LATERAL unnest(n.tagvals) AS v(key);
    RETURN NULL;
END $$;

-- A replace keeps the address, kind included (the pairing below joins on it), so the new
-- version's entries take the kind of the new row, which is the old one's.
CREATE OR REPLACE FUNCTION event_tags_replaced() RETURNS trigger LANGUAGE plpgsql AS $$
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
    INSERT INTO event_tags (tenant, tag, created_at, id, kind)
        SELECT n.tenant, tag_hash(v.key), n.created_at, n.id, n.kind
        FROM added n JOIN removed o ON n.tenant = o.tenant AND n.pubkey = o.pubkey
            AND n.kind = o.kind AND n.d = o.d
        CROSS JOIN LATERAL unnest(n.tagvals) AS v(key)
        WHERE (n.id, n.created_at, n.tagvals) IS DISTINCT FROM (o.id, o.created_at, o.tagvals);
    RETURN NULL;
END $$;

INSERT INTO event_tags (tenant, tag, created_at, id, kind)
    SELECT e.tenant, tag_hash(v.key), e.created_at, e.id, e.kind
    FROM events e CROSS JOIN LATERAL unnest(e.tagvals) AS v(key);
CREATE INDEX event_tags_time ON event_tags (tenant, tag, created_at DESC, id) INCLUDE (kind);
