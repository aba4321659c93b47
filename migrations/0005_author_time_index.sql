-- 0005: `{"authors":[…]}` without kinds (the commonest REQ) reads newest-first straight
-- from an index instead of gathering every kind of the author and sorting.
CREATE INDEX events_author_time ON events (tenant, pubkey, created_at DESC, id);
