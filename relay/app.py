"""The ASGI application: websocket relay, NIP-11 and an HTML page at `/` (per tenant);
`/healthz` and `/readyz` on every host, `/metrics` to the operator's addresses only
(`metrics_allow`: it names every tenant's hosts and traffic).

Tenants are bound from the Host header before the websocket upgrade; a Host that is not
one (RFC 9110) gets 400, an unknown host a generic 404. The Host routes, it never tells
who the relay is (relay.identity). The tenant configuration is polled from the store, so
changes made with `engram tenant …` reach running relays within `tenant_refresh_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from engram.nip01 import parse_public_key
from relay import gctune, metrics, nip11, nip86, openfiles, page, retention
from relay.allowlist import Allowlist
from relay.config import Settings
from relay.hosts import parse_host
from relay.identity import ordered
from relay.pipeline import BLOCKED_ADDRESS, Relay
from relay.store import RelayStore, StoreControl, StoreError
from relay.tenants import TenantRegistry
from relay.transport import client_ip, local_address, serve_websocket

log = logging.getLogger("engram.relay")

_CORS = {
    "Access-Control-Allow-Origin": "*",
    # `*` does not cover Authorization (Fetch standard): NIP-86 web clients send it
    "Access-Control-Allow-Headers": "*, Authorization",
    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
}
_NOT_FOUND = "not found\n"


def package_version() -> str:
    try:
        return version("engram-relay")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


async def refresh_tenants(store: StoreControl, registry: TenantRegistry) -> None:
    """Reload the tenant configuration if its version moved. New bans (relay.nip86,
    `engram tenant ban`) are swept once more here: an event this node accepted before it
    knew of the ban must not stay stored."""
    current = await store.tenant_version()
    if current != registry.version:
        first = registry.version < 0
        before = registry.bans()
        configs = await store.load_tenants()
        registry.load(configs, current, await store.load_moderation())
        log.info("tenant configuration v%d loaded", current)
        if not first:
            await sweep_new_bans(store, before, registry.bans())


async def sweep_new_bans(
    store: StoreControl,
    before: dict[str, tuple[frozenset[str], frozenset[str]]],
    after: dict[str, tuple[frozenset[str], frozenset[str]]],
) -> None:
    for tenant, (pubkeys, ids) in after.items():
        old_pubkeys, old_ids = before.get(tenant, (frozenset(), frozenset()))
        new_pubkeys, new_ids = sorted(pubkeys - old_pubkeys), sorted(ids - old_ids)
        if new_pubkeys or new_ids:
            n = await store.run_admin(tenant, _sweep(tenant, new_pubkeys, new_ids))
            if n:
                log.info("tenant %s: %d events of new bans deleted", tenant, n)


def _sweep(tenant: str, pubkeys: list[str], ids: list[str]) -> Callable[[Any, Any], Awaitable[int]]:
    """The admin action that deletes what newly banned authors and ids left behind."""
    from relay.store import moderation

    return lambda _control, events: moderation.sweep(events, tenant, pubkeys, ids)


async def poll_tenants(store: StoreControl, registry: TenantRegistry, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            await refresh_tenants(store, registry)
        except (StoreError, ValueError) as exc:  # keep serving with the last good config
            log.warning("tenant reload failed: %s", exc)


async def purge_expired(store: StoreControl, every: float) -> None:
    """NIP-40: expired events are never served; this reclaims their rows in batches."""
    while True:
        await asyncio.sleep(every)
        try:
            n = await store.purge_expired(int(time.time()))
        except StoreError as exc:
            log.warning("expired-event purge failed: %s", exc)
        else:
            if n:
                log.info("purged %d expired events", n)


class HostCheck:
    """RFC 9110/9112: a request whose Host is not `uri-host [":" port]`, that has several
    Host lines, or (HTTP/1.1) none, is answered 400 before anything routes it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            why = host_problem(scope)
            if why is not None:
                response = PlainTextResponse(f"bad request: {why}\n", status_code=400)
                if scope["type"] == "http":
                    await response(scope, receive, send)
                else:
                    await WebSocket(scope, receive, send).send_denial_response(response)
                return
        await self.app(scope, receive, send)


