"""The ASGI application: websocket relay and NIP-11 at `/` (per tenant), `/healthz`.

Tenants are bound from the Host header before the websocket upgrade; an unknown host gets
a generic 404. The tenant configuration is polled from the store, so changes made with
`engram tenant …` reach running relays within `tenant_refresh_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from importlib.metadata import PackageNotFoundError, version

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from relay import nip11
from relay.config import Settings
from relay.pipeline import Relay
from relay.store import StoreError
from relay.tenants import TenantRegistry
from relay.transport import serve_websocket

log = logging.getLogger("engram.relay")

_CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "*",
    "Access-Control-Allow-Methods": "GET, OPTIONS",
}
_NOT_FOUND = "not found\n"


def package_version() -> str:
    try:
        return version("engram-relay")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


async def refresh_tenants(store: object, registry: TenantRegistry) -> None:
    """Reload the tenant configuration if its version moved."""
    current = await store.tenant_version()  # type: ignore[attr-defined]
    if current != registry.version:
        registry.load(await store.load_tenants(), current)  # type: ignore[attr-defined]
        log.info("tenant configuration v%d loaded", current)


async def poll_tenants(store: object, registry: TenantRegistry, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            await refresh_tenants(store, registry)
        except (StoreError, ValueError) as exc:  # keep serving with the last good config
            log.warning("tenant reload failed: %s", exc)


def create_app(settings: Settings, database_url: str) -> Starlette:
    """The relay app; the store opens (and migrates) in the lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        from relay.store.postgres import PostgresStore

        store = await PostgresStore.open(database_url, settings)
        registry = TenantRegistry(settings)
        await refresh_tenants(store, registry)
        app.state.relay = Relay(settings, store, tenants=registry)
        poller = asyncio.create_task(poll_tenants(store, registry, settings.tenant_refresh_seconds))
        try:
            yield
        finally:
            poller.cancel()
            await store.close()

    async def info(request: Request) -> Response:
        relay: Relay = request.app.state.relay
        tenant = relay.tenants.resolve(request.headers.get("host", ""))
        if tenant is None:
            return PlainTextResponse(_NOT_FOUND, status_code=404)
        if request.method == "OPTIONS":
            return Response(status_code=204, headers=_CORS)
        if "application/nostr+json" in request.headers.get("accept", ""):
            return JSONResponse(
                nip11.document(tenant, package_version()),
                media_type="application/nostr+json",
                headers=_CORS,
            )
        return PlainTextResponse(
            f"{tenant.name}: a Nostr relay. Connect a Nostr client over websocket.\n"
        )

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def websocket(ws: WebSocket) -> None:
        relay: Relay = ws.app.state.relay
        tenant = relay.tenants.resolve(ws.headers.get("host", ""))
        if tenant is None:
            await ws.send_denial_response(PlainTextResponse(_NOT_FOUND, status_code=404))
            return
        await serve_websocket(ws, relay, tenant)

    return Starlette(
        routes=[
            Route("/", info, methods=["GET", "HEAD", "OPTIONS"]),
            Route("/healthz", healthz),
            WebSocketRoute("/", websocket),
        ],
        lifespan=lifespan,
    )
