-- 0025: `owner` is the recipient of every event, not of engrams only.
--
-- The private read gate (relay.policy, relay.store.sql) serves engrams and each tenant's
-- private kinds (limits.private_kinds; by default 4, 1059 and 1060: direct messages and
-- gift wraps) only to their author or recipient, comparing the viewer with `owner`: the
-- first `p` tag when it is a public key (engram.readers.recipient). Rows stored from now
-- on carry it whatever their kind; this fills it in for the default private kinds stored
-- before, so their recipients can read them after the upgrade. `tagvals` lists tags in
-- event order, so its first `p:` element is the first `p` tag with a value (a 64-hex
-- value is never hashed); any other first `p` leaves `owner` NULL, as relay.store.sql
-- does. Rows of kinds made private later that predate this migration stay readable by
-- their author only.
UPDATE events SET owner = (
    SELECT CASE WHEN v ~ '^p:[0-9a-f]{64}$' THEN decode(substr(v, 3), 'hex') END
    FROM unnest(tagvals) WITH ORDINALITY AS t(v, n)
    WHERE v LIKE 'p:%'
    ORDER BY n
    LIMIT 1
)
WHERE kind IN (4, 1059, 1060) AND owner IS NULL;
