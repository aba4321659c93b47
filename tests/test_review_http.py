"""`engram review` over plain HTTP (httpx): the door (token, Host, Origin, CSRF), the
headers, the pages' content and escaping, actions and their refusals, the visit mark, and
the server's stops (Ctrl-C, idle). A real `engram review` process on a real relay.

The browser's view of the same app is tests/test_review_browser.py.
"""

from __future__ import annotations

import asyncio
import re
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from cli_support import Keys, closed_port, shared_relay
from relay_fixtures import RelayProcess, free_port, proxied_env, until
from review_support import (
    REFUSAL,
    ReviewProcess,
    counting_relay,
    launch_links,
    refusing_relay,
    review_server,
    stand_in_browser,
    truncating_relay,
)

from cli.memory import AgentMemory, NotFoundError
from cli.memory.review.guard import CSP
from cli.nostr.identity import load_identity
from engram.nip19 import nsec

# one worker runs the whole module: one relay, one review server
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.xdist_group("review-http")]


@pytest.fixture(scope="module")
def proxy_port() -> int:
    """Where `refusing_relay` listens: one of the relay's public URLs, as a proxy's is."""
    return free_port()


@pytest.fixture(scope="module")
def relay(
    pg_server_url: str, tmp_path_factory: pytest.TempPathFactory, proxy_port: int
) -> Iterator[RelayProcess]:
    tmp = str(tmp_path_factory.mktemp("review-relay"))
    yield from shared_relay(pg_server_url, tmp, proxied_env(proxy_port))


def agent_memory(keys: Keys, relays: str) -> AgentMemory:
    env = {"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()}
    return AgentMemory(load_identity(None, keys.owner, None, env), relays, timeout=30)


def secrets_of(keys: Keys) -> list[str]:
    return [
        f for sk in (keys.agent_sk, keys.owner_sk) for f in (sk.hex(), sk.hex().upper(), nsec(sk))
    ]


def form_of(html: str, action: str) -> dict[str, str]:
    """The hidden fields (CSRF, base, rev, ...) of the form whose action ends with `action`."""
    form = re.search(rf'action="[^"]*{re.escape(action)}"[^>]*>(.*?)</form>', html, re.S)
    assert form, f"no form for {action}"
    fields = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', form[1])
    assert "csrf" in dict(fields)
    return dict(fields)


def csrf_of(html: str, action: str) -> str:
    """The CSRF field of the form whose action ends with `action`."""
    return form_of(html, action)["csrf"]


async def submit(
    http: httpx.AsyncClient, server: ReviewProcess, page: str, action: str, **fields: str
) -> httpx.Response:
    """As a person does: open `page`, fill the form of `action` (its hidden fields kept)."""
    html = (await http.get(server.at(page))).text
    data = form_of(html, f"/{action}") | fields
    return await http.post(server.at(action), data=data)


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.fresh()


@pytest.fixture(scope="module")
async def seeded(relay: RelayProcess, keys: Keys) -> AgentMemory:
    mem = agent_memory(keys, relay.url)
    await mem.set("core", "I am a test agent. See [[mem/people/alice]] and [[mem/gone]].")
    await mem.set(
        "people/alice", "Alice lives in Lisbon.\nShe likes <script>alert(1)</script> & tea."
    )
    await mem.set("people/bob", "Bob: orphan, nobody links here.")
    return mem


@pytest.fixture(scope="module")
async def review(
    seeded: AgentMemory, relay: RelayProcess, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ReviewProcess]:
    tmp = tmp_path_factory.mktemp("review-http")
    async with review_server(
        keys.agent_env(relay.url), log_dir=tmp, state_dir=tmp / "data"
    ) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=120, follow_redirects=False) as client:
        yield client


# --- the door --------------------------------------------------------------------------------


async def test_printed_url_is_loopback_with_a_token(review: ReviewProcess) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/t/[A-Za-z0-9_-]{43}/", review.url)


