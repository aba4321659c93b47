"""Counts the REQ path keeps in plain dicts (relay.metrics `message`, `req_done`) are in
the registry whenever it is read: a scrape, a sample lookup, a worker's mirror."""

from __future__ import annotations

from relay import metrics, wire


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_messages_and_req_durations_are_counted_when_read() -> None:
    tenant = "t-pending"
    for _ in range(3):
        metrics.message(tenant, wire.CloseMsg("s"))
    metrics.message(tenant, None)
    assert sample("engram_messages_total", tenant=tenant, type="CLOSE") == 3
    assert sample("engram_messages_total", tenant=tenant, type="invalid") == 1
    started = metrics.start()
    metrics.req_done(tenant, started)
    metrics.req_done(tenant, started - 7.0)  # 7 s and more: the 10 s bucket
    metrics.req_done(tenant, started - 60.0)  # past the last bound: +Inf only
    count = sample("engram_req_duration_seconds_count", tenant=tenant)
    assert count == 3
    assert sample("engram_req_duration_seconds_bucket", tenant=tenant, le="+Inf") == 3
    assert sample("engram_req_duration_seconds_bucket", tenant=tenant, le="10.0") == 2
    assert sample("engram_req_duration_seconds_bucket", tenant=tenant, le="5.0") == 1
    assert sample("engram_req_duration_seconds_sum", tenant=tenant) >= 67.0
    # counted once: a second read adds nothing
    assert sample("engram_messages_total", tenant=tenant, type="CLOSE") == 3
    metrics.message(tenant, wire.CloseMsg("s"))
    text = metrics.render().decode()
    assert f'engram_messages_total{{tenant="{tenant}",type="CLOSE"}} 4.0' in text


def test_a_worker_mirror_adds_what_is_pending() -> None:
    """`engram serve --workers N`: the mirror task's pass writes the pending counts into
    the metrics (file-backed there) that another worker's scrape sums."""
    tenant = "t-mirror"
    metrics.message(tenant, wire.CloseMsg("s"))
    metrics.mirror_state()
    assert not metrics._pending_messages
    child = metrics._messages[(tenant, wire.CloseMsg)]
    assert child._value.get() == 1
