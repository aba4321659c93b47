#!/bin/sh
# Lets the optional read replica (`docker compose --profile replica`) stream WAL from the
# primary: runs once, when the primary's data directory is first initialised. For a
# primary initialised before, run the same line by hand (see deploy/README.md).
echo "host replication ${POSTGRES_USER} all scram-sha-256" >> "$PGDATA/pg_hba.conf"
