-- 0012: NIP-50 rechecks read stored words instead of parsing the content again.
--
-- A search for a common word walks `events_time` newest-first and tests each row until
-- the limit is filled (the plan 0007's statistics choose when the word is frequent). The
-- test was to_tsvector over the row's content, ~12 us a row: a word in 1 % of the notes
-- with limit 20 parsed ~2,000 notes, 21-24 ms at 1M events (bench scale), the same
-- parse the index had already done at insert. The insert now stores that parse in
-- `words` (computed once, as before: the index reads the column) and the test reads it.
--
-- Rows stored before this migration keep `words` NULL and are tested by parsing, as
-- before: the index and the queries use coalesce(words, to_tsvector('simple', content)),
-- so no table rewrite is needed here (building the new index parses every row once, as
-- building the old one did).
ALTER TABLE events ADD COLUMN words tsvector;
ALTER TABLE events ALTER COLUMN words SET STATISTICS 0;

CREATE INDEX events_words ON events
    USING gin (coalesce(words, to_tsvector('simple', content)))
    WHERE kind <> 30174;
-- As 0010 for the old index: the planner reads the statistics object below, not this.
ALTER INDEX events_words ALTER COLUMN 1 SET STATISTICS 0;
DROP INDEX events_search;

-- As 0007 and 0011, for the new expression: how common each word is.
DROP STATISTICS events_search_words;
CREATE STATISTICS events_words_frequency
    ON (coalesce(words, to_tsvector('simple', content))) FROM events;
ALTER STATISTICS events_words_frequency SET STATISTICS 30;
