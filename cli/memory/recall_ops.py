"""Recall on `AgentMemory`: the index (cli.memory.recall) this object keeps, the ranked
search over it, and write-time similarity hints."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from cli.memory.base import MemoryBase
from cli.memory.results import Similar
from cli.nostr.errors import BadInputError

if TYPE_CHECKING:  # numpy and the model load only when recall is used
    from cli.memory.recall import Recall, Recalled


class RecallOps(MemoryBase):
    """The recall methods of `AgentMemory`."""

    _recall: Recall | None
    one_shot: bool

    def recaller(self) -> Recall:
        """This object's recall index (loaded on first use, then kept current)."""
        if self._recall is None:
            from cli.memory.recall import Recall

            self._recall = Recall(
                self.identity,
                self.relays,
                self.timeout,
                cache_dir=self.recall_dir,
                background=not self.one_shot,
            )
        return self._recall

    async def close(self) -> None:
        """Close the connections the recall index keeps (other calls keep none) and save
        its cache if a change is waiting."""
        if self._recall is not None:
            await self._recall.close()

    async def recall(self, query: str, limit: int = 10, *, valid_now: bool = False) -> Recalled:
        """The live memories most relevant to `query`, best first (`Recalled.hits`, each
        with its trust and validity); `valid_now` leaves out facts not valid now.

        What is live is `engram.live`'s rule, as for `ls`: removed, denied and forgotten
        memories are never ranked, owner corrections are. Ranked on this machine (BM25 and
        a packaged embedding model, fused): the query and the scores never leave it. The
        index is cached encrypted under the user's data dir and brought up to the relays
        first (`cli.memory.recall.updater`)."""
        if not query.strip():
            raise BadInputError("the recall query is empty")
        if limit < 1:
            raise BadInputError("--limit must be at least 1")
        return await self.recaller().recall(query, limit, valid_now=valid_now)

    async def _similar(self, slug: str, value: str) -> tuple[Similar, ...]:
        """Write-time hints: existing memories close to `value`; none if the index cannot
        be read in time (a hint never fails a write)."""
        try:
            hits = await asyncio.wait_for(self.recaller().similar(slug, value), self.timeout)
        except Exception:
            return ()
        return tuple(Similar(h.slug, round(h.score, 4), h.created_at, h.event_id) for h in hits)
