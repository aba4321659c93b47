"""The read batcher's SQL rewriting (pure); its behaviour against PostgreSQL is covered by
test_store_postgres.py::test_concurrent_reads_share_statements."""

from __future__ import annotations

from relay.store.readbatch import batchable, batched_sql


def test_only_scalar_parameters_are_batched() -> None:
    assert batchable("SELECT 1 WHERE a = $1 AND b = $2", ["t", b"x"])
    assert batchable("SELECT 1 WHERE a = $1 LIMIT $2", ["t", 10])
    assert not batchable("SELECT 1 WHERE a = ANY($1)", [[1, 2]])  # an array cannot be a column
    assert not batchable("SELECT 1 WHERE a = $1", [True])  # bool is not a batched type
    assert not batchable("... websearch_to_tsquery('simple', $2::text)", ["t", "w"])


def test_parameters_become_columns_of_one_unnest() -> None:
    sql = "SELECT raw FROM events WHERE tenant = $1 AND pubkey = $2::bytea LIMIT $10::int8"
    out = batched_sql(sql, (str, bytes, int, int, int, int, int, int, int, int))
    assert out.startswith("SELECT b.i, s.* FROM unnest($1::int4[], $2::text[], $3::bytea[],")
    assert "$11::int8[]) AS b(i, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10)" in out
    # $1 and $10 are distinct parameters: $10 must not be read as $1 followed by "0"
    assert "tenant = b.p1 AND pubkey = b.p2::bytea LIMIT b.p10::int8" in out
    assert out.endswith(") s")
