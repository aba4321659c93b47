"""The review app's pure parts: differences, the graph's layout, the visit mark and its
changes, CSRF fields. No relay, no server: the whole app is tested in test_review_http.py
and test_review_browser.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import msgspec

from cli.memory.api import Log, SetReport, VersionInfo, sha256_hex
from cli.memory.review import diffs
from cli.memory.review.diffs import DiffLine, diff_lines, normalize_newlines
from cli.memory.review.graph import BOX_W, COL_GAP, MAX_EDGES, MAX_NODES, layout
from cli.memory.review.guard import LAUNCH_KEEP, LAUNCH_TTL, Csrf, Guard
from cli.memory.review.listing import ListQuery, select
from cli.memory.review.pages import Paged, number
from cli.memory.review.snapshot import Row, Snapshot
from cli.memory.review.timeline import DIFF_CHARS, EXCERPT_CHARS, PAGE, build, compare, full_value
from cli.memory.review.visits import Mark, changes, load, mark_path, save
from engram import CORE_SLUG


def row(
    slug: str, value: str | None, event: str = "e", at: int = 1, state: str | None = None, **kw: Any
) -> Row:
    state = state or ("live" if value is not None else "removed")
    return Row(slug, value, event + slug, at, "a" * 64, "agent", "d-" + slug, state=state, **kw)


def snapshot(values: dict[str, str | None]) -> Snapshot:
    live = {s: row(s, v) for s, v in values.items() if v is not None and s != CORE_SLUG}
    removed = {s: row(s, None) for s, v in values.items() if v is None}
    core = row(CORE_SLUG, values[CORE_SLUG]) if values.get(CORE_SLUG) else None
    return Snapshot(live, core, removed, SetReport())


def test_line_endings_become_lf_and_nothing_else_changes() -> None:
    assert normalize_newlines("a\r\nb\rc\n\r\n  x  \t") == "a\nb\nc\n\n  x  \t"
    assert normalize_newlines("") == ""


def test_diff_lines_show_changes_and_a_missing_final_newline() -> None:
    assert diff_lines("same\n", "same\n") == []
    lines = diff_lines("one\ntwo\n", "one\nTWO")
    kinds = [(d.kind, d.text) for d in lines]
    assert kinds[0][0] == "hunk"
    assert ("del", "two") in kinds and ("add", "TWO") in kinds
    assert kinds[-1] == ("note", "\\ No newline at end of value")
    # only the final newline changed: still visible
    assert [d.kind for d in diff_lines("x\n", "x")] == ["hunk", "del", "add", "note"]


def test_graph_places_core_by_distance_orphans_and_dangling() -> None:
    snap = snapshot(
        {
            CORE_SLUG: "see [[mem/a]] and [[mem/gone]]",
            "mem/a": "to [[mem/b]]",
            "mem/b": "back to [[mem/a]] and [[mem/removed]]",
            "mem/lonely": "nobody links here",
            "mem/removed": None,
        }
    )
    pic = layout(snap)
    where = {n.slug: n for n in pic.nodes}
    col = BOX_W + COL_GAP
    assert where[CORE_SLUG].kind == "core" and where[CORE_SLUG].x == 10
    assert (where["mem/a"].x, where["mem/b"].x) == (10 + col, 10 + 2 * col)
    assert where["mem/lonely"].kind == "orphan" and where["mem/lonely"].x == 10 + 3 * col
    assert {where["mem/gone"].kind, where["mem/removed"].kind} == {"dangling"}
    assert [t for _, t in pic.titles][-1].startswith("dangling")
    kinds = sorted(e.kind for e in pic.edges)
    assert kinds == ["dangling", "dangling", "link", "link", "link"]
    # a link to the next column is a curve; a backward one goes round the boxes (lanes)
    back = [e.path for e in pic.edges if e.kind == "link" and " H" in e.path]
    assert len(back) == 1
    bottom = max(n.y for n in pic.nodes)
    assert all(int(p.split(" V")[1].split()[0]) > bottom for p in back)
    assert pic.shown == pic.total == 6 and pic.width > 4 * col and pic.height > bottom


def test_graph_without_core_draws_everything_as_orphans() -> None:
    pic = layout(snapshot({"mem/x": "[[mem/y]]", "mem/y": "y"}))
    kinds = {n.slug: n.kind for n in pic.nodes}
    assert kinds == {CORE_SLUG: "dangling", "mem/x": "orphan", "mem/y": "orphan"}
    assert pic.titles[0][1] == "no core"


def test_changes_since_a_mark(tmp_path: Path) -> None:
    before = snapshot({CORE_SLUG: "c", "mem/a": "a", "mem/b": "b", "mem/c": "c"})
    mark = Mark.of(before, 100)
    after = Snapshot(
        {
            "mem/a": before.live["mem/a"],
            "mem/b": row("mem/b", "b2", event="f", at=5),
            "mem/new": row("mem/new", "n", at=9),
        },
        before.core,
        {"mem/c": row("mem/c", None, event="t"), "mem/a2": row("mem/a2", None, state="denied")},
        SetReport(),
    )
    mark.heads["d-mem/a2"] = ("emem/a2", 1)
    found = [(c.kind, c.slug) for c in changes(after, mark).items]
    assert found == [
        ("new", "mem/new"),
        ("changed", "mem/b"),
        ("denied", "mem/a2"),
        ("removed", "mem/c"),
    ]
    assert [c.kind for c in changes(after, None).items] == ["new"] * 4  # no visit: all new
    gone = Snapshot({}, None, {}, SetReport())
    assert {(c.kind, c.slug) for c in changes(gone, mark).items} == {("removed", None)}
    assert changes(gone, mark).unread == 0
    # a partial read (a relay failed, or was not read to the end) calls nothing gone that
    # it did not find: those are counted; what it found (a tombstone) is still reported
    for report in (
        SetReport(failed={"ws://down": "connection refused"}),
        SetReport(incomplete={"ws://cut": "the relay ignores `until`"}),
    ):
        partial = Snapshot(after.live, after.core, after.gone, report)
        assert not partial.complete and after.complete
        got = changes(partial, mark)
        assert [(c.kind, c.slug) for c in got.items] == found and got.unread == 0
        nothing = changes(Snapshot({}, None, {}, report), mark)
        assert nothing.items == [] and nothing.unread == len(mark.heads)


def test_mark_file_is_private_and_round_trips(tmp_path: Path) -> None:
    path = mark_path("a" * 64, "b" * 64, True, tmp_path / "review")
    assert path != mark_path("a" * 64, "b" * 64, False, tmp_path / "review")
    mark = Mark(123, {"d1": ("e1", 5), "d2": ("e2", 6)})
    old = os.umask(0)
    try:
        save(path, mark)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load(path) == mark
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    path.write_text("{not json")
    assert load(path) is None  # a damaged mark starts over instead of failing the page
    assert load(tmp_path / "absent.json") is None


def test_csrf_fields_are_per_action_and_per_server() -> None:
    one, two = Csrf(), Csrf()
    token = one.token("/act/save/mem/x")
    assert one.valid("/act/save/mem/x", token)
    assert not one.valid("/act/remove/mem/x", token)
    assert not two.valid("/act/save/mem/x", token)
    assert not one.valid("/act/save/mem/x", None) and not one.valid("/act/save/mem/x", "")


def test_launch_links_work_once_within_their_time() -> None:
    now = [1000.0]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    guard = Guard(app, "t" * 43, "127.0.0.1:5000", clock=lambda: now[0])

    def code(link: str) -> str:
        assert link.startswith("http://127.0.0.1:5000/launch/") and "t" * 43 not in link
        return link.rsplit("/", 1)[1]

    first, second, late = (code(guard.launch_link()) for _ in range(3))
    assert first != second
    assert guard.launch(first) is None  # once ...
    assert "used already" in (guard.launch(first) or "")  # ... and never again
    now[0] += LAUNCH_TTL - 1
    assert guard.launch(second) is None
    now[0] += 2  # `late` is older than LAUNCH_TTL now
    assert "used already, or is older than" in (guard.launch(late) or "")
    assert "not known" in (guard.launch("x" * 43) or "")
    assert "not known" in (guard.launch("ü") or "")  # not ASCII: refused, not an error
    # waiting codes are bounded: the oldest goes
    codes = [code(guard.launch_link()) for _ in range(LAUNCH_KEEP + 1)]
    assert guard.launch(codes[0]) is not None
    assert guard.launch(codes[-1]) is None


def test_list_filters_and_the_view_of_memories_that_are_not_live() -> None:
    now = 1_000
    live = {
        "mem/a": row("mem/a", "a", at=5, trust="guess", audit="clean"),
        "mem/b": row("mem/b", "b", at=9, trust="confirmed", audit="fork", valid_until=now - 1),
        "mem/c": row("mem/c", "c", at=7, trust="stated", audit="clean", valid_from=now + 9),
    }
    live["mem/b"] = Row(**{**live["mem/b"].__dict__, "role": "owner"})
    gone = {
        "mem/d": row("mem/d", None, state="denied", reason="wrong", audit="clean"),
        "mem/f": row("mem/f", None, state="forgotten"),
    }
    snap = Snapshot(live, row(CORE_SLUG, "core"), gone, SetReport())

    def slugs(**params: str) -> list[str]:
        return [r.slug for r in select(snap, ListQuery.of(params), now)]

    assert slugs() == [CORE_SLUG, "mem/a", "mem/b", "mem/c"]  # live only, core first
    assert slugs(sort="newest") == ["mem/b", "mem/c", "mem/a", CORE_SLUG]
    assert slugs(trust="confirmed") == ["mem/b"]
    assert slugs(trust="denied") == slugs()  # not a live state: ignored, never a way in
    assert slugs(validity="ended") == ["mem/b"]
    assert slugs(validity="future") == ["mem/c"]
    assert slugs(validity="now") == [CORE_SLUG, "mem/a"]
    assert slugs(by="owner") == ["mem/b"]
    assert slugs(audit="problem") == ["mem/b"] and slugs(audit="clean") == ["mem/a", "mem/c"]
    assert slugs(show="gone") == ["mem/d", "mem/f"]  # never among the live ones
    assert all(r.value is None for r in select(snap, ListQuery(show="gone"), now))
    assert slugs(show="gone", contains="D") == ["mem/d"]
    assert slugs(q="x") == slugs()  # the page passes what the search found:
    assert [r.slug for r in select(snap, ListQuery(q="x"), now, ["mem/c", "mem/d"])] == ["mem/c"]
    assert ListQuery.of({"trust": "<b>", "sort": "x", "show": "all"}) == ListQuery()


def version(vid: str, state: str, role: str = "agent", text: str | None = None, **kw: Any) -> Any:
    fields = dict(
        id=vid * 64, created_at=int(vid, 16), author="a" * 64, role=role, trust=None,
        source=None, valid_from=None, valid_until=None, prev=None, reason=None, plain=False,
    )  # fmt: skip
    fields.update(kw)
    return VersionInfo(
        value_sha256=sha256_hex(text) if text is not None else None, state=state, **fields
    )


def test_timeline_diffs_each_version_and_never_a_withheld_value() -> None:
    texts = {"1": "Bob fixes bikes.\n", "2": "Bob is a plumber.\n", "4": "Bob fixes bikes.\n"}
    versions = [
        version("4", "value", "owner", texts["4"], trust="confirmed", source="revert of 1111"),
        version("3", "denied", "owner", reason="wrong"),
        version("2", "withheld", "agent", texts["2"]),
        version("1", "value", "agent", texts["1"], trust="guess"),
    ]
    values = {"4" * 64: texts["4"], "1" * 64: texts["1"]}  # as Log.values: never the withheld
    log = Log("mem/bob", versions, SetReport(), values)
    items = build(log, live_sha256=sha256_hex(texts["4"]), owner=True).items
    assert [i.what for i in items] == [
        "restored by the owner (an earlier version's value)",
        "denied by the owner",
        "written by the agent; the owner denied this value (it is not shown)",
        "written by the agent",
    ]
    restored, denied, withheld, first = items
    assert [(d.kind, d.text) for d in restored.diff or [] if d.kind == "add"] == [
        ("add", "Bob fixes bikes.")
    ]  # from the denial (no value) to the restored value
    assert denied.diff is None and withheld.diff is None and "never shown" in denied.why_no_diff
    assert first.diff is None and first.text == texts["1"]
    assert withheld.text is None and withheld.withheld
    # restorable: not the value live now; the withheld one by the owner only
    assert [i.restorable for i in items] == [False, False, True, False]
    agent = build(log, live_sha256=None, owner=False).items
    assert [i.restorable for i in agent] == [True, False, False, True]
    both = compare(log, "1" * 64, "4" * 64)
    assert both is not None and both.diff == [] and both.note == "the same value"
    hidden = compare(log, "2" * 64, "4" * 64)
    assert hidden is not None and hidden.diff is None
    assert compare(log, "9" * 64, "4" * 64) is None


def applied(old: str, lines: list[DiffLine]) -> str:
    """`old` with the hunks of `lines` applied: the new value, if the diff is right."""
    a = old.splitlines(keepends=True)
    out: list[str] = []
    pos = i = 0
    while i < len(lines):
        hunk = diffs.HUNK.fullmatch(lines[i].text)
        assert lines[i].kind == "hunk" and hunk, lines[i]
        start = int(hunk[1]) - 1 if hunk[2] is None or int(hunk[2]) > 0 else int(hunk[1])
        out += a[pos:start]
        pos, i = start, i + 1
        while i < len(lines) and lines[i].kind != "hunk":
            line = lines[i]
            newline = "" if i + 1 < len(lines) and lines[i + 1].kind == "note" else "\n"
            if line.kind == "same":
                out.append(a[pos])
                pos += 1
            elif line.kind == "del":
                pos += 1
            elif line.kind == "add":
                out.append(line.text + newline)
            i += 1
    return "".join(out + a[pos:])


def test_diffs_are_right_on_both_paths_and_bounded() -> None:
    import random

    rng = random.Random(46)
    for _ in range(400):
        words = [f"w{j}" for j in range(rng.choice([2, 5, 20]))]

        def text(n: int, words: list[str] = words) -> str:
            body = "\n".join(rng.choice(words) for _ in range(n))
            return body + ("\n" if rng.random() < 0.5 else "")

        old, new = text(rng.randint(0, 30)), text(rng.randint(0, 30))
        if old == new:
            continue
        assert applied(old, diff_lines(old, new)) == new  # matched line by line
        cut = diffs.MATCH_LINES
        try:
            diffs.MATCH_LINES = 3  # the middle shown as replaced
            assert applied(old, diff_lines(old, new)) == new
        finally:
            diffs.MATCH_LINES = cut
    # 50 KB of short lines, all different: bounded by the budget, the rest counted
    many = "\n".join(f"{i:x}" for i in range(9000))
    other = "\n".join(f"{i:x}." for i in range(9000))
    got = diff_lines(many, other, budget=4000)
    assert sum(len(d.text) + 1 for d in got[:-1]) <= 4000 and got[-1].kind == "more"
    shown = sum(d.kind in ("add", "del", "same") for d in got)
    assert got[-1].text == f"… {18000 - shown:,} more lines not shown here"
    # one long line: cut, both sides shown
    long = diff_lines("x" * 50_000, "y" * 50_000, budget=4000)
    assert [d.kind for d in long] == ["hunk", "del", "note", "add", "note"]
    assert all(len(d.text) < 1100 for d in long) and "49,000 more characters" in long[1].text
    assert diff_lines("x" * 50_000, "y" * 50_000)[1].text == "x" * 50_000  # no budget: all


def test_pages_clamp_and_count() -> None:
    assert [number(n) for n in (None, "", "0", "-1", "2", "x", "9" * 7)] == [1, 1, 1, 1, 2, 1, 1]
    rows = list(range(45))
    page = Paged.of(rows, 3, 20)
    assert (page.rows, page.start, page.total, page.pages) == (rows[40:], 40, 45, 3)
    assert Paged.of(rows, 99, 20).page == 3 and Paged.of([], 5, 20).rows == []


def test_timeline_is_drawn_a_page_at_a_time_with_values_folded() -> None:
    """45 versions of long values: a page holds PAGE of them, each value's start and a
    bounded difference; the whole value of one version on demand; never a withheld one."""

    def numbered(i: int, state: str, text: str) -> VersionInfo:
        v = version("1", state, text=text)
        return msgspec.structs.replace(v, id=f"{i:064x}", created_at=i)

    texts = {i: "\n".join(f"line {j} of {i}" for j in range(4000)) for i in range(1, 46)}
    versions = [numbered(i, "withheld" if i == 42 else "value", texts[i]) for i in range(45, 0, -1)]
    values = {v.id: texts[v.created_at] for v in versions if v.state == "value"}
    log = Log("mem/long", versions, SetReport(), values)
    first = build(log, live_sha256=None, owner=True)
    assert len(first.items) == PAGE and first.paged.total == 45 and first.paged.pages == 3
    for item in first.items:
        assert item.text is None or (len(item.text) <= EXCERPT_CHARS and item.folded)
        assert item.diff is None or sum(len(d.text) for d in item.diff) <= DIFF_CHARS + 100
    last = build(log, live_sha256=None, owner=True, page=3)
    assert [i.version.id for i in last.items] == [v.id for v in versions[40:]]
    assert last.items[-1].why_no_diff == "the first version recorded"
    assert build(log, live_sha256=None, owner=True, page=7).paged.page == 3
    whole = full_value(log, versions[0].id)
    assert whole is not None and whole[1] == texts[45]
    assert versions[3].state == "withheld" and full_value(log, versions[3].id) is None
    assert first.items[3].text is None  # never shown, not even its start
    assert full_value(log, "f" * 64) is None


def test_core_graph_of_many_interlinked_memories_is_drawn_in_part() -> None:
    """400 memories each linking to every other: at most MAX_NODES boxes and MAX_EDGES
    links drawn, every link counted."""
    slugs = [f"mem/m{i}" for i in range(400)]
    values: dict[str, str | None] = {s: " ".join(f"[[{t}]]" for t in slugs) for s in slugs}
    values[CORE_SLUG] = "[[mem/m0]]"
    pic = layout(snapshot(values))
    assert pic.shown == len(pic.nodes) == MAX_NODES < pic.total == 401
    assert len(pic.edges) == pic.links_shown == MAX_EDGES
    assert pic.links_total == 400 * 400 + 1
