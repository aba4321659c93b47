-- 0007: word statistics for NIP-50 search plans.
--
-- The full-text index is partial (engrams are never searchable), and PostgreSQL keeps no
-- statistics for the expression of a partial index: every search word looked equally
-- common to the planner. A REQ `{"search": ...}` then either walked the newest-first index
-- testing every row (28 s at 1M events for a word no event contains) or collected every
-- match of a very common word before sorting (20 s). With the expression's own statistics
-- the planner sees how common each word is and takes the index that fits (bench scale:
-- 0.5 to 30 ms for the same words).
CREATE STATISTICS events_search_words ON (to_tsvector('simple', content)) FROM events;
