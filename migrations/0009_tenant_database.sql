-- 0009: a tenant's events may live on a database of their own.
--
-- NULL: this database, as before. Otherwise the PostgreSQL URL of the database holding the
-- tenant's rows (migrated like this one); the tenant configuration itself stays here.
ALTER TABLE tenants ADD COLUMN database_url text CHECK (database_url IS NULL OR database_url <> '');
