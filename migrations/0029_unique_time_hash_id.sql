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
-- codes instead of the whole key. At 1M events it is 37 MB against the key's 82 MB, and
-- took 3,500 full-page images (11 MB) per ~600 MB of WAL against 11,300 (61 MB). The
-- rest of the WAL's growth is other pages touched at random (event_tags_time, the
-- author index, heap and TOAST pages of replaced versions, hint bits, index vacuums).
--
-- The key keeps events_time's order, newest first. Built ascending and read backward it
-- was measured no better: events arrive up to minutes out of created_at order, so the
-- inserts land on the last few pages rather than the rightmost one, and its leaves were
-- 66 % full at 1M events either way (pgstatindex).
--
-- An index build on an existing store: one sort of `events` for the unique index (a
-- store holding two rows with one id and different created_at could not exist: the id
-- would not be the event's) and one pass for the hash index.
CREATE UNIQUE INDEX events_time_unique ON events (tenant, created_at DESC, id);
DROP INDEX events_time;
ALTER INDEX events_time_unique RENAME TO events_time;
ALTER TABLE events DROP CONSTRAINT events_pkey;
CREATE INDEX events_id ON events USING hash (id);
