-- 0016: the posting-list read of a search (0014) returns only what the reader may see,
-- newest first, cut at the REQ's own limit.
--
-- 0014's search_newest returned up to 50,000 ids, which the REQ then looked up one by
-- one and sorted again to apply the private read gate and NIP-40 expiry: for a word in
-- 0.1-1 % of a million notes that was thousands of primary-key probes for 20 rows
-- (bench scale, "search mid" at 1M: p50 17.5 ms, p99 67 ms). Here the same bitmap scan
-- of the word's posting list applies the gate and expiry itself and keeps the newest
-- `p_cap` (a top-N sort), so the caller reads only what it returns.
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
