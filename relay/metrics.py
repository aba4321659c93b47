"""Prometheus metrics: one dedicated registry, cheap updates on the hot path.

Every helper here is a dict lookup of a cached labelled child plus an increment; label
values are built once per (tenant, kind of result). Gauges that mirror state the relay
already holds (live subscriptions, database pool) are read when `/metrics` is scraped,
never maintained per event.

Metric names (all prefixed `engram_`):
  connections{tenant}                   open websocket connections
  connections_accepted_total{tenant}    websocket connections accepted
  messages_total{tenant,type}           client messages: EVENT, REQ, CLOSE, AUTH, COUNT, invalid
  events_total{tenant,result,reason}    EVENTs received, by result stored|ephemeral|duplicate|
                                        rejected and the OK message's prefix (invalid, ...)
  req_duration_seconds{tenant}          REQ received -> EOSE (its _count: REQs answered)
  live_events_total{tenant}             live event frames fanned out to subscriptions
  slow_consumers_total                  connections dropped for not reading fast enough
  slow_consumer_drops_total{reason}     ... by reason: stalled | cap | budget
  dropped_frames_total                  frames discarded with those connections
  pending_overflows_total               subscriptions closed: live events overflowed the
                                        buffer kept while their stored read ran
  send_queue_bytes                      output queued for readers now (all connections)
  send_queue_bytes_peak                 the most ever queued at once (all connections)
  send_queue_connection_bytes_peak      the most one connection ever had queued
  send_queue_budget_bytes               the budget for all connections together
  negentropy_bytes                      NIP-77 sets held (or reserved while read) now
  negentropy_bytes_peak                 the most ever held at once
  negentropy_budget_bytes               the budget for all negentropy sessions together
  negentropy_refused_total              NEG-OPENs refused because the budget was reached
  live_tail_delay_seconds               how far the cross-node live tail lags (0: current)
  write_batch_size                      events per group-commit transaction
  write_commit_seconds                  time to write (and commit) one batch
  db_pool_connections{state}            database pool: in_use, idle, max
  subscriptions{tenant}                 live subscriptions
  build_info{version}                   always 1
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
import weakref
from bisect import bisect_left
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

from engram.kinds import is_ephemeral
from relay import wire

if TYPE_CHECKING:
    from collections.abc import Iterator


disable_created_metrics()  # no `*_created` series: they double the output for nothing


class _Flush:
    """Registered before every other metric: a collection of the registry (a scrape,
    `get_sample_value`) first adds the counts still pending (`flush`)."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        flush()
        return iter(())


REGISTRY = CollectorRegistry(auto_describe=True)
REGISTRY.register(_Flush())  # type: ignore[arg-type]  # first: see `flush`
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the text format `render` writes
ProcessCollector(registry=REGISTRY)

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

