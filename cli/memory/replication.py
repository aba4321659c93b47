"""Replication of one agent's memory across a relay set: learning what each relay holds
(REQ paging, or NIP-77 negentropy against what was read) and giving each relay the
heads and versions it lacks, exactly as signed. Used by `AgentMemory.sync`, `migrate` and
`import_`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cli.memory.results import RelaySync
from cli.nostr.client import RelayClient
from cli.nostr.paging import Fetched, fetch_all
from cli.nostr.peer import Peer, Unsupported
from cli.nostr.reconcile import reconcile_items
from cli.nostr.relayset import RelaySession
from engram.negentropy import Items
from engram.nip01 import Event
from engram.replace import is_superseded

NEG_OPEN_TIMEOUT = 20.0  # seconds for a relay's first negentropy answer, then REQ paging


async def reconciled(
    session: RelaySession,
    seckey: bytes,
    query: dict[str, Any],
    limits: dict[str, int | None],
    methods: dict[str, str],
    timeout: float,
) -> dict[str, Fetched]:
    """What every relay holds of the memory, each distinct event downloaded once.

    Heads are chosen after decryption, so the memory itself is still read: with REQ
    paging from the relays NIP-11 says lack NIP-77 (or from the first relay when none
    says so). Every other relay is reconciled with negentropy (NIP-77) against the
    events read so far: the ids it lacks tell which heads to give it, and only the
    events it alone holds are fetched, by id. A relay that turns negentropy down (NEG-ERR,
    a NOTICE, no answer) is paged with REQ instead. `methods` gets relay -> how.
    """
    docs: dict[str, dict[str, Any]] = getattr(session, "nip11_docs", {})
    peers = {u: Peer(session.clients[u], seckey, docs.get(u)) for u in session.live}
    paged = [u for u, p in peers.items() if p.serves_negentropy is False] or session.live[:1]
    fetched = await session.on_each(lambda c: fetch_all(c, query, limits.get(c.url)), paged)
    methods.update(dict.fromkeys(fetched, "req"))
    known = {i: e for f in fetched.values() for i, e in f.events.items()}
    items = Items.from_pairs((e.created_at, bytes.fromhex(i)) for i, e in known.items())
    wait = min(NEG_OPEN_TIMEOUT, timeout)

    async def one(client: RelayClient) -> Fetched:
        peer = peers[client.url]
        try:
            lacks, extra, _ = await reconcile_items(peer, items, query, wait)
        except Unsupported:
            await peer.neg_close()
            methods[client.url] = "req"
            return await fetch_all(client, query, limits.get(client.url))
        absent = set(lacks)
        out = Fetched({i: e for i, e in known.items() if i not in absent})
        out.events.update((e.id, e) for e in await peer.fetch_ids(extra))
        methods[client.url] = "negentropy"
        return out

    rest = [u for u in session.live if u not in paged]
    fetched.update(await session.on_each(one, rest))
    return fetched


async def spread(
    session: RelaySession,
    wanted: dict[str, Event],
    held: dict[str, set[str]],
    urls: Sequence[str],
) -> dict[str, RelaySync]:
    """Republish each event (id -> event: heads and versions), exactly as signed, to each
    relay that lacks it."""
    out: dict[str, RelaySync] = {}
    missing = {u: [e for i, e in wanted.items() if i not in held.get(u, set())] for u in urls}
    answers = await session.on_each(
        lambda c: c.try_publish_many(missing[c.url]), urls=[u for u in urls if missing[u]]
    )
    reasons = session.reasons()
    for url in urls:
        if url in reasons:
            out[url] = RelaySync(error=reasons[url])
            continue
        results = answers.get(url, {})
        refused = {i: m for i, (ok, m) in results.items() if not ok or is_superseded(m)}
        out[url] = RelaySync(
            published=len(results) - len(refused),
            up_to_date=len(wanted) - len(missing[url]),
            refused=refused,
        )
    return out
