"""`engram review` in a real browser: Debian's chromium, driven by Playwright for Python.

The owner's path through the page (the owner's key alone, `--agent`): open the printed
URL, find a memory by a word of its value, open it and read the difference between two of
its versions, correct it (diff preview, then save) and see, in separate agent processes
(`engram mem get`, the MCP server's `memory_get` through the `mcp` SDK client), the value
exactly as typed and marked as the owner's; deny another and see it gone from the agent's
`ls`, `search` and MCP; find it among the memories that are not live and restore an
earlier version; forget a third; a conflict with a newer version; the core graph and the
changes page; and the refusals (no token; a form posted from another origin, whose
`Origin` is `null`). Negative twins: the denied and the forgotten values appear on no
page, beside the live values that do.

Each test stands on its own (any order, any subset); the module shares one browser, one
relay, one memory and one review server (tests/conftest.py keeps it on one worker). Each
page gets a screenshot in `review-screenshots/` under pytest's base temporary directory
(`--basetemp`, or the path printed at the end of the module), or in
`$ENGRAM_REVIEW_SCREENSHOTS` when set.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from cli_support import ENGRAM, ROOT, Keys, engram_async, shared_relay
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from playwright.async_api import Browser, Locator, Page, async_playwright
from relay_fixtures import RelayProcess, until
from review_support import (
    ReviewProcess,
    every_page,
    launch_links,
    review_server,
    stand_in_browser,
)

from cli.memory import AgentMemory
from cli.nostr.identity import load_identity

# one worker runs the whole module: one browser, one relay, one review server
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.xdist_group("review-browser")]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
STEP_MS = 120_000  # outer bound for one browser step on a loaded machine (not asserted on)
CALL_BOUND = 120.0

CORRECTED = "Alice moved to Porto in 2024.\n  Ünïcode, <b>not bold</b> & trailing spaces  \n"
DENIED = "Bob is a plumber in Oslo."  # denied on the page: never on any page again
FORGOTTEN = "The door code is 4711."  # forgotten on the page: never on any page again
WRONG = "The moon is made of cheese."  # denied by the owner: never on any page


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("review-browser-relay")))


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.fresh()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("ENGRAM_REVIEW_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.getbasetemp() / "review-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
async def agent(relay: RelayProcess, keys: Keys) -> AgentMemory:
    """The agent's own memory, written before the owner opens the page."""
    env = {"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()}
    mem = AgentMemory(load_identity(None, keys.owner, None, env), relay.url, timeout=60)
    await mem.set(
        "core", "Test agent. People: [[mem/people/alice]], [[mem/people/bob]]. [[mem/old/x]]"
    )
    await mem.set("people/alice", "Alice lives in Berlin.\nShe works on [[mem/projects/atlas]].")
    await mem.set(
        "people/alice",
        "Alice lives in Lisbon.\nShe works on [[mem/projects/atlas]].",
        trust="stated",
        source="chat of 2024-05-01",
    )
    await mem.set("people/bob", "Bob fixes bikes in Oslo.")
    await mem.set("people/bob", DENIED)
    await mem.set("projects/atlas", "Atlas: a map of everything. Owner: [[mem/people/alice]].")
    await mem.set("notes/stray", "A stray note that nothing links to.")
    await mem.set("notes/race", "first version")
    await mem.set("notes/door", FORGOTTEN)
    return mem


@pytest.fixture(scope="module")
async def review(
    agent: AgentMemory, relay: RelayProcess, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ReviewProcess]:
    """The owner's page: the owner's key alone, naming the agent."""
    tmp = tmp_path_factory.mktemp("review-browser")
    async with review_server(
        keys.owner_env(relay.url), "--agent", keys.agent, log_dir=tmp, state_dir=tmp
    ) as server:
        yield server


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.fail("no chromium: install it (apt-get install -y chromium); .ci/run does")
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    opened = await context.new_page()
    opened.set_default_timeout(STEP_MS)
    try:
        yield opened
    finally:
        await context.close()


async def shot(page: Page, shots: Path, name: str) -> None:
    path = shots / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0


def owner_of(keys: Keys, relay: RelayProcess) -> AgentMemory:
    """The owner's own API (the owner's key alone), for setting up a verdict."""
    env = {"ENGRAM_PRIVATE_KEY": keys.owner_sk.hex()}
    return AgentMemory(load_identity(None, None, keys.agent, env), relay.url, timeout=60)


def row_of(page: Page, table: str, slug: str) -> Locator:
    """The row of `slug` in the list's table `table` (live or gone)."""
    link = page.get_by_role("link", name=slug, exact=True)
    return page.locator(f"table#{table} tbody tr").filter(has=link)


async def agent_get(keys: Keys, relay: RelayProcess, slug: str, *flags: str) -> tuple[int, bytes]:
    """`engram mem get` in a process of its own, with the agent's key."""
    done = await engram_async("mem", "get", slug, *flags, env=keys.agent_env(relay.url))
    return done.returncode, done.stdout


@contextlib.asynccontextmanager
async def mcp_agent(keys: Keys, relay: RelayProcess, log: Path) -> AsyncIterator[Client]:
    """The agent's MCP server (`engram mcp`, stdio) seen through the SDK's own client."""
    params = StdioServerParameters(
        command=ENGRAM[0], args=[*ENGRAM[1:], "mcp"], env=keys.agent_env(relay.url), cwd=ROOT
    )
    with open(log, "a") as errlog:
        async with Client(
            stdio_client(params, errlog=errlog), read_timeout_seconds=CALL_BOUND
        ) as client:
            yield client


# --- tests ------------------------------------------------------------------------------------


async def test_find_read_the_history_and_correct_as_the_owner(
    page: Page, review: ReviewProcess, shots: Path, keys: Keys, relay: RelayProcess, tmp_path: Path
) -> None:
    opened = await page.goto(review.url)
    assert opened is not None and opened.status == 200
    await page.get_by_role("link", name="mem/people/alice").wait_for()
    alice_row = row_of(page, "live", "mem/people/alice")
    assert "stated" in await alice_row.inner_text()  # trust, by whom, audit
    assert "agent" in await alice_row.inner_text() and "clean" in await alice_row.inner_text()
    await shot(page, shots, "01-list")

    await page.get_by_label("Find a memory by what it says").fill("lisbon")
    await page.get_by_role("button", name="Search").click()
    rows = page.locator("table.memories tbody tr")
    await page.wait_for_url("**/?q=lisbon")
    assert await rows.count() == 1
    assert "Alice lives in Lisbon." in await rows.first.inner_text()
    await shot(page, shots, "02-search")

    await page.get_by_role("link", name="mem/people/alice").click()
    await page.wait_for_url("**/m/mem/people/alice")
    value = await page.locator("#value").inner_text()
    assert value.startswith("Alice lives in Lisbon.")
    referenced = page.locator("section.refs")
    assert "mem/projects/atlas" in await referenced.inner_text()  # both ways: links and back
    # the history: two versions, each by the agent, the newest with its difference
    versions = page.locator("#timeline > li")
    assert await versions.count() == 2
    newest = versions.first
    assert "source: chat of 2024-05-01" in await newest.inner_text()
    assert "-Alice lives in Berlin." in await newest.locator("span.del").all_inner_texts()
    assert "+Alice lives in Lisbon." in await newest.locator("span.add").all_inner_texts()
    # ... and any two compared: the oldest to the newest
    await versions.nth(1).get_by_label("from").check()
    await versions.first.get_by_label("to").check()
    await page.get_by_role("button", name="Compare the two versions picked").click()
    compared = page.locator("#compare-diff")
    await compared.wait_for()
    assert "-Alice lives in Berlin." in await compared.locator("span.del").all_inner_texts()
    await shot(page, shots, "03-memory-history")

    await page.locator("#value-edit").fill(CORRECTED)
    await page.get_by_role("button", name="Preview the correction").click()
    diff = page.locator("#diff")
    await diff.wait_for()
    assert "+Alice moved to Porto in 2024." in await diff.locator("span.add").all_inner_texts()
    assert "-Alice lives in Lisbon." in await diff.locator("span.del").all_inner_texts()
    await shot(page, shots, "04-preview")

    await page.get_by_role("button", name="Save this correction").click()
    await page.locator("#readback").wait_for()
    readback = " ".join((await page.locator("#readback").inner_text()).split())
    assert "serve the version just written" in readback
    assert "reads as the owner's value, confirmed" in readback
    assert "Saved" in await page.locator("#outcome").inner_text()
    assert "corrected by the owner" in await page.locator("#timeline > li").first.inner_text()
    await shot(page, shots, "05-saved")

    code, out = await agent_get(keys, relay, "people/alice")
    assert code == 0 and out == CORRECTED.encode()
    code, out = await agent_get(keys, relay, "people/alice", "--json")
    got_json = json.loads(out)
    assert (got_json["role"], got_json["trust"], got_json["author"]) == (
        "owner",
        "confirmed",
        keys.owner,
    )
    async with mcp_agent(keys, relay, tmp_path / "mcp.log") as client:
        got = await client.call_tool("memory_get", {"slug": "people/alice"})
        assert not got.is_error and got.structured_content is not None
        assert got.structured_content["value"] == CORRECTED
        assert got.structured_content["role"] == "owner"


async def test_deny_find_it_again_and_restore_an_earlier_version(
    page: Page, review: ReviewProcess, shots: Path, keys: Keys, relay: RelayProcess, tmp_path: Path
) -> None:
    await page.goto(review.at("m/mem/people/bob"))
    await page.get_by_role("link", name="Deny…").click()
    await page.wait_for_url("**/act/deny/mem/people/bob")
    await page.get_by_label("Why is it wrong?").fill("he fixes bikes")
    await shot(page, shots, "06-deny-confirm")
    await page.get_by_role("button", name="Deny").click()
    await page.locator("#value-absent").wait_for()
    assert "Denied" in await page.locator("#outcome").inner_text()
    readback = " ".join((await page.locator("#readback").inner_text()).split())
    assert "just written: mem/people/bob reads as denied by the owner" in readback
    assert "he fixes bikes" in await page.locator("#value-absent").inner_text()
    await shot(page, shots, "07-denied")

    env = keys.agent_env(relay.url)
    listed = await engram_async("mem", "ls", env=env)
    assert listed.returncode == 0 and b"mem/people/bob" not in listed.stdout
    assert b"mem/people/alice" in listed.stdout  # the positive twin
    found = await engram_async("mem", "search", "oslo", env=env)
    assert found.returncode == 0 and found.stdout == b""
    assert (await engram_async("mem", "search", "everything", env=env)).stdout != b""  # twin
    code, _ = await agent_get(keys, relay, "people/bob")
    assert code == 1
    async with mcp_agent(keys, relay, tmp_path / "mcp.log") as client:
        listed_mcp = await client.call_tool("memory_list", {})
        slugs = {m["slug"] for m in listed_mcp.structured_content["memories"]}  # type: ignore[index]
        assert "mem/people/bob" not in slugs and "mem/people/alice" in slugs
        hits = await client.call_tool("memory_search", {"query": "oslo"})
        assert hits.structured_content["matches"] == []  # type: ignore[index]
        gone = await client.call_tool("memory_get", {"slug": "people/bob"})
        assert gone.is_error

    # the owner finds it again: not among the live memories, but in a view of its own
    await page.goto(review.url)
    assert await row_of(page, "live", "mem/people/bob").count() == 0
    await page.get_by_role("link", name="Removed, denied or forgotten", exact=True).click()
    row = row_of(page, "gone", "mem/people/bob")
    await row.wait_for()
    assert "denied by the owner" in await row.inner_text()
    assert "he fixes bikes" in await row.inner_text()
    await shot(page, shots, "08-not-live")

    # ... and restores the version before the one it denied
    await row.get_by_role("link", name="mem/people/bob").click()
    await page.wait_for_url("**/m/mem/people/bob")
    versions = page.locator("#timeline > li")
    assert await versions.count() == 3  # the denial, the withheld value, the first value
    assert "not shown" in await versions.nth(1).inner_text()
    oldest = versions.nth(2)
    assert "Bob fixes bikes in Oslo." in await oldest.inner_text()
    await oldest.get_by_role("link", name="Restore this version…").click()
    await page.wait_for_url("**/act/restore/mem/people/bob?rev=*")
    assert "+Bob fixes bikes in Oslo." in await page.locator("#diff span.add").all_inner_texts()
    await shot(page, shots, "09-restore-confirm")
    await page.get_by_role("button", name="Restore").click()
    await page.locator("#readback").wait_for()
    assert "Restored" in await page.locator("#outcome").inner_text()
    assert await page.locator("#value").inner_text() == "Bob fixes bikes in Oslo."
    await shot(page, shots, "10-restored")
    code, out = await agent_get(keys, relay, "people/bob")
    assert code == 0 and out == b"Bob fixes bikes in Oslo."


async def test_forget_and_no_page_shows_a_denied_or_forgotten_value(
    page: Page, review: ReviewProcess, keys: Keys, relay: RelayProcess, agent: AgentMemory
) -> None:
    await agent.set("notes/moon", WRONG)
    await owner_of(keys, relay).deny("notes/moon", reason="it is not")
    await page.goto(review.at("m/mem/notes/door"))
    await page.get_by_role("link", name="Forget everywhere…").click()
    await page.get_by_label("Yes, forget mem/notes/door").check()
    await page.get_by_role("button", name="Forget everywhere").click()
    await page.locator("#value-absent").wait_for()
    assert "Forgotten" in await page.locator("#outcome").inner_text()
    code, _ = await agent_get(keys, relay, "notes/door")
    assert code == 1

    pages = await every_page(review)
    assert "m/mem/notes/door" in pages and "m/mem/notes/moon" in pages
    everything = "\n".join(pages.values())
    assert WRONG not in everything and FORGOTTEN not in everything  # on no page at all
    assert "Atlas: a map of everything." in pages[""]  # the positive twins
    assert "Atlas: a map of everything." in pages["m/mem/projects/atlas"]
    gone = pages["?show=gone"]
    assert "mem/notes/door" in gone and "forgotten" in gone
    assert "mem/notes/moon" in gone and "it is not" in gone
    live = re.findall(r'<td class="slug"><a [^>]*>([^<]+)</a>', pages[""])
    assert "mem/notes/door" not in live and "mem/notes/moon" not in live
    assert "mem/projects/atlas" in live


async def test_the_edit_box_holds_the_value_exactly(
    page: Page, review: ReviewProcess, agent: AgentMemory
) -> None:
    # leading blank lines (an HTML parser drops the first newline of a textarea), markup,
    # trailing spaces and newlines: all in the box as stored, so an untouched box is no change
    exact = "\n\nleading blank lines, <b>&amp; markup</b>\n  trailing  \n\n"
    await agent.set("notes/exact", exact)
    await page.goto(review.at("m/mem/notes/exact"))
    assert await page.locator("#value-edit").input_value() == exact
    await page.get_by_role("button", name="Preview the correction").click()
    assert "No difference" in await page.locator("#diff").inner_text()


async def test_a_newer_version_is_a_conflict_on_the_page(
    page: Page, review: ReviewProcess, shots: Path, keys: Keys, relay: RelayProcess
) -> None:
    await page.goto(review.at("m/mem/notes/race"))
    await page.locator("#value-edit").fill("the page's version")
    await page.get_by_role("button", name="Preview the correction").click()
    await page.locator("#diff").wait_for()
    written = await engram_async(
        "mem", "set", "notes/race", "the agent's newer version", env=keys.agent_env(relay.url)
    )
    assert written.returncode == 0, written.stderr
    async with page.expect_response(lambda r: "/act/save/" in r.url) as caught:
        await page.get_by_role("button", name="Save this correction").click()
    response = await caught.value
    assert response.status == 409
    outcome = await page.locator("#outcome").inner_text()
    assert "Conflict" in outcome and "changed after this page showed it" in outcome
    assert "the agent's newer version" in await page.locator("#diff").inner_text()
    assert await page.locator("#value-edit").input_value() == "the page's version"
    await shot(page, shots, "11-conflict")
    code, out = await agent_get(keys, relay, "notes/race")
    assert code == 0 and out == b"the agent's newer version"


async def test_core_graph_and_changes(page: Page, review: ReviewProcess, shots: Path) -> None:
    await page.goto(review.at("core"))
    graph = page.locator("svg#graph")
    await graph.wait_for()
    assert await graph.locator("a.node.core").count() == 1
    assert await graph.locator("a.node.orphan").count() >= 1  # notes/stray
    assert await graph.locator("a.node.dangling").count() >= 1  # mem/old/x
    box = await graph.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 60  # drawn, not empty
    await shot(page, shots, "12-core-graph")
    await graph.locator("a.node.orphan", has_text="mem/notes/stray").click()
    await page.wait_for_url("**/m/mem/notes/stray")

    await page.goto(review.at("changes"))
    await page.locator("table.changes").wait_for()
    assert "mem/people/alice" in await page.locator("table.changes").inner_text()
    await shot(page, shots, "13-changes")
    await page.get_by_role("button", name="Mark all as seen").click()
    await page.locator("#no-changes").wait_for()


async def test_refused_without_token_or_from_another_origin(
    page: Page, review: ReviewProcess, shots: Path
) -> None:
    refused = await page.goto(review.origin + "/")
    assert refused is not None and refused.status == 403
    assert "needs the URL" in await page.inner_text("body")
    await shot(page, shots, "14-no-token")
    # A page elsewhere (here a data: URL, whose origin is opaque) posting a form to the app,
    # even knowing the token: Chromium sends `Origin: null`, the app refuses it.
    target = review.at("act/forget/mem/people/alice")
    form = (
        f'<form method="post" action="{target}"><input name="confirm" value="yes">'
        '<button id="go">go</button></form>'
    )
    await page.goto("data:text/html," + form)
    async with page.expect_response(lambda r: r.url == target) as caught:
        await page.click("#go")
    assert (await caught.value).status == 403
    assert "another origin (null)" in await page.inner_text("body")
    # ... and the memory is still there
    await page.goto(review.at("m/mem/people/alice"))
    assert await page.locator("#value").count() == 1


async def test_open_launches_the_browser_once_on_a_cookie(
    page: Page, relay: RelayProcess, keys: Keys, agent: AgentMemory, tmp_path: Path, shots: Path
) -> None:
    """`--open` (through a stand-in `BROWSER` that records its argv): the link it was given
    holds no token; Chromium following it lands on the page, keeps its session in the
    cookie through links and a form, and the same link a second time is refused."""
    script, record = stand_in_browser(tmp_path)
    env = keys.owner_env(relay.url) | {"BROWSER": str(script)}
    async with review_server(
        env, "--open", "--agent", keys.agent, log_dir=tmp_path, state_dir=tmp_path
    ) as server:
        await until(record.exists, "the stand-in browser ran")
        assert server.token not in record.read_text()
        (link,) = launch_links(record.read_text())
        opened = await page.goto(link)
        assert opened is not None and opened.status == 200
        assert page.url == server.origin + "/"  # no token in the address bar either
        await page.get_by_role("link", name="mem/projects/atlas").click()
        await page.wait_for_url(server.origin + "/m/mem/projects/atlas")
        assert "Atlas: a map" in await page.locator("#value").inner_text()
        await page.locator("#value-edit").fill("Atlas: a map of everything, corrected.")
        await page.get_by_role("button", name="Preview the correction").click()
        assert (
            "+Atlas: a map of everything, corrected."
            in await page.locator("#diff span.add").all_inner_texts()
        )  # a POST on the cookie, with its CSRF field
        cookies = await page.context.cookies()
        (cookie,) = [c for c in cookies if c["name"] == f"engram_review_{server.port}"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["domain"] == "127.0.0.1" and cookie["path"] == "/"
        again = await page.goto(link)
        assert again is not None and again.status == 403
        assert "used already" in await page.inner_text("body")
        await shot(page, shots, "15-launch-link-used")
