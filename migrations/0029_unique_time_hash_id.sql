-- 0029: an event's uniqueness is checked in the time index; ids are found through a hash.
--
-- The primary key (tenant, id) was a B-tree on a random 32-byte key: every insert went to
-- a random leaf, so once the store is larger than what one checkpoint interval touches,
-- nearly every insert dirtied a leaf not yet written since the last checkpoint and wrote
-- a full 8 KB image of it to the WAL (wal_fpi). At 1M events (bench scale, realistic) its
-- 10,400 leaves took 11,300 full-page images (61 MB) per ~700 MB of WAL, and it was 90
-- bytes an event on disk; the WAL per event grew from 3.0 KB (first 100k rows) to 11 KB
-- (last 100k), and PostgreSQL's CPU per event with it.
--
-- An event's id is the sha256 of its serialisation, created_at included, so two rows
-- with one id have one created_at: (tenant, id) is unique exactly when (tenant,
-- created_at, id) is. That is events_time's key, whose inserts all land on its newest
-- pages (events arrive roughly in created_at order): made UNIQUE it checks the same rule
-- where the insert already goes, and `INSERT ... ON CONFLICT (tenant, created_at, id) DO
-- NOTHING` (relay.store.sqlwrite) is the duplicate test. Lookups by id (`ids` filters,
-- the join from event_tags, deletions) go through a hash index on `id`: 4-byte hash
-- codes instead of the whole key, about a third of the B-tree's size and pages.
--
-- The time index is rebuilt ascending, (tenant, created_at, id DESC), and read backward:
-- backward it yields `created_at DESC, id` (ties to the lower id), the order every read
-- asks for, and the newest entries of a tenant now sit at its range's right end. For the
-- last tenant in key order (the only one of a one-tenant store) that is the index's
-- rightmost page, which a B-tree splits leaving it 90 % full (fillfactor) and inserts
-- into without a descent; built descending, the newest entries were at the left end, and
-- its 50/50 splits left every page about half full (66 % leaf density at 1M events
-- against 90 % for the ascending build).
--
-- An index build on an existing store: one sort of `events` for the unique index (a
-- store holding two rows with one id and different created_at could not exist: the id
-- would not be the event's) and one pass for the hash index.
CREATE UNIQUE INDEX events_time_unique ON events (tenant, created_at, id DESC);
DROP INDEX events_time;
ALTER INDEX events_time_unique RENAME TO events_time;
ALTER TABLE events DROP CONSTRAINT events_pkey;
CREATE INDEX events_id ON events USING hash (id);