def host_problem(scope: Scope) -> str | None:
    """Why the request's Host header is not acceptable, or None."""
    hosts = [v for k, v in scope.get("headers", ()) if k == b"host"]
    if len(hosts) > 1:
        return "more than one Host header"
    if not hosts:
        return None if scope.get("http_version") == "1.0" else "no Host header"
    try:
        value = hosts[0].decode("ascii")
    except UnicodeDecodeError:
        return "the Host header is not ASCII"
    if parse_host(value) is None:
        return "the Host header is not a host[:port] (RFC 9110)"
    return None


@contextlib.asynccontextmanager
async def running(app: Starlette, settings: Settings, database_url: str) -> AsyncIterator[None]:
    """The app's lifespan: the store opens (and migrates), the relay starts, and the
    background tasks run (tenant poll, NIP-40 purge, the live bus's tail, retention, the
    metrics mirror) until shutdown, which stops them in order."""
    from relay.store.router import StoreRouter

    before, now = openfiles.raise_open_files()  # a connection is a file descriptor
    log.info(
        "open files limit: %d%s (each connection holds one)",
        now,
        f" (raised from {before})" if now != before else "",
    )
    # tenants on their own databases (relay.store.router); replicas in the store
    store: RelayStore = await StoreRouter.open(database_url, settings)
    registry = TenantRegistry(settings)
    await refresh_tenants(store, registry)
    bus = store.bus
    relay = Relay(settings, store, tenants=registry, bus=bus)
    relay.start()
    app.state.relay = relay
    app.state.store = store
    metrics.bind(relay, package_version())
    poller = asyncio.create_task(poll_tenants(store, registry, settings.tenant_refresh_seconds))
    expirer = asyncio.create_task(purge_expired(store, settings.expired_purge_seconds))
    await bus.prepare()  # before the first subscriber (see PostgresBus.prepare)
    tail = asyncio.create_task(bus.run(relay.deliver_remote))
    pruner = retention.start(settings, database_url)  # None unless [retention] is set
    worker = metrics.start_worker()  # None unless one of `--workers N`
    gctune.tune(settings.gc_threshold0)
    try:
        yield
    finally:
        metrics.stop_worker(worker)
        poller.cancel()
        expirer.cancel()
        tail.cancel()
        await retention.stop(pruner)
        relay.close()  # EVENTs still waiting for their signature check are answered
        await store.close()


