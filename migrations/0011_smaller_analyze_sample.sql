-- 0011: ANALYZE of `events` reads a 9,000-row sample instead of 30,000.
--
-- ANALYZE samples 300 rows per unit of the largest statistics target of the table, and
-- evaluates to_tsvector over every sampled row for the `events_search_words` statistics
-- object (0007): at the default target (100) 2.1-2.3 s of PostgreSQL CPU per run at
-- 160,000 events, a burst autovacuum brings into the live path after every growth of 10 %
-- (bench/RESULTS.md "Statistics off the ingest path"). At 30: 0.7 s, with the same search
-- plans (a common word walks `events_time`, a rare or absent one takes the GIN index) and
-- up to 300 most common tag values and words kept.
--
-- Columns that no query filters on keep no statistics at all: `content` is only searched
-- through the expression (its statistics live in the 0007 object), `sig`, `raw` and
-- `origin` are only ever returned.
ALTER TABLE events
    ALTER COLUMN tenant SET STATISTICS 30,
    ALTER COLUMN id SET STATISTICS 30,
    ALTER COLUMN pubkey SET STATISTICS 30,
    ALTER COLUMN created_at SET STATISTICS 30,
    ALTER COLUMN kind SET STATISTICS 30,
    ALTER COLUMN d SET STATISTICS 30,
    ALTER COLUMN owner SET STATISTICS 30,
    ALTER COLUMN tagvals SET STATISTICS 30,
    ALTER COLUMN expires_at SET STATISTICS 30,
    ALTER COLUMN xid SET STATISTICS 30,
    ALTER COLUMN content SET STATISTICS 0,
    ALTER COLUMN sig SET STATISTICS 0,
    ALTER COLUMN raw SET STATISTICS 0,
    ALTER COLUMN origin SET STATISTICS 0;
ALTER STATISTICS events_search_words SET STATISTICS 30;
