-- 0028: who the relay is (issue 37), in the relay's database.
--
-- A tenant's public URLs: what NIP-42 AUTH, NIP-62 and NIP-98 must name to be taken for
-- it (relay.identity). Empty: its host names at the relay's public URLs' scheme and port.
-- Its AUTH challenge: sent when a connection opens, or with the first `auth-required:`
-- answer; NULL follows the relay's `auth_challenge` setting.
ALTER TABLE tenants
    ADD COLUMN public_urls text[] NOT NULL DEFAULT '{}',
    ADD COLUMN auth_challenge text CHECK (auth_challenge IN ('on-connect', 'when-needed'));

-- NIP-98 tokens already used (their event ids), until their window has passed: a token
-- is good for one management call, on whichever node of the relay it arrives.
CREATE TABLE nip98_used (
    id         text   PRIMARY KEY CHECK (id ~ '^[0-9a-f]{64}$'),
    expires_at bigint NOT NULL
);
CREATE INDEX nip98_used_expires ON nip98_used (expires_at);
