"""The review app: Starlette routes over `AgentMemory`, rendered on the server.

Pages (GET): the memory list (`/`), one memory (`/m/SLUG`), core as a graph (`/core`),
what changed since the last visit (`/changes`). Actions (POST, each with its CSRF field):
`/act/preview/SLUG` and `/act/save/SLUG` (correct a value), `/act/remove/SLUG`, and the
verdicts `/act/confirm|deny|restore|forget/SLUG`; those that cannot be undone have a GET
confirmation page at the same path. After an action the browser is sent (303) to the
memory's page, which reads the memory back from the relays.

No JavaScript anywhere: plain links and forms. Every path here is under the token prefix
that `guard.Guard` checks and strips (`root_path`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from cli.errors import AgentMemoryError, BadInputError, NotFoundError
from cli.memory.api import AgentMemory
from cli.memory.review import actions, visits
from cli.memory.review.actions import Outcome
from cli.memory.review.diffs import diff_lines, normalize_newlines
from cli.memory.review.graph import layout
from cli.memory.review.guard import Csrf, FormError, read_form
from cli.memory.review.snapshot import Row, Snapshot, take
from engram import CORE_SLUG
from engram.nip19 import npub

SEARCH_LIMIT = 50
PREVIEW_CHARS = 120  # the start of a value in the list
FLASH_KEEP = 64  # outcomes waiting for their page after a redirect (a bound, not a cache)
SORTS = {"slug": "slug", "newest": "newest change first", "oldest": "oldest change first"}
TRUST_STATES = ("guess", "stated", "confirmed", "denied")
VALIDITY = {"": "any", "current": "holds now", "ended": "ended"}
ASSETS = {"review.css": "text/css; charset=utf-8", "icon.svg": "image/svg+xml"}


def when(ts: int | None) -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(ts: int, now: float) -> str:
    s = int(now - ts)
    if s < 0:
        return "in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s // size} {unit} ago"
    return f"{s} s ago"


def start_of(value: str | None, chars: int = PREVIEW_CHARS) -> str:
    text = " ".join((value or "").split())
    return text if len(text) <= chars else text[: chars - 1] + "…"


class Review:
    """One review session: the memory, its CSRF secret, the visit mark, the templates."""

    def __init__(self, memory: AgentMemory, mark_path: Path) -> None:
        self.memory = memory
        self.csrf = Csrf()
        self.abilities = actions.abilities(memory)
        self.mark_path = mark_path
        self.baseline = visits.load(mark_path)
        self.last_shown: visits.Mark | None = None
        self._flash: OrderedDict[str, tuple[str, Outcome]] = OrderedDict()
        self.env = Environment(
            loader=PackageLoader("cli.memory.review", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(when=when, short=lambda s: (s or "")[:12], start=start_of)
        self.env.globals.update(
            npub=npub,
            quote=lambda s: quote(s, safe="/"),
            trust_states=TRUST_STATES,
        )

    # -- plumbing --

    def app(self) -> Starlette:
        page = self._page
        routes = [
            Route("/", page(self.list_page)),
            Route("/m/{slug:path}", page(self.memory_page)),
            Route("/core", page(self.core_page)),
            Route("/changes", page(self.changes_page)),
            Route("/changes/seen", page(self.mark_seen), methods=["POST"]),
            Route("/static/{name}", self.asset),
            Route("/act/preview/{slug:path}", page(self.preview), methods=["POST"]),
            Route("/act/save/{slug:path}", page(self.save), methods=["POST"]),
            Route("/act/remove/{slug:path}", page(self.remove), methods=["GET", "POST"]),
            Route("/act/confirm/{slug:path}", page(self.confirm), methods=["POST"]),
            Route("/act/deny/{slug:path}", page(self.deny), methods=["GET", "POST"]),
            Route("/act/restore/{slug:path}", page(self.restore), methods=["GET", "POST"]),
            Route("/act/forget/{slug:path}", page(self.forget), methods=["GET", "POST"]),
        ]
        return Starlette(routes=routes)

    def _page(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """Relay failures and bad forms become a page that says so, never a traceback."""

        async def run(request: Request) -> Response:
            try:
                if request.method == "POST":
                    request.state.form = await self._checked_form(request)
                return await handler(request)
            except FormError as exc:
                title = "Not found" if exc.status == 404 else "Not accepted"
                return self.render(request, "error.html", exc.status, title=title, why=exc)
            except (AgentMemoryError, TimeoutError) as exc:
                outcome = actions.failed(exc)
                return self.render(
                    request, "error.html", outcome.status, title=outcome.title, why=outcome.message
                )

        return run

    async def _checked_form(self, request: Request) -> dict[str, str]:
        form = await read_form(request)
        if not self.csrf.valid(self._action(request), form.get("csrf")):
            raise FormError(403, "the form's CSRF field is missing or wrong: reload the page")
        return form

    @staticmethod
    def _action(request: Request) -> str:
        root = request.scope.get("root_path", "")
        path: str = request.scope["path"]
        return path[len(root) :] if path.startswith(root) else path

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        ident = self.memory.identity
        base = request.scope.get("root_path", "")
        html = self.env.get_template(name).render(
            base=base,
            csrf=self.csrf.token,
            agent=ident.agent,
            owner=ident.owner,
            as_owner=ident.as_owner,
            relays=self.memory.relays,
            can=self.abilities,
            now=time.time(),
            ago=lambda ts: ago(ts, time.time()),
            **ctx,
        )
        return HTMLResponse(html, status)

    def to_memory(self, request: Request, slug: str, outcome: Outcome) -> Response:
        key = secrets.token_hex(8)
        self._flash[key] = (slug, outcome)
        while len(self._flash) > FLASH_KEEP:
            self._flash.popitem(last=False)
        base = request.scope.get("root_path", "")
        return RedirectResponse(f"{base}/m/{quote(slug, safe='/')}?r={key}", 303)

    async def snapshot(self) -> Snapshot:
        snap = await take(self.memory)
        self.last_shown = visits.Mark.of(snap, int(time.time()))
        return snap

    def finish(self) -> None:
        """At the server's stop: the heads last shown become the visit mark."""
        if self.last_shown is not None:
            visits.save(self.mark_path, self.last_shown)

    @staticmethod
    def slug_of(request: Request) -> str:
        try:
            return AgentMemory.slug(request.path_params["slug"])
        except BadInputError as exc:
            raise FormError(404, str(exc)) from exc

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return Response("404 no such file\n", 404, media_type="text/plain")
        data = resources.files("cli.memory.review").joinpath("static", name).read_bytes()
        return Response(data, media_type=ASSETS[name])

    # -- pages --

    async def list_page(self, request: Request) -> Response:
        params = request.query_params
        q = params.get("q", "").strip()
        sort = params.get("sort", "slug") if params.get("sort") in SORTS else "slug"
        contains = params.get("contains", "").strip()
        trust = params.get("trust", "") if params.get("trust") in TRUST_STATES else ""
        validity = params.get("validity", "") if params.get("validity") in VALIDITY else ""
        snap = await self.snapshot()
        rows = [*([snap.core] if snap.core else []), *snap.live.values()]
        snippets: dict[str, str] = {}
        search_error = ""
        searched = ""
        if q:
            try:
                hits, searched = await self._find(q)
                order = {h.slug: i for i, h in enumerate(hits)}
                snippets = {h.slug: getattr(h, "snippet", "") for h in hits}
                rows = sorted((r for r in rows if r.slug in order), key=lambda r: order[r.slug])
            except BadInputError as exc:
                search_error = str(exc)
                rows = []
        else:
            key: dict[str, Callable[[Row], Any]] = {
                "slug": lambda r: (r.slug != CORE_SLUG, r.slug),
                "newest": lambda r: (-r.created_at, r.slug),
                "oldest": lambda r: (r.created_at, r.slug),
            }
            rows.sort(key=key[sort])
        if contains:
            rows = [r for r in rows if contains.lower() in r.slug]
        if trust:
            rows = [r for r in rows if r.trust == trust]
        now = time.time()
        if validity == "current":
            rows = [r for r in rows if r.valid_until is None or r.valid_until > now]
        elif validity == "ended":
            rows = [r for r in rows if r.valid_until is not None and r.valid_until <= now]
        return self.render(
            request,
            "list.html",
            422 if search_error else 200,
            title="Memories",
            snap=snap,
            rows=rows,
            total=len(snap.live),
            q=q,
            searched=searched,
            search_error=search_error,
            snippets=snippets,
            sort=sort,
            sorts=SORTS,
            contains=contains,
            trust=trust,
            validity=validity,
            validities=VALIDITY,
            query=lambda **kw: urlencode(
                {
                    k: v
                    for k, v in {
                        "q": q,
                        "contains": contains,
                        "trust": trust,
                        "validity": validity,
                        "sort": sort,
                        **kw,
                    }.items()
                    if v
                }
            ),
        )

    async def _find(self, q: str) -> tuple[list[Any], str]:
        """The box's words as written where some memory contains them (search), else the
        memories most relevant to them, best first (recall: a question in plain words)."""
        found = list(await self.memory.search(q, limit=SEARCH_LIMIT))
        if found:
            return found, "search"
        return list((await self.memory.recall(q, limit=SEARCH_LIMIT)).hits), "recall"

    async def memory_page(self, request: Request) -> Response:
        slug = self.slug_of(request)
        flash = self._flash.pop(request.query_params.get("r", ""), None)
        outcome = flash[1] if flash is not None and flash[0] == slug else None
        got, snap = await asyncio.gather(
            self.memory.get(slug), self.snapshot(), return_exceptions=True
        )
        if isinstance(snap, BaseException):
            raise snap
        entry = None
        if isinstance(got, NotFoundError):
            entry = None
        elif isinstance(got, BaseException):
            raise got
        else:
            entry = got
        row = snap.core if slug == CORE_SLUG else snap.live.get(slug)
        readback = None
        if outcome is not None and outcome.ok and outcome.event_id:
            readback = entry.event_id == outcome.event_id if entry else None
        history = await self._history(slug) if self.abilities.history else None
        return self.render(
            request,
            "memory.html",
            200 if entry is not None else 404,
            title=slug,
            slug=slug,
            entry=entry,
            row=row,
            removed=snap.removed.get(slug),
            refs=snap.refs_of(slug),
            referenced_by=snap.referenced_by(slug),
            outcome=outcome,
            readback=readback,
            history=history,
            report=(entry.report if entry else snap.report),
        )

    async def _history(self, slug: str) -> list[Any] | None:
        log = getattr(self.memory, "log", None)
        if not callable(log):
            return None
        try:
            return list(await log(slug))
        except NotFoundError:
            return []

    async def core_page(self, request: Request) -> Response:
        snap = await self.snapshot()
        reachable, orphans, dangling = snap.graph()
        return self.render(
            request,
            "core.html",
            title="Core and its links",
            snap=snap,
            picture=layout(snap),
            reachable=reachable,
            orphans=orphans,
            dangling=dangling,
        )

    async def changes_page(self, request: Request) -> Response:
        snap = await self.snapshot()
        return self.render(
            request,
            "changes.html",
            title="Changes since your last visit",
            snap=snap,
            baseline=self.baseline,
            changes=visits.changes(snap, self.baseline),
        )

    async def mark_seen(self, request: Request) -> Response:
        """The heads on the relays now (not those the page showed) become the mark."""
        self.baseline = visits.Mark.of(await self.snapshot(), int(time.time()))
        visits.save(self.mark_path, self.baseline)
        return RedirectResponse(f"{request.scope.get('root_path', '')}/changes", 303)

    # -- actions --

    async def preview(self, request: Request) -> Response:
        slug = self.slug_of(request)
        form = request.state.form
        typed = normalize_newlines(form.get("value", ""))
        try:
            current = await self.memory.get(slug)
        except NotFoundError as exc:
            raise FormError(404, f"{slug} has no live value to correct") from exc
        base = form.get("base", "")
        return self.render(
            request,
            "preview.html",
            title=f"Correct {slug}",
            slug=slug,
            current=current,
            typed=typed,
            moved=base != current.sha256,
            diff=diff_lines(current.value, typed),
            outcome=None,
        )

    async def save(self, request: Request) -> Response:
        slug = self.slug_of(request)
        form = request.state.form
        outcome = await actions.correct(
            self.memory, slug, form.get("value", ""), form.get("base", "")
        )
        if outcome.ok:
            return self.to_memory(request, slug, outcome)
        typed = outcome.typed if outcome.typed is not None else ""
        current = outcome.newer
        if current is None:
            try:
                current = await self.memory.get(slug)
            except (AgentMemoryError, TimeoutError):
                current = None
        return self.render(
            request,
            "preview.html",
            outcome.status,
            title=f"Correct {slug}",
            slug=slug,
            current=current,
            typed=typed,
            moved=False,
            diff=diff_lines(current.value, typed) if current is not None else [],
            outcome=outcome,
        )

    async def remove(self, request: Request) -> Response:
        slug = self.slug_of(request)
        if request.method == "GET":
            return await self._confirm_page(request, slug, "remove")
        if request.state.form.get("confirm") != "yes":
            raise FormError(400, "tick the confirmation box to remove this memory")
        return self._after(request, slug, await actions.remove(self.memory, slug))

    async def confirm(self, request: Request) -> Response:
        slug = self.slug_of(request)
        return self._after(request, slug, await actions.verdict(self.memory, "confirm", slug))

    async def deny(self, request: Request) -> Response:
        slug = self.slug_of(request)
        if request.method == "GET":
            return await self._confirm_page(request, slug, "deny")
        reason = request.state.form.get("reason", "").strip()
        if not reason:
            raise FormError(400, "a denial needs a reason")
        outcome = await actions.verdict(self.memory, "deny", slug, reason=reason)
        return self._after(request, slug, outcome)

    async def restore(self, request: Request) -> Response:
        slug = self.slug_of(request)
        rev = (request.query_params if request.method == "GET" else request.state.form).get(
            "rev", ""
        )
        if request.method == "GET":
            return await self._confirm_page(request, slug, "restore", rev=rev)
        outcome = await actions.verdict(self.memory, "restore", slug, rev)
        return self._after(request, slug, outcome)

    async def forget(self, request: Request) -> Response:
        slug = self.slug_of(request)
        if request.method == "GET":
            return await self._confirm_page(request, slug, "forget")
        if request.state.form.get("confirm") != "yes":
            raise FormError(400, "tick the confirmation box to forget this memory")
        return self._after(request, slug, await actions.verdict(self.memory, "forget", slug))

    def _after(self, request: Request, slug: str, outcome: Outcome) -> Response:
        if outcome.ok:
            return self.to_memory(request, slug, outcome)
        return self.render(
            request, "error.html", outcome.status, title=outcome.title, why=outcome.message
        )

    async def _confirm_page(
        self, request: Request, slug: str, action: str, **extra: str
    ) -> Response:
        try:
            entry = await self.memory.get(slug)
        except NotFoundError:
            entry = None
        return self.render(
            request,
            "confirm.html",
            title=f"{action.capitalize()} {slug}",
            slug=slug,
            action=action,
            entry=entry,
            **extra,
        )
