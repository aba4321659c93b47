"""The ASGI application: websocket relay at `/`, NIP-11 on GET `/`, health at `/healthz`."""

from __future__ import annotations

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
from relay.store import EventStore
from relay.transport import serve_websocket

log = logging.getLogger("engram.relay")

_CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Headers": "*",
    "Access-Control-Allow-Methods": "GET, OPTIONS",
}


def package_version() -> str:
    try:
        return version("engram-relay")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


def create_app(settings: Settings, database_url: str) -> Starlette:
    """The relay app; the store opens (and migrates) in the lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        from relay.store.postgres import PostgresStore

        store: EventStore = await PostgresStore.open(database_url, settings)
        app.state.relay = Relay(settings, store)
        try:
            yield
        finally:
            await store.close()

    async def info(request: Request) -> Response:
        if request.method == "OPTIONS":
            return Response(status_code=204, headers=_CORS)
        if "application/nostr+json" in request.headers.get("accept", ""):
            return JSONResponse(
                nip11.document(settings, package_version()),
                media_type="application/nostr+json",
                headers=_CORS,
            )
        return PlainTextResponse(
            f"{settings.relay_name}: a Nostr relay. Connect a Nostr client over websocket.\n"
        )

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def websocket(ws: WebSocket) -> None:
        await serve_websocket(ws, ws.app.state.relay)

    return Starlette(
        routes=[
            Route("/", info, methods=["GET", "HEAD", "OPTIONS"]),
            Route("/healthz", healthz),
            WebSocketRoute("/", websocket),
        ],
        lifespan=lifespan,
    )
