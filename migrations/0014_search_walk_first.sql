-- 0014: a NIP-50 search that the newest rows did not answer reads the word's posting list.
--
-- relay.store.sql tests the newest rows first (a common word fills the limit there); when
-- they hold too few matches the word is rare or absent, and its matches come from the GIN
-- index events_words. The planner must not be left to choose here: its estimate for a
-- word can be far off (a store where a few words are on every row makes every word look
-- common), and with a high estimate it walks the table newest-first instead (1.3 s for an
-- absent word at 1M events). This function runs its one query with sequential and plain
-- index scans priced out, so the only plan left is the bitmap scan of the posting list.
-- It applies the read gate and expiry itself and keeps the newest `p_cap` (a top-N sort),
-- so the caller reads only what it returns (a first version returned up to 50,000 ids for
-- the REQ to look up again: `search mid` at 1M, p99 67 ms -> 17 ms, bench/RESULTS.md).
CREATE FUNCTION search_matches(p_tenant text, p_query text, p_kinds int4[], p_since int8,
                               p_until int8, p_private int4[], p_viewer bytea, p_now int8,
                               p_cap int4)
    RETURNS SETOF bytea LANGUAGE sql STABLE
    SET enable_seqscan = off SET enable_indexscan = off SET enable_indexonlyscan = off
AS $$
    SELECT id FROM events
    WHERE tenant = p_tenant AND kind <> 30174
      AND coalesce(words, to_tsvector('simple', content))
          @@ websearch_to_tsquery('simple', p_query)
      AND (p_kinds IS NULL OR kind = ANY (p_kinds))
      AND (p_since IS NULL OR created_at >= p_since)
      AND (p_until IS NULL OR created_at <= p_until)
      AND (kind <> ALL (p_private) OR pubkey = p_viewer OR owner = p_viewer)
      AND (p_now IS NULL OR expires_at IS NULL OR expires_at > p_now)
    ORDER BY created_at DESC, id
    LIMIT p_cap
$$;