CONNECTIONS = Gauge(
    "engram_connections",
    "Open websocket connections.",
    ["tenant"],
    registry=REGISTRY,
    multiprocess_mode="livesum",  # `engram serve --workers N`: the sum of the live workers
)
CONNECTIONS_TOTAL = Counter(
    "engram_connections_accepted_total",
    "Websocket connections accepted.",
    ["tenant"],
    registry=REGISTRY,
)
MESSAGES = Counter(
    "engram_messages_total", "Client messages by type.", ["tenant", "type"], registry=REGISTRY
)
EVENTS = Counter(
    "engram_events_total",
    "EVENTs received, by result and the OK message's machine-readable prefix.",
    ["tenant", "result", "reason"],
    registry=REGISTRY,
)
REQ_SECONDS = Histogram(
    "engram_req_duration_seconds",
    "Time from a REQ to its EOSE (stored events read and queued).",
    ["tenant"],
    buckets=_LATENCY,
    registry=REGISTRY,
)
READS_CLOSED = Counter(
    "engram_reads_closed_total",
    "REQs and COUNTs ended with CLOSED by the store: `budget` (the statement ran past"
    " query_timeout_seconds) or `unavailable` (the database failed).",
    ["tenant", "reason"],
    registry=REGISTRY,
)
LIVE_EVENTS = Counter(
    "engram_live_events_total",
    "Live event frames fanned out to subscriptions.",
    ["tenant"],
    registry=REGISTRY,
)
SLOW_CONSUMERS = Counter(
    "engram_slow_consumers_total",
    "Connections disconnected as slow consumers (stalled, or over a queued-output bound).",
    registry=REGISTRY,
)
SLOW_CONSUMER_DROPS = Counter(
    "engram_slow_consumer_drops_total",
    "Slow consumers disconnected, by reason: stalled (queue did not shrink for"
    " slow_consumer_seconds), cap (send_queue_bytes), budget (send_queue_budget_bytes).",
    ["reason"],
    registry=REGISTRY,
)
_DROPS = {r: SLOW_CONSUMER_DROPS.labels(r) for r in ("stalled", "cap", "budget")}
PENDING_OVERFLOWS = Counter(
    "engram_pending_overflows_total",
    "Subscriptions closed because live events overflowed the buffer kept while their"
    " stored read ran.",
    registry=REGISTRY,
)
NEGENTROPY_REFUSED = Counter(
    "engram_negentropy_refused_total",
    "NEG-OPENs refused because the negentropy sets held reached negentropy_budget_bytes.",
    registry=REGISTRY,
)
DROPPED_FRAMES = Counter(
    "engram_dropped_frames_total",
    "Queued frames discarded when a slow consumer was disconnected.",
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "engram_write_batch_size",
    "Events per group-commit write transaction.",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
    registry=REGISTRY,
)
COMMIT_SECONDS = Histogram(
    "engram_write_commit_seconds",
    "Time to write and commit one batch of events.",
    buckets=_LATENCY,
    registry=REGISTRY,
)

_VERBS = {
    wire.EventMsg: "EVENT",
    wire.ReqMsg: "REQ",
    wire.CloseMsg: "CLOSE",
    wire.AuthMsg: "AUTH",
    wire.CountMsg: "COUNT",
    type(None): "invalid",
}
_REASONS = frozenset(r.value for r in wire.Reason)

_messages: dict[tuple[str, type], Any] = {}
_events: dict[tuple[str, bool, bool, str], Any] = {}
_connections: dict[str, tuple[Any, Any]] = {}
_req: dict[str, Any] = {}
_live: dict[str, Any] = {}


# --- hot-path helpers ------------------------------------------------------------------
#
# The two counted once or twice per REQ (its messages, its duration) are counted in plain
# dicts and added to prometheus_client's metrics only when they are read: a labelled
# child's `inc` takes a lock and an `observe` walks the buckets, ~8 us of the ~150 us a
# cached REQ cost (issue 48). `flush` runs before every collection of the registry
# (`_Flush`, registered first). With several workers (MULTIPROCESS) a scrape sums files
# every worker writes, and any worker may answer it: there each count is added at once.

_pending_messages: dict[tuple[str, type], int] = {}
_REQ_BOUNDS = (*_LATENCY, math.inf)  # the histogram's upper bounds, `le` of each bucket
_pending_reqs: dict[str, list[float]] = {}  # per tenant: [sum, count per bucket...]


def flush() -> None:
    """Add what the hot path counted since the last flush to the registry's metrics."""
    while _pending_messages:
        key, n = _pending_messages.popitem()
        child = _messages.get(key)
        if child is None:
            verb = _VERBS.get(key[1]) or key[1].__name__.removesuffix("Msg").upper()
            child = _messages[key] = MESSAGES.labels(key[0], verb)
        child.inc(n)
    while _pending_reqs:
        tenant, pending = _pending_reqs.popitem()
        child = _req.get(tenant)
        if child is None:
            child = _req[tenant] = REQ_SECONDS.labels(tenant)
        # what Histogram.observe does per observation, once per bucket
        child._sum.inc(pending[0])
        for bucket, n in zip(child._buckets, pending[1:], strict=True):
            if n:
                bucket.inc(n)


