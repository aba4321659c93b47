-- 0027: a search the newest rows did not answer reads the newest window of the store first.
--
-- 0014's search_matches reads every match of the word (its GIN posting list) and keeps
-- the newest `limit`: the cost follows the word's matches, which for a word on 0.1-1 % of
-- the events grows with the store (5,000 rows at 1M, 50,000 at 10M: p99 17 ms at 1M).
-- search_newest first takes the created_at of the `p_window`-th newest row of the tenant
-- (one bounded read of events_time), and asks search_matches for matches at or after it:
-- the planner then ANDs the word's posting list with that range of events_time (a
-- BitmapAnd; search_matches prices every other plan out) and reads only the window's
-- matches. If the window holds `p_cap` of them they are the newest `p_cap` overall (every
-- row outside it is older than every row inside, ties included); if not, the word is
-- rare (fewer than about p_cap / p_window of the rows) and its whole posting list is small.
CREATE FUNCTION search_newest(p_tenant text, p_query text, p_kinds int4[], p_since int8,
                              p_until int8, p_private int4[], p_viewer bytea, p_now int8,
                              p_cap int4, p_window int4)
    RETURNS SETOF bytea LANGUAGE plpgsql STABLE
AS $$
DECLARE
    t int8;
    found bytea[];
BEGIN
    SELECT created_at INTO t FROM events WHERE tenant = p_tenant
        ORDER BY created_at DESC OFFSET p_window LIMIT 1;
    IF t IS NOT NULL AND (p_until IS NULL OR t <= p_until) AND (p_since IS NULL OR t > p_since)
    THEN
        found := ARRAY(SELECT search_matches(p_tenant, p_query, p_kinds, t, p_until, p_private,
                                             p_viewer, p_now, p_cap));
        IF cardinality(found) >= p_cap THEN
            RETURN QUERY SELECT unnest(found);
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT search_matches(p_tenant, p_query, p_kinds, p_since, p_until, p_private,
                                       p_viewer, p_now, p_cap);
END $$;
