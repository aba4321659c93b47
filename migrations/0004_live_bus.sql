-- 0004: live events across relay processes and machines sharing this database.
--
-- Each row records the transaction that wrote it (xid8). A node tails rows whose xid lies
-- in [last xmin, current xmin): every transaction below the current snapshot's xmin has
-- finished, so a batch that commits late is still read, never skipped (sequence numbers
-- handed out before commit could be). `origin` names the node that stored the row, which
-- already delivered it to its own subscribers.
ALTER TABLE events ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE events ADD COLUMN origin text;
CREATE INDEX events_xid ON events (xid);