def start() -> float:
    """A start time for `req_done` / `batch_written`."""
    return time.perf_counter()


def message(tenant: str, msg: object) -> None:
    """One client message, decoded (`msg`) or not (None): counted here, added to
    `engram_messages_total` when it is read (`flush`)."""
    key = (tenant, type(msg))
    try:
        _pending_messages[key] += 1
    except KeyError:
        _pending_messages[key] = 1
    if MULTIPROCESS:  # another worker may answer the next scrape: the shared files now
        flush()


def _reason(text: str) -> str:
    """The OK message's machine-readable prefix, from a bounded set ("" for none)."""
    if not text:
        return ""
    prefix = text.partition(":")[0]
    return prefix if prefix in _REASONS else "other"


def event_result(tenant: str, kind: int, accepted: bool, text: str) -> None:
    """The outcome of one EVENT: what the relay answered in its OK."""
    key = (tenant, accepted, is_ephemeral(kind), _reason(text))
    child = _events.get(key)
    if child is None:
        reason = key[3]
        if not accepted:
            result = "rejected"
        elif reason == "duplicate":
            result = "duplicate"
        else:
            result = "ephemeral" if key[2] else "stored"
        child = _events[key] = EVENTS.labels(tenant, result, reason)
    child.inc()


def limited(tenant: str, msg: object) -> None:
    """A message refused by a rate limit: an EVENT counts as rejected, `rate-limited`."""
    if isinstance(msg, wire.EventMsg):
        event_result(tenant, msg.event.kind, False, "rate-limited:")


def req_done(tenant: str, started: float) -> None:
    """A REQ's EOSE: its time from `start`, into `engram_req_duration_seconds` when it is
    read (`flush`)."""
    seconds = time.perf_counter() - started
    pending = _pending_reqs.get(tenant)
    if pending is None:
        pending = _pending_reqs[tenant] = [0.0] + [0] * len(_REQ_BOUNDS)
    pending[1 + bisect_left(_REQ_BOUNDS, seconds)] += 1
    pending[0] += seconds
    if MULTIPROCESS:  # as in `message`
        flush()


def read_closed(tenant: str, message: str) -> None:
    """A REQ/COUNT the store could not answer (its CLOSED message is `message`)."""
    reason = "budget" if "timed out" in message else "unavailable"
    READS_CLOSED.labels(tenant, reason).inc()


def connection_opened(tenant: str) -> None:
    pair = _connections.get(tenant)
    if pair is None:
        pair = _connections[tenant] = (CONNECTIONS.labels(tenant), CONNECTIONS_TOTAL.labels(tenant))
    pair[0].inc()
    pair[1].inc()


def connection_closed(tenant: str) -> None:
    pair = _connections.get(tenant)
    if pair is not None:
        pair[0].dec()


def slow_consumer(dropped: int, reason: str) -> None:
    SLOW_CONSUMERS.inc()
    child = _DROPS.get(reason)
    if child is None:
        child = _DROPS[reason] = SLOW_CONSUMER_DROPS.labels(reason)
    child.inc()
    if dropped:
        DROPPED_FRAMES.inc(dropped)


def pending_overflow() -> None:
    PENDING_OVERFLOWS.inc()


def negentropy_refused() -> None:
    NEGENTROPY_REFUSED.inc()


def live_sent(tenant: str, frames: int) -> None:
    """Live frames one published event produced for this node's subscribers."""
    if frames:
        child = _live.get(tenant)
        if child is None:
            child = _live[tenant] = LIVE_EVENTS.labels(tenant)
        child.inc(frames)


def batch_written(size: int, started: float) -> None:
    BATCH_SIZE.observe(size)
    COMMIT_SECONDS.observe(time.perf_counter() - started)


# --- scrape-time gauges -------------------------------------------------------------------