async def test_everything_without_the_token_is_refused(
    review: ReviewProcess, http: httpx.AsyncClient
) -> None:
    origin = review.origin
    for path in (
        "/",
        "/m/mem/people/alice",
        "/t/",
        "/t/wrong/",
        f"/t/{review.token}x/",
        f"/x/{review.token}/",
        "/static/review.css",
        "/favicon.ico",
    ):
        r = await http.get(origin + path)
        assert r.status_code == 403, path
        assert "Alice" not in r.text and "Lisbon" not in r.text
        assert r.headers["content-security-policy"] == CSP
    r = await http.post(origin + "/act/save/mem/people/alice", data={"value": "x"})
    assert r.status_code == 403


async def test_other_host_origin_or_site_is_refused(
    review: ReviewProcess, http: httpx.AsyncClient
) -> None:
    url = review.url
    ok = await http.get(url)
    assert ok.status_code == 200 and "mem/people/alice" in ok.text
    for host in ("localhost:" + str(review.port), "evil.example", "127.0.0.1", "127.0.0.1:1"):
        assert (await http.get(url, headers={"Host": host})).status_code == 403, host
    for origin in ("http://evil.example", "null", "http://localhost:" + str(review.port)):
        r = await http.get(url, headers={"Origin": origin})
        assert r.status_code == 403, origin
        assert "Lisbon" not in r.text
    for site in ("cross-site", "same-site"):
        assert (await http.get(url, headers={"Sec-Fetch-Site": site})).status_code == 403
    same = {"Origin": review.origin, "Sec-Fetch-Site": "same-origin"}
    assert (await http.get(url, headers=same)).status_code == 200
    assert (await http.get(url, headers={"Sec-Fetch-Site": "none"})).status_code == 200


async def test_open_gives_the_browser_a_one_time_link_never_the_token(
    relay: RelayProcess, keys: Keys, seeded: AgentMemory, tmp_path: Path
) -> None:
    """`--open` starts `BROWSER` (here a stand-in that records its argv, as `ps` shows it
    to every account) with a launch link: no token in it, good for one use, after which the
    browser holds an HttpOnly, SameSite=Strict cookie the page takes instead of the token.
    Every other check of the door holds for the cookie; the printed URL keeps working."""
    script, record = stand_in_browser(tmp_path)
    env = keys.agent_env(relay.url) | {"BROWSER": str(script)}
    async with review_server(
        env, "--open", log_dir=tmp_path, state_dir=tmp_path / "data"
    ) as server:
        await until(record.exists, "the stand-in browser ran")
        argv = record.read_text()
        assert server.token not in argv
        links = launch_links(argv)
        assert len(links) == 1 and links[0].startswith(server.origin + "/launch/"), argv
        async with httpx.AsyncClient(timeout=120) as browser:
            first = await browser.get(links[0])
            assert first.status_code == 303 and first.headers["location"] == "/"
            cookie = first.headers["set-cookie"]
            attributes = {a.strip().lower() for a in cookie.split(";")[1:]}
            assert attributes == {"path=/", "httponly", "samesite=strict"}  # host-only
            name, value = cookie.split(";")[0].split("=", 1)
            assert value == server.token and name == f"engram_review_{server.port}"
            page = await browser.get(server.origin + "/")  # the client's jar sends it
            assert page.status_code == 200 and "mem/people/alice" in page.text
            assert 'href="/m/mem/people/alice"' in page.text  # links stay on the cookie
            bob = await browser.get(server.origin + "/m/mem/people/bob")
            assert bob.status_code == 200 and "Bob: orphan" in bob.text
            # an action on the cookie: its CSRF field is still needed, and works
            target = server.origin + "/act/preview/mem/people/bob"
            fields = form_of(bob.text, "/act/preview/mem/people/bob") | {"value": "x"}
            no_csrf = {k: v for k, v in fields.items() if k != "csrf"}
            assert (await browser.post(target, data=no_csrf)).status_code == 403
            assert (await browser.post(target, data=fields)).status_code == 200
            evil = {"Origin": "http://evil.example"}
            assert (await browser.post(target, data=fields, headers=evil)).status_code == 403
            for headers in ({"Host": "localhost:" + str(server.port)}, evil,
                            {"Sec-Fetch-Site": "cross-site"}):  # fmt: skip
                r = await browser.get(server.origin + "/", headers=headers)
                assert r.status_code == 403 and "Lisbon" not in r.text, headers
            # the link is spent: a second use is refused and sets nothing
            again = await browser.get(links[0])
            assert again.status_code == 403 and "used already" in again.text
            assert "set-cookie" not in again.headers
        async with httpx.AsyncClient(timeout=120) as stranger:  # no cookie, or a wrong one
            for jar in ("", f"{name}={'x' * len(value)}", f"engram_review_1={value}"):
                r = await stranger.get(server.origin + "/", headers={"Cookie": jar})
                assert r.status_code == 403 and "Lisbon" not in r.text, jar
            r = await stranger.get(links[0])
            assert r.status_code == 403 and "set-cookie" not in r.headers
            # the printed URL still works, and stderr names another link, good once too
            assert (await stranger.get(server.url)).status_code == 200
            await until(lambda: launch_links(server.log()), "the server named its link")
            printed = launch_links(server.log())
            assert len(printed) == 1 and printed[0] != links[0]
            assert (await stranger.get(printed[0])).status_code == 303
            assert (await stranger.get(printed[0])).status_code == 403
            assert (await stranger.get(server.origin + "/launch/x")).status_code == 403