class Routes:
    """The HTTP and websocket endpoints, over the running relay (`app.state.relay`) and
    its store (`app.state.store`, the relay's RelayStore)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.nips = nip11.supported_nips(settings)
        self.operators = frozenset(parse_public_key(pk) for pk in settings.operators)
        self.scrapers = Allowlist(settings.metrics_allow, "metrics_allow")

    async def manage(self, request: Request) -> Response:
        """NIP-86 management call (relay.nip86)."""
        relay: Relay = request.app.state.relay
        store: RelayStore = request.app.state.store
        headers = request.headers
        tenant = relay.tenants.resolve(headers.get("host", ""))
        if tenant is None:
            return PlainTextResponse(_NOT_FOUND, status_code=404)
        body = b""
        async for chunk in request.stream():  # bounded: never more than MAX_BODY + chunk
            body += chunk
            if len(body) > nip86.MAX_BODY:
                break
        answer = await nip86.handle(
            tenant=tenant,
            operators=self.operators,
            urls=relay.identity.urls(tenant, local_address(request)),
            path=request.url.path,
            query=request.url.query,
            content_type=headers.get("content-type", ""),
            authorization=headers.get("authorization", ""),
            body=body,
            now=int(time.time()),
            run=store.run_admin,
            refresh=lambda: refresh_tenants(store, relay.tenants),
        )
        return JSONResponse(
            answer.body,
            status_code=answer.status,
            media_type=nip86.CONTENT_TYPE,
            headers={**_CORS, **answer.headers},
        )

    async def info(self, request: Request) -> Response:
        """NIP-11 to `Accept: application/nostr+json`, else the relay's HTML page."""
        relay: Relay = request.app.state.relay
        tenant = relay.tenants.resolve(request.headers.get("host", ""))
        if tenant is None:
            return PlainTextResponse(_NOT_FOUND, status_code=404)
        if request.method == "OPTIONS":
            return Response(status_code=204, headers=_CORS)
        if "application/nostr+json" in request.headers.get("accept", ""):
            return JSONResponse(
                nip11.document(tenant, package_version(), self.nips),
                media_type="application/nostr+json",
                headers=_CORS,
            )
        urls = ordered(relay.identity.urls(tenant, local_address(request)))
        counters = metrics.counters(tenant.key, relay)
        configured = bool(tenant.public_urls or relay.identity.public_urls)
        return HTMLResponse(page.render(tenant, urls, configured, package_version(), counters))

    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(self, request: Request) -> Response:
        """Ready: the database answers and every migration this version knows is applied."""
        store: RelayStore = request.app.state.store
        if not await store.ping():
            return PlainTextResponse("not ready: database unreachable\n", status_code=503)
        if not await store.migrations_current():
            return PlainTextResponse("not ready: database migrations pending\n", status_code=503)
        detail = ""
        delay = store.bus.delay()
        if delay > 0:  # still ready: delivery across nodes resumes when it ends
            detail = f"live tail: held back {delay:.1f} s by a long-running transaction\n"
        return PlainTextResponse("ready\n" + detail)

    async def prometheus(self, request: Request) -> Response:
        ip = client_ip(request, self.settings.rate.trust_forwarded_for)
        if not await self.scrapers.allows(ip):
            return PlainTextResponse(
                "forbidden: /metrics is served to the operator's addresses only"
                " (setting metrics_allow)\n",
                status_code=403,
            )
        return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)

    async def websocket(self, ws: WebSocket) -> None:
        relay: Relay = ws.app.state.relay
        tenant = relay.tenants.resolve(ws.headers.get("host", ""))
        if tenant is None:
            await ws.send_denial_response(PlainTextResponse(_NOT_FOUND, status_code=404))
            return
        if tenant.moderation.ip_blocked(client_ip(ws, self.settings.rate.trust_forwarded_for)):
            await ws.send_denial_response(
                PlainTextResponse(BLOCKED_ADDRESS + "\n", status_code=403)
            )
            return
        await serve_websocket(ws, relay, tenant)


def create_app(settings: Settings, database_url: str) -> Starlette:
    """The relay app; the store opens (and migrates) in the lifespan (`running`)."""
    routes = Routes(settings)
    app = Starlette(
        routes=[
            Route("/", routes.info, methods=["GET", "HEAD", "OPTIONS"]),
            Route("/", routes.manage, methods=["POST"]),
            Route("/healthz", routes.healthz),
            Route("/readyz", routes.readyz),
            Route("/metrics", routes.prometheus),
            WebSocketRoute("/", routes.websocket),
        ],
        lifespan=lambda app: running(app, settings, database_url),
    )
    app.add_middleware(HostCheck)
    return app


def create_app_from_env() -> Starlette:
    """Factory for `engram serve --workers N`: each worker process reads the settings the
    parent exported (ENGRAM_* variables; the parent resolved the database URL)."""
    from relay.config import load_settings
    from relay.logs import setup_logging

    settings = load_settings()
    setup_logging(settings.log_level, settings.log_format)
    if not settings.database_url:
        raise RuntimeError("ENGRAM_DATABASE_URL must be set for worker processes")
    return create_app(settings, settings.database_url)