def _gauges(sources: list[Any], *specs: tuple[str, str, str]) -> Iterator[GaugeMetricFamily]:
    """One gauge per (name, doc, attribute) over every source: the largest value for a
    peak, the sum otherwise, 0 with no source."""
    for name, doc, attr in specs:
        family = GaugeMetricFamily(name, doc)
        values = [getattr(o, attr) for o in sources]
        agg = max if "peak" in attr else sum
        family.add_metric([], agg(values) if values else 0)
        yield family


class _StateCollector:
    """Subscriptions and database pool, read from the live objects at scrape time."""

    def __init__(self) -> None:
        self.relays: weakref.WeakSet[Any] = weakref.WeakSet()
        self.pools: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.outputs: weakref.WeakSet[Any] = weakref.WeakSet()  # relay.sendqueue budgets
        self.negentropy: weakref.WeakSet[Any] = weakref.WeakSet()  # relay.negentropy services
        self.tails: weakref.WeakSet[Any] = weakref.WeakSet()  # live buses (delay())
        self.version = "0.0.0"

    def describe(self) -> list[Any]:
        return []  # unchecked collector: names are not registered up front

    def collect(self) -> Iterator[Any]:
        info = GaugeMetricFamily("engram_build_info", "Relay version.", labels=["version"])
        info.add_metric([self.version], 1)
        yield info
        subs = GaugeMetricFamily("engram_subscriptions", "Live subscriptions.", labels=["tenant"])
        counts: dict[str, int] = defaultdict(int)
        for relay in list(self.relays):
            for tenant, fanout in list(relay.fanouts.items()):
                counts[tenant] += len(fanout)
        for tenant, n in sorted(counts.items()):
            subs.add_metric([tenant], n)
        yield subs
        pool = GaugeMetricFamily(
            "engram_db_pool_connections", "Database pool connections.", labels=["state"]
        )
        in_use = idle = size_max = 0
        for p in list(self.pools.values()):
            try:
                size, free = p.get_size(), p.get_idle_size()
                in_use, idle = in_use + size - free, idle + free
                size_max += p.get_max_size()
            except Exception:  # a pool that is closing
                continue
        pool.add_metric(["in_use"], in_use)
        pool.add_metric(["idle"], idle)
        pool.add_metric(["max"], size_max)
        yield pool
        yield from _gauges(
            [r.reads.memo for r in list(self.relays) if r.reads.memo is not None],
            ("engram_req_memo_entries", "REQ filter texts kept (relay.reqmemo).", "size"),
            (
                "engram_req_memo_hits",
                "REQs whose filters were kept from an earlier REQ of the same text.",
                "hits",
            ),
        )
        yield from self.collect_output()

    def collect_output(self) -> Iterator[Any]:
        """Queued output, NIP-77 sets and the live tail's delay (relay.sendqueue,
        relay.negentropy, relay.store.pgbus)."""
        yield from _gauges(
            list(self.outputs),
            ("engram_send_queue_bytes", "Output queued for readers now.", "total"),
            ("engram_send_queue_bytes_peak", "The most output ever queued at once.", "peak_total"),
            (
                "engram_send_queue_connection_bytes_peak",
                "The most output one connection ever had queued.",
                "peak_connection",
            ),
            ("engram_send_queue_budget_bytes", "Budget for all queued output.", "limit"),
        )
        yield from _gauges(
            list(self.negentropy),
            ("engram_negentropy_bytes", "NIP-77 sets held (or reserved) now.", "held"),
            ("engram_negentropy_bytes_peak", "The most NIP-77 set bytes ever held.", "peak"),
            ("engram_negentropy_budget_bytes", "Budget for all NIP-77 sets.", "budget"),
        )
        tail = GaugeMetricFamily(
            "engram_live_tail_delay_seconds",
            "How long the cross-node live tail has been held back (0 when current).",
        )
        tail.add_metric([], max((t.delay() for t in list(self.tails)), default=0.0))
        yield tail


_STATE = _StateCollector()
REGISTRY.register(_STATE)  # type: ignore[arg-type]


