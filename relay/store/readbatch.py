"""Coalesce concurrent reads of one shape into one statement.

A REQ's own work in PostgreSQL is a few index probes; what it paid for was the statement
around them: the relay's send to the server (a syscall and a wake-up of the backend,
measured as a third of the relay's CPU per REQ), the pool round trip, and PostgreSQL's
per-statement overhead (about 70 us of its CPU). Reads that arrive while others run are
grouped by statement text, and each group runs as ONE statement: the statement becomes a
LATERAL subquery over `unnest` of per-query parameter arrays, so every query keeps its own
WHERE, ORDER BY and LIMIT and its rows come back tagged with its index. Measured on this
machine at 8 queries a statement: 31 us of PostgreSQL and 41 us of relay CPU per `authors`
query, against 100 and 169 one statement each.

Only statements whose parameters are all scalars (text, bytea, int) are batched (an
array parameter cannot be a column of the unnest); others, and full-text search (which
may run long and would hold its batch back), run as statements of their own, on the same
slots: every REQ/COUNT read counts against `concurrency` and its client's share of it.
Nothing waits to fill a batch: a group starts as soon as one of `concurrency` slots is
free, on the next loop iteration, so a lone query costs one `call_soon` more than
before. The statement timeout covers the whole batch, hence a modest default batch size
(32: measured at 8 x 8 REQs in flight, 64 and 16 were within noise of each other, ~200
vs ~230 us per REQ, and fewer queries of a slow shape then share one timeout).

Whole-set reads (a NIP-77 NEG-OPEN's, up to `negentropy_max_items` rows aggregated) take
none of those slots: they run one statement each, at most `bulk_concurrency` at once, so
a few anonymous NEG-OPENs over `{}` cannot hold every REQ slot for a statement timeout.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from collections import OrderedDict, deque
from typing import Any

import asyncpg

_PARAM = re.compile(r"\$(\d+)\b")
_TYPES: dict[type, str] = {str: "text", bytes: "bytea", int: "int8"}

Key = tuple[Any, ...]  # (sql, parameter types), and a serial for a read run on its own
Item = tuple[list[Any], "asyncio.Future[list[Any]]"]

# Who a read is for (relay.readgate sets the client's address around its reads): free
# slots go round-robin over the clients with reads waiting, and one client runs at most
# all slots but one, so a client with many costly reads queued waits for its own, and
# another client's read finds a free slot.
READ_CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("read_client", default="")


def batchable(sql: str, params: list[Any]) -> bool:
    """Scalar parameters only, and not a search (see the module docstring)."""
    return "websearch_to_tsquery" not in sql and all(type(v) in _TYPES for v in params)


def batched_sql(sql: str, types: tuple[type, ...]) -> str:
    """`sql` run once per row of parameter arrays ($1 the query's index, $2.. one array per
    parameter of `sql`), each result row prefixed with that index."""
    n = len(types)
    cols = "".join(f", p{k}" for k in range(1, n + 1))
    arrays = "".join(f", ${k + 1}::{_TYPES[t]}[]" for k, t in enumerate(types, 1))
    inner = _PARAM.sub(lambda m: f"b.p{m.group(1)}", sql)
    return (
        f"SELECT b.i, s.* FROM unnest($1::int4[]{arrays}) AS b(i{cols})"
        f" CROSS JOIN LATERAL ({inner}) s"
    )


class ReadBatcher:
    """Runs reads on `pool`, at most `concurrency` statements at once, grouping queries
    of one statement text (up to `batch_max` a statement) that wait for a slot."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        timeout: float,
        batch_max: int = 32,
        concurrency: int = 4,
        bulk_concurrency: int = 2,
    ) -> None:
        self._pool = pool
        self._timeout = timeout
        self._batch_max = max(1, batch_max)
        self._concurrency = max(1, concurrency)
        self._bulk = asyncio.Semaphore(max(1, bulk_concurrency))
        self._groups: dict[Key, list[Item]] = {}
        # per client with reads waiting, the groups it joined, oldest first (a group run
        # for another client first is skipped when this one's turn comes); clients in
        # round-robin order
        self._clients: OrderedDict[str, deque[Key]] = OrderedDict()
        # statements running per client: one client never holds every slot, so another
        # client's read always finds one free (or the next to free) instead of waiting for
        # a costly statement of the first to end
        self._busy: dict[str, int] = {}
        self._per_client = max(1, self._concurrency - 1)
        self._running = 0
        self._solo = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    def fetch(self, sql: str, params: list[Any]) -> asyncio.Future[list[Any]]:
        """The rows of `sql` (tuples or records, indexable alike); raises what asyncpg
        raises (TimeoutError for the statement timeout). A read that cannot be batched
        (see `batchable`) runs as a statement of its own, on the same slots."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        if batchable(sql, params):
            key: Key = (sql, tuple(map(type, params)))
        else:
            self._solo += 1  # a key of its own: never joined by another read
            key = (sql, None, self._solo)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = []
        group.append((params, future))
        client = READ_CLIENT.get()
        keys = self._clients.get(client)
        if keys is None:
            keys = self._clients[client] = deque()
        if not keys or keys[-1] != key:
            keys.append(key)
        self._kick(loop)
        return future

    async def fetch_bulk(self, sql: str, params: list[Any]) -> list[Any]:
        """The rows of a whole-set read, on its own slots (see the module docstring);
        raises what asyncpg raises, as `fetch`."""
        async with self._bulk, self._pool.acquire() as conn:  # bounded as in _execute
            return list(await conn.fetch(sql, *params, timeout=self._timeout))

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._scheduled and self._groups and self._running < self._concurrency:
            self._scheduled = True
            loop.call_soon(self._start)  # queries of this loop iteration join the batch

    def _next(self) -> tuple[str, Key] | None:
        """(client, its oldest waiting group) of the next client in turn (round-robin)
        that runs fewer than `_per_client` statements."""
        for _ in range(len(self._clients)):
            client, keys = self._clients.popitem(last=False)
            while keys and keys[0] not in self._groups:
                keys.popleft()  # run already, in another client's turn
            if not keys:
                continue
            if self._busy.get(client, 0) >= self._per_client:
                self._clients[client] = keys  # its turn passes
                continue
            key = keys[0]
            if len(self._groups[key]) <= self._batch_max:
                keys.popleft()
            if keys:
                self._clients[client] = keys  # back of the line
            return client, key
        return None

    def _start(self) -> None:
        self._scheduled = False
        while self._running < self._concurrency:
            turn = self._next()
            if turn is None:
                break
            client, key = turn
            items = self._groups.pop(key)
            if len(items) > self._batch_max:
                self._groups[key] = items[self._batch_max :]
                items = items[: self._batch_max]
            self._running += 1
            self._busy[client] = self._busy.get(client, 0) + 1
            task = asyncio.create_task(self._run(client, key, items))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, client: str, key: Key, items: list[Item]) -> None:
        try:
            live = [(p, f) for p, f in items if not f.done()]  # callers may have gone
            if live:
                results = await self._execute(key, [p for p, _ in live])
                for (_, f), rows in zip(live, results, strict=True):
                    if not f.done():
                        f.set_result(rows)
        except BaseException as exc:
            for _, f in items:
                if not f.done():
                    f.set_exception(exc if isinstance(exc, Exception) else RuntimeError("stopped"))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._running -= 1
            busy = self._busy.pop(client) - 1
            if busy:
                self._busy[client] = busy
            self._kick(asyncio.get_running_loop())

    async def _execute(self, key: Key, params: list[list[Any]]) -> list[list[Any]]:
        sql, types = key[0], key[1]
        async with self._pool.acquire() as conn:  # bounded: every holder has a timeout
            if len(params) == 1:
                return [list(await conn.fetch(sql, *params[0], timeout=self._timeout))]
            columns = [list(c) for c in zip(*params, strict=True)]
            rows = await conn.fetch(
                batched_sql(sql, types), list(range(len(params))), *columns, timeout=self._timeout
            )
        out: list[list[Any]] = [[] for _ in params]
        for r in rows:
            out[r[0]].append(r[1:])
        return out
