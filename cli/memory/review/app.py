"""The review app: Starlette routes over `AgentMemory`, rendered on the server.

Pages (GET), each from one read of the relays: the memory list (`/`, `?show=gone` for
the memories that do not read as live, `?links=SLUG` for those that link to SLUG), one
memory with its history (`/m/SLUG`, `?from=ID&to=ID` compares two versions), core as a
graph (`/core`), what changed since the last visit (`/changes`). Actions (POST,
each with its CSRF field): `/act/preview/SLUG` and `/act/save/SLUG` (correct a value),
`/act/confirm|deny|restore|forget|remove/SLUG`; those that cannot be undone (deny,
restore, forget, remove) have a GET confirmation page at the same path. After an action
the browser is sent (303) to the memory's page, which reads the memory back from the
relays; a refusal or a conflict is a page of its own with the relay's or the rule's
words.

No JavaScript anywhere: plain links and forms. Every path here is under the token prefix
that `guard.Guard` checks and strips (`root_path`).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from cli.memory.api import AgentMemory, Entry, sha256_hex
from cli.memory.review import actions, listing, timeline, visits
from cli.memory.review.actions import Outcome
from cli.memory.review.diffs import diff_lines, normalize_newlines
from cli.memory.review.graph import layout
from cli.memory.review.guard import Csrf, FormError, read_form
from cli.memory.review.pages import Paged, number
from cli.memory.review.snapshot import Row, Snapshot, row_of, take
from cli.memory.review.timeline import COMPARE_CHARS
from cli.nostr.errors import AgentMemoryError, BadInputError, NotFoundError
from engram import extract_refs
from engram.live import ended
from engram.nip19 import npub
from engram.versions import Meta

SEARCH_LIMIT = 50
PREVIEW_CHARS = 120  # the start of a value in the list
VALUE_CHARS = 16_000  # of the value shown atop a memory's page (the edit box holds it all)
LINKS_SHOWN = 100  # a memory's [[links]] listed on its page
FINDINGS_SHOWN = 50  # audit findings listed on a memory's page
PAGE_ROWS = 100  # rows of the list and of the changes a page shows
LISTED = 200  # orphans and dangling links named under the core graph
FLASH_KEEP = 64  # outcomes waiting for their page after a redirect (a bound, not a cache)
ASSETS = {"review.css": "text/css; charset=utf-8", "icon.svg": "image/svg+xml"}
STATE_WORDS = {
    "live": "live",
    "removed": "removed",
    "denied": "denied by the owner",
    "forgotten": "forgotten",
}


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


def base_of(form: dict[str, str]) -> str:
    """The sha256 of the value the page showed, which an action's form carries: an action
    on a value the owner did not see is a conflict, never a silent write."""
    base = form.get("base", "").strip().lower()
    if len(base) != 64 or not all(c in "0123456789abcdef" for c in base):
        raise FormError(400, "the form does not say which value it acts on: reload the page")
    return base


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
            state_words=STATE_WORDS,
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
                return self.failure(request, actions.failed(exc))

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

    def failure(
        self, request: Request, outcome: Outcome, retry: dict[str, str] | None = None
    ) -> HTMLResponse:
        """An action that did not happen, with the relay's or the rule's words; `retry`:
        the form to do it anyway (force), when the rule that refused it allows that."""
        again = retry if outcome.overridable and retry is not None else None
        return self.render(
            request,
            "error.html",
            outcome.status,
            title=outcome.title,
            why=outcome.message,
            retry=again,
            action=self._action(request),
        )

    async def snapshot(self, *, audit: bool = False) -> Snapshot:
        snap = await take(self.memory, audit=audit)
        if snap.complete:  # a partial read never becomes the visit mark
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
        query = listing.ListQuery.of(request.query_params)
        snap = await self.snapshot(audit=True)
        found: list[str] | None = None
        snippets: dict[str, str] = {}
        search_error = searched = ""
        if query.q and not query.gone:
            try:
                hits, searched = await self._find(query.q)
                found = [h.slug for h in hits]
                snippets = {h.slug: getattr(h, "snippet", "") for h in hits}
            except BadInputError as exc:
                search_error, found = str(exc), []
        now = int(time.time())
        rows = listing.select(snap, query, now, found)
        shown = Paged.of(rows, number(request.query_params.get("page")), PAGE_ROWS)
        return self.render(
            request,
            "list.html",
            422 if search_error else 200,
            title="Memories",
            snap=snap,
            report=snap.report,
            partial=not snap.complete,
            rows=shown.rows,
            paged=shown,
            total=len(snap.live) + (snap.core is not None),
            query=query,
            searched=searched,
            search_error=search_error,
            snippets=snippets,
            sorts=listing.SORTS,
            validities=listing.VALIDITY,
            bys=listing.BY,
            audits=listing.AUDIT,
            trusts=listing.LIVE_TRUST,
            ended=lambda r: listing.ended_row(r, now),
        )

    async def _find(self, q: str) -> tuple[list[Any], str]:
        """The box's words as written where some memory contains them (search), else the
        memories most relevant to them, best first (recall: a question in plain words)."""
        found = list(await self.memory.search(q, limit=SEARCH_LIMIT))
        if found:
            return found, "search"
        return list((await self.memory.recall(q, limit=SEARCH_LIMIT)).hits), "recall"

    async def memory_page(self, request: Request) -> Response:
        """One memory from one read of its history (`AgentMemory.inspect`): its value, its
        outgoing links, its audit and its history."""
        slug = self.slug_of(request)
        params = request.query_params
        flash = self._flash.pop(params.get("r", ""), None)
        outcome = flash[1] if flash is not None and flash[0] == slug else None
        seen = await self.memory.inspect(slug)
        now_row = row_of(seen.live, self.memory.identity.conversation_key)
        row = now_row if now_row is not None and now_row.live else None
        gone = now_row if now_row is not None and not now_row.live else None
        log = seen.log
        live_sha = sha256_hex(row.value or "") if row is not None else None
        readback = None
        if outcome is not None and outcome.ok and outcome.event_id:
            readback = now_row is not None and now_row.event_id == outcome.event_id
        history = None
        compared = whole = None
        if log is not None:
            page = number(params.get("page"))
            history = timeline.build(
                log, live_sha256=live_sha, owner=self.abilities.owner, page=page
            )
            if params.get("from") and params.get("to"):
                compared = timeline.compare(log, params["from"], params["to"])
            if params.get("value"):
                whole = timeline.full_value(log, params["value"])
        found = now_row is not None or log is not None
        meta = Meta(valid_from=row.valid_from, valid_until=row.valid_until) if row else None
        refs = extract_refs(row.value or "") if row is not None else []
        findings = seen.audit.findings
        return self.render(
            request,
            "memory.html",
            200 if found else 404,
            title=slug,
            slug=slug,
            row=row,
            gone=gone,
            now_row=now_row,
            sha=live_sha,
            ended=meta is not None and ended(meta, int(time.time())),
            refs=refs[:LINKS_SHOWN],
            refs_more=max(0, len(refs) - LINKS_SHOWN),
            outcome=outcome,
            readback=readback,
            history=history,
            items=history.items if history is not None else [],
            compared=compared,
            whole=whole,
            picked=(params.get("from", ""), params.get("to", "")),
            audited=seen.audit,
            findings=findings[:FINDINGS_SHOWN],
            findings_more=max(0, len(findings) - FINDINGS_SHOWN),
            top_chars=VALUE_CHARS,
            report=seen.report,
        )

    async def core_page(self, request: Request) -> Response:
        snap = await self.snapshot()
        reachable, orphans, dangling = snap.graph
        return self.render(
            request,
            "core.html",
            title="Core and its links",
            snap=snap,
            report=snap.report,
            partial=not snap.complete,
            picture=layout(snap),
            reachable=reachable,
            orphans=orphans,
            dangling=dangling,
            listed=LISTED,
            top_chars=VALUE_CHARS,
        )

    async def changes_page(self, request: Request) -> Response:
        snap = await self.snapshot()
        found = visits.changes(snap, self.baseline)
        return self.render(
            request,
            "changes.html",
            title="Changes since your last visit",
            snap=snap,
            report=snap.report,
            partial=not snap.complete,
            baseline=self.baseline,
            changes=found,
            paged=Paged.of(found.items, number(request.query_params.get("page")), PAGE_ROWS),
        )

    async def mark_seen(self, request: Request) -> Response:
        """The heads on the relays now (not those the page showed) become the mark; not
        from a partial read (409: nothing saved)."""
        snap = await self.snapshot()
        if not snap.complete:
            why = "; ".join(snap.report.warnings()[:5])
            raise FormError(
                409,
                "not marked: not every relay was read to the end, and a mark from a partial "
                f"read would call what it missed new next time ({why}). Nothing was saved.",
            )
        self.baseline = visits.Mark.of(snap, int(time.time()))
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
        return self.render(
            request,
            "preview.html",
            title=f"Correct {slug}",
            slug=slug,
            current=current,
            typed=typed,
            moved=form.get("base", "") != current.sha256,
            diff=diff_lines(current.value, typed, budget=COMPARE_CHARS),
            outcome=None,
        )

    async def save(self, request: Request) -> Response:
        slug = self.slug_of(request)
        form = request.state.form
        outcome = await actions.correct(
            self.memory,
            slug,
            form.get("value", ""),
            base_of(form),
            force=form.get("force") == "yes",
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
            diff=diff_lines(current.value, typed, budget=COMPARE_CHARS) if current else [],
            outcome=outcome,
        )

    async def confirm(self, request: Request) -> Response:
        slug = self.slug_of(request)
        outcome = await actions.confirm(self.memory, slug, base_of(request.state.form))
        return self._after(request, slug, outcome)

    async def deny(self, request: Request) -> Response:
        slug = self.slug_of(request)
        if request.method == "GET":
            return await self._confirm_page(request, slug, "deny")
        form = request.state.form
        reason = form.get("reason", "").strip()
        if not reason:
            raise FormError(400, "a denial needs a reason")
        outcome = await actions.deny(self.memory, slug, base_of(form), reason)
        return self._after(request, slug, outcome)

    async def restore(self, request: Request) -> Response:
        slug = self.slug_of(request)
        source = request.query_params if request.method == "GET" else request.state.form
        rev = source.get("rev", "")
        if request.method == "GET":
            return await self._confirm_page(request, slug, "restore", rev=rev)
        force = request.state.form.get("force") == "yes"
        outcome = await actions.restore(self.memory, slug, rev, force=force)
        return self._after(request, slug, outcome, retry={"rev": rev})

    async def remove(self, request: Request) -> Response:
        return await self._ticked(request, "remove", actions.remove)

    async def forget(self, request: Request) -> Response:
        return await self._ticked(request, "forget", actions.forget)

    async def _ticked(
        self,
        request: Request,
        action: str,
        act: Callable[[AgentMemory, str, str | None], Awaitable[Outcome]],
    ) -> Response:
        """An action that asks first (GET: the confirmation page), then needs its box
        ticked; the optional reason goes with it."""
        slug = self.slug_of(request)
        if request.method == "GET":
            return await self._confirm_page(request, slug, action)
        form = request.state.form
        if form.get("confirm") != "yes":
            raise FormError(400, f"tick the confirmation box to {action} this memory")
        return self._after(
            request, slug, await act(self.memory, slug, form.get("reason", "").strip())
        )

    def _after(
        self, request: Request, slug: str, outcome: Outcome, retry: dict[str, str] | None = None
    ) -> Response:
        if outcome.ok:
            return self.to_memory(request, slug, outcome)
        return self.failure(request, outcome, retry)

    async def _confirm_page(
        self, request: Request, slug: str, action: str, rev: str = ""
    ) -> Response:
        """What the action would do, before it is done: the value now and, for a restore,
        the version to restore and its difference from the value now."""
        entry: Row | Entry | None = None
        version = diff = None
        if action == "restore":  # the value now and the version: one read of the history
            seen = await self.memory.inspect(slug)
            log = seen.log
            now = row_of(seen.live, self.memory.identity.conversation_key)
            entry = now if now is not None and now.live else None
            picked = [v for v in log.versions if v.id == rev] if log else []
            if log is None or not picked:
                raise FormError(404, f"{slug} has no version {rev or '(none given)'}")
            version = picked[0]
            text = timeline.text_of(log, version)
            if text is not None:
                diff = diff_lines(entry.value or "" if entry else "", text, budget=COMPARE_CHARS)
        else:
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
            value_base=actions.base_of(entry.value if entry else None),
            rev=rev,
            version=version,
            diff=diff,
        )