def bind(relay: Any, version: str) -> None:
    """Report a Relay's subscriptions at scrape time."""
    _STATE.relays.add(relay)
    _STATE.version = version


def watch_output(budget: Any) -> None:
    """Report a relay.sendqueue budget's queued bytes and peaks at scrape time."""
    _STATE.outputs.add(budget)


def watch_negentropy(service: Any) -> None:
    """Report a relay.negentropy service's held bytes, peak and budget at scrape time."""
    _STATE.negentropy.add(service)


def watch_tail(bus: Any) -> None:
    """Report a live bus's delay (its `delay()`) at scrape time."""
    _STATE.tails.add(bus)


def watch_pool(owner: Any, pool: Any) -> None:
    """Report an asyncpg pool's usage for as long as `owner` (its store) lives."""
    _STATE.pools[owner] = pool


# --- reading -------------------------------------------------------------------------------


def render() -> bytes:
    """The registry in the Prometheus text format: the whole relay, whichever worker of
    `engram serve --workers N` answers (see `multiprocess`)."""
    if MULTIPROCESS:
        return multiprocess_render()
    return generate_latest(REGISTRY)


# --- several worker processes -----------------------------------------------------------
#
# With PROMETHEUS_MULTIPROC_DIR set (`engram serve --workers N` sets it) prometheus_client
# keeps counters, histograms and gauges in files shared by the workers, and a scrape sums
# them. The scrape-time gauges (subscriptions, pool, queued output, tail delay) live in
# each worker's memory, so every worker mirrors them into such gauges once a second (and
# the answering worker right before it renders): sums, or maxima for peaks and delays.

MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
MIRROR_SECONDS = 1.0
_mirrors: dict[str, Gauge] = {}


def _mirror_mode(name: str) -> str:
    if name == "engram_build_info":
        return "max"
    return "livemax" if name.endswith("_peak") or "delay" in name else "livesum"


def mirror_state() -> None:
    """Copy this worker's scrape-time gauges into the shared (file-backed) ones, and its
    pending counts into the shared counters (`flush`)."""
    flush()
    for family in _STATE.collect():
        for sample in family.samples:
            gauge = _mirrors.get(sample.name)
            if gauge is None:
                gauge = _mirrors[sample.name] = Gauge(
                    sample.name,
                    family.documentation,
                    list(sample.labels),
                    registry=None,
                    multiprocess_mode=_mirror_mode(sample.name),  # type: ignore[arg-type]
                )
            (gauge.labels(*sample.labels.values()) if sample.labels else gauge).set(sample.value)


def multiprocess_render() -> bytes:
    from prometheus_client import multiprocess

    mirror_state()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry)


async def _mirror_forever() -> None:
    while True:
        with contextlib.suppress(Exception):
            mirror_state()
        await asyncio.sleep(MIRROR_SECONDS)


def start_worker() -> asyncio.Task[None] | None:
    """In a worker of several: keep this worker's gauges mirrored; None otherwise."""
    return asyncio.create_task(_mirror_forever()) if MULTIPROCESS else None


def stop_worker(task: asyncio.Task[None] | None) -> None:
    """The worker is leaving: its live gauges stop counting."""
    if task is None:
        return
    task.cancel()
    from prometheus_client import multiprocess

    with contextlib.suppress(Exception):
        multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


def _sum(metric: Any, sample: str, **labels: str) -> float:
    return sum(
        s.value
        for family in metric.collect()
        for s in family.samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def counters(tenant: str, relay: Any) -> dict[str, int]:
    """Live numbers for one tenant, for the HTML page (not the hot path)."""
    fanout = relay.fanouts.get(tenant)
    return {
        "connections": int(_sum(CONNECTIONS, "engram_connections", tenant=tenant)),
        "subscriptions": len(fanout) if fanout is not None else 0,
        "events stored": int(_sum(EVENTS, "engram_events_total", tenant=tenant, result="stored")),
        "events rejected": int(
            _sum(EVENTS, "engram_events_total", tenant=tenant, result="rejected")
        ),
    }
