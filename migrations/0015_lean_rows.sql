-- 0015: a stored event keeps one copy of itself.
--
-- `raw` is the event exactly as received and is all that REQ, export and the bus serve.
-- Rows also carried `sig` (64 bytes, read by nothing) and `content` (read only to parse
-- the search words, which 0012 stores in `words`): together ~270 bytes of every row, in
-- the table and again in the WAL. New rows store no `sig` and an empty `content`; rows
-- written before keep theirs (no rewrite), and a row whose `words` is NULL (written
-- before 0012) is still searched through its `content`.
ALTER TABLE events ALTER COLUMN sig DROP NOT NULL;
ALTER TABLE events DROP CONSTRAINT events_sig_len;
