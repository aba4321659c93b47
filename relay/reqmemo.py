"""REQ filters remembered by their text, for the REQs that repeat them.

Most REQs a relay answers repeat a filter it has seen: an agent fetching its memory again,
the readers of one author, a client re-opening its feed. Parsing a REQ's filters,
checking them against the tenant's limits and the private read gate, clamping their
limit, and working out the fan-out's index keys and the read cache's plan is the same work
each time: ~10 us of a cached REQ's ~86 (bench/RESULTS-HISTORY.md, "The REQ path, fourth
pass, and the keepalive wheel"). `ReqMemo` keeps, for a filter text (what follows the
subscription id in a compact REQ: `split_req`), the `SharedFilters` that text gave for
one tenant (the object: a tenant whose settings change is a new one) and one viewer, and
hands them to the next REQ of that text, which is then not decoded at all
(relay.pipeline).

Only what passed is kept: a refused REQ takes the full path every time, and says why. A
search is never kept (its live budget and tokens belong to each subscription). The
subscription id's length is checked on every REQ (it is not part of the text). Bounded:
`entries` texts of at most `REQ_MEMO_TEXT_MAX` characters, the oldest forgotten first.
"""

from __future__ import annotations

from relay.filters import SharedFilters
from relay.tenants import Tenant

REQ_MEMO_TEXT_MAX = 1024  # characters of a filter text worth keeping (a feed of ~14 authors)
REQ_START = '["REQ","'


def split_req(frame: str) -> tuple[str, str] | None:
    """(subscription id, filter text) of a compact REQ frame whose id is written plainly
    (no quote, backslash or control character: the id's text is the id), the text being
    everything after the id's comma (its filters and the closing bracket); None for any
    other frame, or a text too long to keep. Says nothing of the text's validity: only a
    text the full path accepted is ever kept, and only a kept one is used."""
    if not frame.startswith(REQ_START):
        return None
    end = frame.find('",', 8)
    if end < 9 or len(frame) - end - 2 > REQ_MEMO_TEXT_MAX:
        return None
    sub_id = frame[8:end]
    if '"' in sub_id or "\\" in sub_id or not sub_id.isprintable():
        return None
    return sub_id, frame[end + 2 :]


class ReqMemo:
    """Filter text -> (tenant, viewer, SharedFilters), at most `entries` of them."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._memo: dict[str, tuple[Tenant, str | None, SharedFilters]] = {}
        self.hits = 0  # REQs given kept filters (/metrics: engram_req_memo_hits)

    def get(self, text: str, tenant: Tenant, viewer: str | None) -> SharedFilters | None:
        """The filters this text gave for this tenant and viewer, if kept (the caller
        checks the subscription id's length: it is not part of the text)."""
        entry = self._memo.get(text)
        if entry is None or entry[0] is not tenant or entry[1] != viewer:
            return None
        self.hits += 1
        return entry[2]

    def put(self, text: str, tenant: Tenant, viewer: str | None, filters: SharedFilters) -> None:
        """Keep what a REQ of this text was allowed to run (the text's last tenant and
        viewer win: a text read by several viewers is worked out again for each)."""
        memo = self._memo
        if text not in memo and len(memo) >= self.entries:
            del memo[next(iter(memo))]  # the oldest text
        memo[text] = (tenant, viewer, filters)

    @property
    def size(self) -> int:
        """Texts kept now (/metrics: engram_req_memo_entries)."""
        return len(self._memo)