async def test_headers_forbid_script_framing_and_remote_content(
    review: ReviewProcess, http: httpx.AsyncClient
) -> None:
    r = await http.get(review.url)
    h = r.headers
    assert h["content-security-policy"] == CSP
    assert "default-src 'none'" in CSP and "script-src" not in CSP and "unsafe" not in CSP
    assert h["x-frame-options"] == "DENY" and h["referrer-policy"] == "same-origin"
    assert h["cache-control"] == "no-store" and h["x-content-type-options"] == "nosniff"
    assert "<script" not in r.text.replace("&lt;script&gt;", "")
    assert not re.search(r'(src|href)="(https?:)?//', r.text)  # nothing from elsewhere
    bare = await http.get(review.url.rstrip("/"))
    assert bare.status_code == 308 and bare.headers["location"] == f"/t/{review.token}/"


async def test_actions_need_their_own_csrf_field(
    review: ReviewProcess, http: httpx.AsyncClient
) -> None:
    page = (await http.get(review.at("m/mem/people/bob"))).text
    token = csrf_of(page, "/act/preview/mem/people/bob")
    form = {"value": "changed", "base": "0" * 64}
    target = review.at("act/preview/mem/people/bob")
    assert (await http.post(target, data=form)).status_code == 403
    assert (await http.post(target, data=form | {"csrf": "0" * 64})).status_code == 403
    other = review.at("act/save/mem/people/bob")  # a valid field, for another action
    assert (await http.post(other, data=form | {"csrf": token})).status_code == 403
    null = {"Origin": "null"}
    assert (await http.post(target, data=form | {"csrf": token}, headers=null)).status_code == 403
    ok = await http.post(target, data=form | {"csrf": token}, headers={"Origin": review.origin})
    assert ok.status_code == 200 and "Save this correction" in ok.text
    json_body = await http.post(target, json=form | {"csrf": token})
    assert json_body.status_code == 415
    big = await http.post(
        target,
        content=b"value=" + b"a" * (2 << 20),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert big.status_code == 413


async def test_values_are_escaped_and_no_secret_is_in_any_page(
    review: ReviewProcess, http: httpx.AsyncClient, keys: Keys
) -> None:
    pages = [
        "",
        "m/mem/people/alice",
        "m/core",
        "core",
        "changes",
        "?q=lisbon",
        "act/remove/mem/people/bob",
        "m/mem/absent",
    ]
    texts = []
    for path in pages:
        r = await http.get(review.at(path))
        assert r.status_code in (200, 404), (path, r.status_code)
        texts.append(r.text)
    alice = texts[1]
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; tea" in alice
    assert "<script>" not in alice
    assert "Alice lives in Lisbon." in texts[5]  # found by a word of its value
    assert "mem/people/bob" not in texts[5]
    assert "by search" in texts[5]
    for text in texts:
        for secret in secrets_of(keys):
            assert secret not in text


async def test_a_question_no_value_contains_is_answered_by_recall(
    review: ReviewProcess, http: httpx.AsyncClient
) -> None:
    """The box searches for its words as written, and recalls when no value contains them."""
    r = await http.get(review.at(""), params={"q": "which city is Alice living in"})
    assert r.status_code == 200
    assert "by recall" in r.text
    rows = r.text.split('class="value">')[1:]
    assert rows and "Alice lives in Lisbon." in rows[0]  # the best first


async def test_core_graph_is_a_picture(review: ReviewProcess, http: httpx.AsyncClient) -> None:
    html = (await http.get(review.at("core"))).text
    svg = html[html.index("<svg") : html.index("</svg>")]
    assert "mem/people/alice" in svg and "mem/people/bob" in svg and "mem/gone" in svg
    assert 'class="node orphan"' in svg and 'class="node dangling"' in svg
    assert 'class="edge dangling"' in svg and 'class="edge link"' in svg


# --- actions ---------------------------------------------------------------------------------


async def test_correct_conflicts_with_a_newer_version(
    review: ReviewProcess, http: httpx.AsyncClient, seeded: AgentMemory
) -> None:
    await seeded.set("people/carol", "Carol v1")
    page = (await http.get(review.at("m/mem/people/carol"))).text
    base = re.search(r'name="base" value="([0-9a-f]{64})"', page)
    assert base
    await seeded.set("people/carol", "Carol v2, written meanwhile")
    preview = await http.post(
        review.at("act/preview/mem/people/carol"),
        data={
            "value": "Carol v1 corrected",
            "base": base[1],
            "csrf": csrf_of(page, "/act/preview/mem/people/carol"),
        },
    )
    assert "changed since you opened it" in preview.text
    save = await http.post(
        review.at("act/save/mem/people/carol"),
        data={
            "value": "Carol from the page",
            "base": base[1],
            "csrf": csrf_of(preview.text, "/act/save/mem/people/carol"),
        },
    )
    assert save.status_code == 409, save.text
    assert "Carol v2, written meanwhile" in save.text and "Carol from the page" in save.text
    assert (await seeded.get("people/carol")).value == "Carol v2, written meanwhile"


async def test_save_normalises_line_endings_and_keeps_the_rest(
    review: ReviewProcess, http: httpx.AsyncClient, seeded: AgentMemory
) -> None:
    await seeded.set("notes/eol", "old")
    typed = "\n  leading newline and spaces\r\nwindows\rold mac\n\ttab, trailing  \r\n"
    save = await correct(http, review, "mem/notes/eol", typed)
    assert save.status_code == 303, save.text
    after = await http.get(review.origin + save.headers["location"])
    assert "they serve the version just written" in after.text
    expected = "\n  leading newline and spaces\nwindows\nold mac\n\ttab, trailing  \n"
    assert (await seeded.get("notes/eol")).value == expected


async def test_verdicts_are_the_owners_only(review: ReviewProcess, http: httpx.AsyncClient) -> None:
    """This server holds the agent's key: a denial is refused, naming the owner (issue 39:
    verdicts are signed by the owner's key alone)."""
    deny = "act/deny/mem/people/bob"
    r = await submit(http, review, deny, deny, reason="wrong")
    assert r.status_code == 422 and "only the owner" in r.text
    page = (await http.get(review.at("m/mem/people/alice"))).text
    assert "/act/confirm/" not in page and "confirm and deny are the owner" in page


async def correct(
    http: httpx.AsyncClient, server: ReviewProcess, slug: str, value: str
) -> httpx.Response:
    """As the page does it: open the memory, preview the new value, save it."""
    page = (await http.get(server.at(f"m/{slug}"))).text
    base = re.search(r'name="base" value="([0-9a-f]{64})"', page)
    assert base, page
    preview = await http.post(
        server.at(f"act/preview/{slug}"),
        data={"value": value, "base": base[1], "csrf": csrf_of(page, f"/act/preview/{slug}")},
    )
    assert preview.status_code == 200, preview.text
    return await http.post(
        server.at(f"act/save/{slug}"),
        data={"value": value, "base": base[1], "csrf": csrf_of(preview.text, f"/act/save/{slug}")},
    )


async def test_each_page_reads_the_memory_once(
    relay: RelayProcess,
    keys: Keys,
    seeded: AgentMemory,
    tmp_path: Path,
    http: httpx.AsyncClient,
    proxy_port: int,
) -> None:
    """One read of the relays per page (issue 45): the list's live read also serves its
    audit column; a memory's page reads the slug with its history once, and so does the
    confirmation of a restore. A read is one connection to the relay (here a proxy that
    counts them); the negative twin: a page that reads nothing opens none."""
    log = await seeded.log("people/alice")
    pages = [
        "",
        "?show=gone",
        "core",
        "changes",
        "m/mem/people/alice",
        "m/mem/absent",
        f"act/restore/mem/people/alice?rev={log.versions[-1].id}",
        "act/remove/mem/people/bob",
    ]
    async with (
        counting_relay(relay.url, proxy_port) as counted,
        review_server(
            keys.agent_env(counted.url), log_dir=tmp_path, state_dir=tmp_path / "data"
        ) as server,
    ):
        for path in pages:
            before = counted.connections
            r = await http.get(server.at(path))
            assert r.status_code in (200, 404), (path, r.text)
            assert counted.connections - before == 1, path
        alice = (await http.get(server.at("m/mem/people/alice"))).text
        assert "Alice lives in Lisbon." in alice and 'id="audit-state"' in alice
        assert 'id="timeline"' in alice
        listed = (await http.get(server.at(""))).text
        assert '<span class="ok">clean</span>' in listed  # the audit, from the same read
        before = counted.connections
        assert (await http.get(server.at("static/review.css"))).status_code == 200
        assert counted.connections == before


async def test_relay_refusal_is_shown_with_the_relays_message(
    relay: RelayProcess,
    keys: Keys,
    seeded: AgentMemory,
    tmp_path: Path,
    http: httpx.AsyncClient,
    proxy_port: int,
) -> None:
    await seeded.set("notes/refused", "before")
    async with refusing_relay(relay.url, proxy_port) as refusing:
        # the only relay refuses: nothing is written, the page says why and keeps the text
        async with review_server(
            keys.agent_env(refusing), log_dir=tmp_path, state_dir=tmp_path / "data"
        ) as server:
            r = await correct(http, server, "mem/notes/refused", "typed on the page")
            assert r.status_code == 502, r.text
            assert REFUSAL in r.text and "typed on the page" in r.text
        assert (await seeded.get("notes/refused")).value == "before"
        # one of two relays refuses: written, and the refusal is named beside the read-back
        both = f"{relay.url},{refusing}"
        async with review_server(
            keys.agent_env(both), log_dir=tmp_path, state_dir=tmp_path / "data"
        ) as server:
            r = await correct(http, server, "mem/notes/refused", "accepted by one")
            assert r.status_code == 303, r.text
            shown = (await http.get(server.origin + r.headers["location"])).text
            assert REFUSAL in shown and refusing in shown
            assert "they serve the version just written" in shown
        assert (await seeded.get("notes/refused")).value == "accepted by one"


def owner_memory(keys: Keys, relays: str) -> AgentMemory:
    env = {"ENGRAM_PRIVATE_KEY": keys.owner_sk.hex()}
    return AgentMemory(load_identity(None, None, keys.agent, env), relays, timeout=30)


async def test_owner_mode_writes_verdicts_and_reads_them_back(
    relay: RelayProcess, keys: Keys, seeded: AgentMemory, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """With the owner's key every action is an owner verdict (issue 39): a correction and a
    confirmation the agent reads as the owner's, a denial it no longer reads, a forget; a
    verdict on a value the page did not show is a conflict; each is read back."""
    await seeded.set("people/dora", "Dora lives in Rome.")
    await seeded.set("people/erin", "Erin lives in Oslo.")
    await seeded.set("people/finn", "Finn v1")
    async with review_server(
        keys.owner_env(relay.url), "--agent", keys.agent, log_dir=tmp_path, state_dir=tmp_path
    ) as server:
        page = (await http.get(server.at("m/mem/people/alice"))).text
        assert "Alice lives in Lisbon." in page and "acting as <strong>the owner" in page
        assert "Preview the correction" in page and "/act/deny/mem/people/alice" in page
        assert "/act/remove/" not in page  # the owner denies; the agent removes
        for secret in secrets_of(keys):
            assert secret not in page
        r = await correct(http, server, "mem/people/erin", "Erin lives in Bergen.")
        assert r.status_code == 303, r.text
        r = await submit(http, server, "m/mem/people/alice", "act/confirm/mem/people/alice")
        assert r.status_code == 303, r.text
        shown = (await http.get(server.origin + r.headers["location"])).text
        assert "reads as the owner's value, confirmed" in " ".join(shown.split())
        deny = "act/deny/mem/people/dora"
        r = await submit(http, server, deny, deny, reason="she moved")
        assert r.status_code == 303, r.text
        shown = (await http.get(server.origin + r.headers["location"])).text
        assert "they serve the version just written" in shown and "denied by the owner" in shown
        assert "Dora lives in Rome." not in shown and "she moved" in shown
        # the page showed Finn v1; the agent writes v2 before the owner denies: nothing denied
        page = (await http.get(server.at("act/deny/mem/people/finn"))).text
        await seeded.set("people/finn", "Finn v2")
        r = await http.post(
            server.at("act/deny/mem/people/finn"),
            data=form_of(page, "/act/deny/mem/people/finn") | {"reason": "stale"},
        )
        assert r.status_code == 409 and "changed after this page showed it" in r.text
        forget = "act/forget/mem/people/finn"
        r = await submit(http, server, forget, forget, confirm="yes", reason="private")
        assert r.status_code == 303, r.text
        shown = (await http.get(server.origin + r.headers["location"])).text
        assert "Forgotten" in shown and "still serves" in shown and relay.url in shown
        assert "Finn v" not in shown
        gone = (await http.get(server.at("?show=gone"))).text
        table = gone[gone.index('id="gone"') :]
        assert "mem/people/dora" in table and "she moved" in table and "forgotten" in table
        assert "Dora lives" not in gone and "Finn v" not in gone
        live = (await http.get(server.at(""))).text
        assert "mem/people/dora" not in live[live.index('id="live"') :]
    erin = await seeded.get("people/erin")
    assert (erin.value, erin.role, erin.trust) == ("Erin lives in Bergen.", "owner", "confirmed")
    assert (await seeded.get("people/alice")).trust == "confirmed"
    for slug in ("people/dora", "people/finn"):
        with pytest.raises(NotFoundError):
            await seeded.get(slug)


async def test_the_agents_page_is_refused_what_the_agent_may_not_write(
    review: ReviewProcess, http: httpx.AsyncClient, seeded: AgentMemory, relay: RelayProcess,
    keys: Keys,
) -> None:  # fmt: skip
    """Held with the agent's key the page writes as the agent: restoring a value a tombstone
    rejected is refused with the tombstone's reason and can be done anyway; a value the
    owner denied is refused with the denial's reason, and no force helps."""
    await seeded.set("notes/tomb", "the old plan")
    await seeded.rm("notes/tomb", reason="outdated")
    await seeded.set("notes/flat", "the earth is flat")
    await owner_memory(keys, relay.url).deny("notes/flat", reason="it is not")
    page = (await http.get(review.at("m/mem/notes/tomb"))).text
    assert "removed" in page and "outdated" in page and "the old plan" in page  # its history
    rev = re.search(r"act/restore/mem/notes/tomb\?rev=([0-9a-f]{64})", page)
    assert rev, page
    restore = f"act/restore/mem/notes/tomb?rev={rev[1]}"
    r = await submit(http, review, restore, "act/restore/mem/notes/tomb")
    assert r.status_code == 409 and "rejected by tombstone" in r.text and "(outdated)" in r.text
    r = await http.post(
        review.at("act/restore/mem/notes/tomb"), data=form_of(r.text, "/act/restore/mem/notes/tomb")
    )
    assert r.status_code == 303, r.text  # "Do it anyway": the form carries force
    assert (await seeded.get("notes/tomb")).value == "the old plan"

    page = (await http.get(review.at("m/mem/notes/flat"))).text
    assert "denied by the owner" in page and "it is not" in page
    assert "the earth is flat" not in page and "act/restore/mem/notes/flat" not in page
    withheld = [v for v in await seeded.log("notes/flat") if v.state == "withheld"]
    restore = f"act/restore/mem/notes/flat?rev={withheld[0].id}"
    r = await submit(http, review, restore, "act/restore/mem/notes/flat")
    assert r.status_code == 409 and "the owner denied this value" in r.text
    assert "(it is not)" in r.text and "Do it anyway" not in r.text
    assert "the earth is flat" not in r.text
    with pytest.raises(NotFoundError):
        await seeded.get("notes/flat")


# --- the server's life -----------------------------------------------------------------------


async def test_visit_mark_is_private_and_holds_no_content(
    relay: RelayProcess, keys: Keys, seeded: AgentMemory, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    await seeded.set("notes/visit", "seen on the first visit")
    state = tmp_path / "data"
    env = keys.agent_env(relay.url)
    async with review_server(env, log_dir=tmp_path, state_dir=state) as first:
        assert "mem/notes/visit" in (await http.get(first.at("changes"))).text
    assert await first.stop() == 0
    marks = list((state / "engram-relay" / "review").iterdir())
    assert len(marks) == 1
    assert stat.S_IMODE(marks[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(marks[0].parent.stat().st_mode) == 0o700
    raw = marks[0].read_text()
    for word in ("mem/", "visit", "Lisbon", "core"):
        assert word not in raw
    await seeded.set("notes/visit", "changed after the first visit")
    await seeded.rm("people/bob")
    async with review_server(env, log_dir=tmp_path, state_dir=state) as second:
        html = (await http.get(second.at("changes"))).text
        rows = re.findall(
            r'<tr class="(\w+)">\s*<td>\w+</td>\s*<td class="slug">(.*?)</td>', html, re.S
        )
        kinds = {re.sub(r"<[^>]+>", "", s).strip(): k for k, s in rows}
        assert kinds.get("mem/notes/visit") == "changed"
        assert kinds.get("mem/people/bob") == "removed"
        assert "mem/people/alice" not in kinds  # unchanged since the first visit
        seen = await http.post(
            second.at("changes/seen"), data={"csrf": csrf_of(html, "/changes/seen")}
        )
        assert seen.status_code == 303
        assert (
            "Nothing changed since your last visit" in (await http.get(second.at("changes"))).text
        )


async def test_stops_after_idle_timeout(relay: RelayProcess, keys: Keys, tmp_path: Path) -> None:
    from review_support import start_review

    server = await start_review(
        keys.agent_env(relay.url), "--idle-timeout", "1", log_dir=tmp_path, state_dir=tmp_path
    )
    assert await server.wait() == 0
    assert "without a request" in server.log()


async def test_ctrl_c_stops_and_closes_the_port(
    relay: RelayProcess, keys: Keys, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    async with review_server(keys.agent_env(relay.url), log_dir=tmp_path, state_dir=tmp_path) as s:
        assert (await http.get(s.url)).status_code == 200
        assert await s.stop() == 0
        with pytest.raises(httpx.ConnectError):
            await http.get(s.url)
    assert "stopped" in s.log()


async def test_relay_down_is_a_page_that_says_so(
    keys: Keys, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    down = f"ws://127.0.0.1:{closed_port()}"
    async with review_server(keys.agent_env(down), log_dir=tmp_path, state_dir=tmp_path) as s:
        for path in ("", "m/mem/x", "core", "changes"):
            r = await http.get(s.at(path))
            assert r.status_code == 502, (path, r.status_code)
            assert down in r.text


async def test_a_partial_read_says_so_on_every_view_and_moves_no_mark(
    relay: RelayProcess,
    keys: Keys,
    seeded: AgentMemory,
    tmp_path: Path,
    http: httpx.AsyncClient,
    proxy_port: int,
) -> None:
    """With a relay down, or a relay whose listing cannot be paged to the end, the list,
    the core graph and the changes say what the relays said and that the read is
    incomplete; the changes call nothing gone that the read did not find, and no visit
    mark is taken from such a read (neither by the button nor when the server stops).
    Negative twin: a complete read moves the mark and reports a removal."""
    state = tmp_path / "data"
    # A second after the seeded memory's writes: a page of the truncating relay below (3
    # events) then holds this write's head and revision and one older event, so its
    # answer to a page asked `until` that older second shows it ignores `until` (a page
    # of events of one second only cannot tell that from a relay that honours it)
    await asyncio.sleep(1.1)
    await seeded.set("notes/partial", "here on the first visit")
    async with review_server(keys.agent_env(relay.url), log_dir=tmp_path, state_dir=state) as s:
        assert "Incomplete read" not in (await http.get(s.at("changes"))).text
    (mark,) = (state / "engram-relay" / "review").iterdir()
    before = mark.read_bytes()
    down = f"ws://127.0.0.1:{closed_port()}"
    async with truncating_relay(relay.url, 3, proxy_port) as cut:
        for relays, said in ((f"{relay.url},{down}", down), (cut, "ignores `until`")):
            env = keys.agent_env(relays)
            async with review_server(env, log_dir=tmp_path, state_dir=state) as server:
                for path in ("", "?show=gone", "core", "changes"):
                    r = await http.get(server.at(path))
                    assert r.status_code == 200, (path, r.text)
                    assert 'id="partial"' in r.text and said in r.text, (relays, path)
                listed = (await http.get(server.at(""))).text
                assert re.search(r"at least \d+ live \(incomplete\)", listed)
                changes = (await http.get(server.at("changes"))).text
                assert "no relay serves any more" not in changes
                assert '<tr class="removed">' not in changes
                assert 'id="mark-seen" disabled' in changes and 'id="no-mark"' in changes
                if relays == cut:  # 2 events of the memory: the rest were not read
                    assert 'id="unread"' in changes
                seen = await http.post(
                    server.at("changes/seen"), data={"csrf": csrf_of(changes, "/changes/seen")}
                )
                assert seen.status_code == 409 and "not marked" in seen.text
            assert mark.read_bytes() == before, relays
    # the twin: a complete read reports the removal and moves the mark
    await seeded.rm("notes/partial")
    async with review_server(keys.agent_env(relay.url), log_dir=tmp_path, state_dir=state) as s:
        changes = (await http.get(s.at("changes"))).text
        assert 'id="partial"' not in changes and 'id="mark-seen">' in changes
        assert re.search(r'<tr class="removed">\s*<td>removed</td>\s*<td class="slug"><a[^>]*>'
                         r"mem/notes/partial", changes)  # fmt: skip
    assert mark.read_bytes() != before


async def test_bad_key_is_one_line_exit_1(tmp_path: Path, relay: RelayProcess) -> None:
    from cli_support import clean_env, engram_async

    env = clean_env(
        ENGRAM_PRIVATE_KEY="not-a-key", ENGRAM_OWNER=Keys.fresh().owner, ENGRAM_RELAY=relay.url
    )
    done = await engram_async("review", env=env)
    assert done.returncode == 1
    assert done.stdout == b"" and done.stderr.count(b"\n") == 1
