"""`engram review`'s pages stay bounded whatever the agent writes (issue 46, item 6): a
memory of 150 versions of 50 KB, with one relay of the set down, and a memory of 400
memories that all link to each other. A real relay, a real `engram review` process; the
versions are signed and published straight to the relay (as the agent's own writes would
be, chained), since 150 writes through the API would each read the growing history.

Sizes are asserted (bytes of each answer), never times: the time a page takes is measured
by hand (see the issue's closing note).
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import markupsafe
import msgspec
import pytest
from cli_support import Keys, closed_port, put, shared_relay
from relay_fixtures import RelayProcess
from review_support import ReviewProcess, review_server

from cli.memory.review.graph import MAX_EDGES, MAX_NODES
from cli.memory.review.timeline import EXCERPT_CHARS, PAGE
from engram import CORE_SLUG
from engram.live import chain_link
from engram.nip01 import Event
from engram.versions import AGENT, Meta, Version, build_head, build_version

# one worker runs the whole module: one relay, two memories
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.xdist_group("review-bounds")]

VERSIONS = 150
VALUE_BYTES = 50_000
PAGE_BOUND = 2_000_000  # bytes: the bound for any page
MEMORIES = 400
SLUG = "mem/notes/big"


def chain(keys: Keys, slug: str, texts: list[str], start: int) -> list[Event]:
    """The agent's versions of `slug` with `texts`, oldest first, one a second from
    `start`, each linked to the one before, and the head of the newest."""
    versions: list[Version] = []
    meta = Meta()
    for i, text in enumerate(texts):
        prev, prev_sha = chain_link(versions)
        meta = Meta(trust="guess", prev=prev, prev_sha256=prev_sha)
        event = build_version(
            keys.agent_sk, keys.owner, AGENT, slug, text, meta, start + i,
            os.urandom(32), os.urandom(32),
        )  # fmt: skip
        versions.append(Version(event, slug, text, AGENT, meta))
    head_meta = msgspec.structs.replace(meta, rev=versions[-1].event.id)
    head = build_head(
        keys.agent_sk, keys.owner, slug, texts[-1], head_meta, start + len(texts) - 1,
        os.urandom(32), os.urandom(32),
    )  # fmt: skip
    return [v.event for v in versions] + [head]


def value(i: int) -> str:
    """Version `i`: 50 KB of lines, most of them changed from one version to the next,
    with characters the page must escape."""
    lines, size = [], 0
    j = 0
    while size < VALUE_BYTES:
        line = f"v{i} line {j}: <b>{'&' if j % 7 == 0 else 'x'}</b> {(i * 7919 + j) % 100003}"
        lines.append(line)
        size += len(line) + 1
        j += 1
    return "\n".join(lines)[:VALUE_BYTES]


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("review-bounds-relay")))


@pytest.fixture(scope="module")
async def long_history(relay: RelayProcess) -> Keys:
    keys = Keys.fresh()
    events = chain(keys, SLUG, [value(i) for i in range(VERSIONS)], 1_700_000_000)
    for at in range(0, len(events), 25):
        await put(relay.url, events[at : at + 25], keys.agent_sk)
    return keys


@pytest.fixture(scope="module")
async def interlinked(relay: RelayProcess) -> Keys:
    keys = Keys.fresh()
    slugs = [f"mem/web/m{i:03}" for i in range(MEMORIES)]
    links = " ".join(f"[[{s}]]" for s in slugs)
    events = chain(keys, CORE_SLUG, [f"Core. See [[{slugs[0]}]]."], 1_700_000_000)
    for n, slug in enumerate(slugs):  # a second each, as an agent writes them
        events += chain(
            keys, slug, [f"Memory {n} links to every memory: {links}"], 1_700_000_001 + n
        )
    for at in range(0, len(events), 100):
        await put(relay.url, events[at : at + 100], keys.agent_sk)
    return keys


@pytest.fixture(scope="module")
async def down_one(
    relay: RelayProcess, long_history: Keys, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[ReviewProcess, str]]:
    """The page over the long history, on a set of the relay and one that is down."""
    tmp = tmp_path_factory.mktemp("review-bounds")
    down = f"ws://127.0.0.1:{closed_port()}"
    env = long_history.agent_env(f"{relay.url},{down}")
    async with review_server(env, log_dir=tmp, state_dir=tmp / "data") as server:
        yield server, down


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=120) as client:
        yield client


def escaped(text: str) -> str:
    return str(markupsafe.escape(text))


async def test_a_long_history_is_paged_and_its_values_folded(
    down_one: tuple[ReviewProcess, str], http: httpx.AsyncClient
) -> None:
    server, down = down_one
    r = await http.get(server.at(f"m/{SLUG}"))
    assert r.status_code == 200 and len(r.content) < PAGE_BOUND, len(r.content)
    page = r.text
    assert down in page  # the relay that is down is named
    assert f"Versions 1–{PAGE} of {VERSIONS}" in page
    assert page.count('<li class="version') == PAGE
    newest, older = value(VERSIONS - 1), value(VERSIONS - 2)
    assert escaped(newest) in page  # the edit box holds the whole value: it can be corrected
    assert escaped(older[:EXCERPT_CHARS]) in page  # an older version: its start ...
    assert escaped(older) not in page  # ... never all of it on the timeline
    assert "more lines not shown here" in page  # its difference, cut
    link = re.search(r'href="([^"]*\?value=([0-9a-f]{64})[^"]*#whole)"', page)
    assert link, "no link to a whole value"
    whole = await http.get(server.origin + link[1].replace("&amp;", "&"))
    assert whole.status_code == 200 and len(whole.content) < PAGE_BOUND
    shown = re.search(r'<pre class="value" id="whole-value">(.*?)</pre>', whole.text, re.S)
    assert shown and shown[1] in {escaped(value(i)) for i in range(VERSIONS)}
    # every page of the history, each bounded, the oldest version on the last
    pages = -(-VERSIONS // PAGE)
    seen = 0
    for n in range(1, pages + 1):
        r = await http.get(server.at(f"m/{SLUG}?page={n}"))
        assert r.status_code == 200 and len(r.content) < PAGE_BOUND, (n, len(r.content))
        seen += r.text.count('<li class="version')
        assert ('rel="next"' in r.text) == (n < pages) and ('rel="prev"' in r.text) == (n > 1)
    assert seen == VERSIONS and "the first version recorded" in r.text
    # two versions compared: bounded too
    ids = re.findall(r'name="from" value="([0-9a-f]{64})"', page)
    r = await http.get(server.at(f"m/{SLUG}"), params={"from": ids[-1], "to": ids[0]})
    assert r.status_code == 200 and len(r.content) < PAGE_BOUND and 'id="compare-diff"' in r.text


async def test_the_list_and_changes_over_the_long_history_are_bounded(
    down_one: tuple[ReviewProcess, str], http: httpx.AsyncClient
) -> None:
    server, down = down_one
    for path in ("", "core", "changes", f"act/restore/{SLUG}?rev=" + "0" * 64):
        r = await http.get(server.at(path))
        assert r.status_code in (200, 404) and len(r.content) < PAGE_BOUND, (path, len(r.content))
        assert down in r.text, path


async def test_a_web_of_interlinked_memories_is_drawn_in_part(
    relay: RelayProcess, interlinked: Keys, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    env = interlinked.agent_env(relay.url)
    async with review_server(env, log_dir=tmp_path, state_dir=tmp_path / "data") as server:
        r = await http.get(server.at("core"))
        assert r.status_code == 200 and len(r.content) < PAGE_BOUND // 2, len(r.content)
        svg = r.text[r.text.index("<svg") : r.text.index("</svg>")]
        assert svg.count('class="edge') == MAX_EDGES
        assert svg.count('class="node') == MAX_NODES
        total_links = MEMORIES * MEMORIES + 1
        assert f"{MAX_EDGES:,} of {total_links:,} links" in r.text
        assert f"{MAX_NODES:,} of {MEMORIES + 1:,} boxes" in r.text
        listed = await http.get(server.at(""))
        assert listed.status_code == 200 and len(listed.content) < PAGE_BOUND // 4
        assert "Rows 1–100 of 401" in listed.text and 'id="partial"' not in listed.text
        last = await http.get(server.at("?page=5"))
        rows = re.findall(r'<td class="slug"><a [^>]*>([^<]+)</a>', last.text)
        assert rows == [f"mem/web/m{i:03}" for i in range(399, 400)]  # core first, by slug
        one = await http.get(server.at("m/mem/web/m007"))
        assert one.status_code == 200 and len(one.content) < PAGE_BOUND // 4
        assert "… and 300 more links in the value." in one.text
        linking = await http.get(server.at("?links=mem/web/m007"))
        assert "Rows 1–100 of 400" in linking.text  # every memory links to it
        changes = await http.get(server.at("changes"))
        assert changes.status_code == 200 and len(changes.content) < PAGE_BOUND // 4
        assert "Changes 1–100 of 401" in changes.text
