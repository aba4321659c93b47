"""The live subscription index: candidates by index, full match, engram visibility."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engram.nip01 import sign_event
from relay.config import Limits
from relay.fanout import FanOut
from relay.filters import Filter, matches_any, parse_filter
from relay.wire import encode_event

SK = [bytes.fromhex(f"{i:064x}") for i in range(1, 5)]


class Conn:
    def __init__(self, authed: str | None = None) -> None:
        self.authed = authed
        self.frames: list[bytes] = []

    def send(self, frame: bytes) -> None:
        self.frames.append(frame)


def ev(sk: bytes, kind: int = 1, tags=(), created_at: int = 100, content: str = "c"):
    return sign_event(sk, created_at, kind, [list(t) for t in tags], content, bytes(32))


def f(obj: dict) -> Filter:
    return parse_filter(obj, Limits())


def test_publish_reaches_only_matching_subscriptions():
    fan = FanOut()
    a, b, c = Conn(), Conn(), Conn()
    e = ev(SK[0], kind=7, tags=[("e", "x" * 3)])
    fan.subscribe(a, "s1", [f({"kinds": [7]})])
    fan.subscribe(b, "s2", [f({"kinds": [1]}), f({"#e": ["xxx"]})])
    fan.subscribe(c, "s3", [f({"authors": [e.pubkey], "kinds": [1]})])
    raw = encode_event(e)
    assert fan.publish(e, raw) == 2
    assert a.frames == [b'["EVENT","s1",' + raw + b"]"]
    assert b.frames == [b'["EVENT","s2",' + raw + b"]"]
    assert c.frames == []


def test_unsubscribe_and_drop_connection_clean_the_index():
    fan = FanOut()
    a = Conn()
    fan.subscribe(a, "s", [f({"kinds": [1]})])
    fan.subscribe(a, "t", [f({})])
    assert fan.count_for(a) == 2
    assert fan.unsubscribe(a, "s")
    fan.drop_connection(a)
    assert len(fan) == 0 and not fan._index and not fan._by_conn and not fan._classes


def test_a_req_replacing_the_connections_only_subscription_stays_registered():
    """A REQ with the id of the connection's only open subscription replaces it: the new
    one is current, counted and delivered to; the old one is gone (its filter matches
    nothing any more)."""
    fan = FanOut()
    a = Conn()
    old = fan.subscribe(a, "s", [f({"kinds": [1]})])
    new = fan.subscribe(a, "s", [f({"kinds": [7]})])
    assert fan.is_current(new) and not fan.is_current(old)
    assert fan.count_for(a) == 1 and len(fan) == 1 and fan.get(a, "s") is new
    for kind in (1, 7):
        e = ev(SK[0], kind=kind)
        fan.publish(e, encode_event(e))
    assert a.frames == [b'["EVENT","s",' + encode_event(ev(SK[0], kind=7)) + b"]"]
    assert fan.unsubscribe(a, "s") and len(fan) == 0 and not fan._by_conn


def test_equal_filters_share_a_verdict_but_not_a_gate():
    """Subscriptions with equal filters are matched once per event; the engram gate is
    still per connection."""
    fan = FanOut()
    owner, agent = ev(SK[1]).pubkey, ev(SK[0]).pubkey
    e = ev(SK[0], kind=30174, tags=[("d", "ab" * 32), ("p", owner)])
    conns = [Conn(owner), Conn(None), Conn(agent), Conn(ev(SK[2]).pubkey)]
    for c in conns:
        fan.subscribe(c, "same", [f({"kinds": [30174], "authors": [agent]})])
    fan.subscribe(conns[0], "other", [f({"authors": [agent], "kinds": [30174]})])
    fan.subscribe(conns[1], "miss", [f({"kinds": [30174], "since": 101})])
    assert fan.publish(e, encode_event(e)) == 3
    assert [len(c.frames) for c in conns] == [2, 0, 1, 0]
    assert len(fan._classes) == 2  # key order in the filter does not matter


def test_engrams_reach_only_author_and_owner():
    fan = FanOut()
    agent, owner, stranger, anon = (
        Conn(ev(SK[0]).pubkey),
        Conn(ev(SK[1]).pubkey),
        Conn(ev(SK[2]).pubkey),
        Conn(None),
    )
    for c in (agent, owner, stranger, anon):
        fan.subscribe(c, "all", [f({})])
    e = ev(SK[0], kind=30174, tags=[("d", "0" * 64), ("p", owner.authed)])
    fan.publish(e, encode_event(e))
    assert len(agent.frames) == 1 and len(owner.frames) == 1
    assert stranger.frames == [] and anon.frames == []


def test_pending_subscription_buffers_until_live():
    fan = FanOut()
    a = Conn()
    sub = fan.subscribe(a, "s", [f({})], pending=True)
    e1, e2 = ev(SK[0], created_at=1), ev(SK[0], created_at=2)
    fan.publish(e1, encode_event(e1))
    fan.publish(e2, encode_event(e2))
    assert a.frames == []
    fan.go_live(sub, {e1.id})  # e1 was already in the stored results
    assert a.frames == [b'["EVENT","s",' + encode_event(e2) + b"]"]


def test_pending_overflow_closes_the_subscription_and_is_counted():
    """Past PENDING_MAX live events during a stored read nothing is dropped silently: the
    subscription is CLOSED with a reason and counted in /metrics."""
    from relay import fanout, metrics

    def overflows() -> float:
        return metrics.REGISTRY.get_sample_value("engram_pending_overflows_total") or 0.0

    before = overflows()
    fan = FanOut()
    a, b = Conn(), Conn()
    sub = fan.subscribe(a, "s", [f({})], pending=True)
    fan.subscribe(b, "live", [f({})])
    es = [ev(SK[0], created_at=i) for i in range(fanout.PENDING_MAX + 1)]
    for e in es:
        fan.publish(e, encode_event(e))
    assert a.frames == [
        b'["CLOSED","s","error: too many live events arrived while stored'
        b' ones were read; subscribe again"]'
    ]
    assert not fan.is_current(sub) and fan.count_for(a) == 0
    assert len(b.frames) == len(es)  # other subscriptions are untouched
    assert overflows() == before + 1
    fan.go_live(sub, set())  # the stored read finishing later sends nothing more
    assert len(a.frames) == 1


WORDS = ["quick", "Fox", "fox!", "a", "-", "brown-fox", "été"]  # words, cases, no word at all
filters = st.fixed_dictionaries(
    {},
    optional={
        "kinds": st.lists(st.sampled_from([1, 7, 30000]), max_size=2),
        "authors": st.lists(st.sampled_from([ev(k).pubkey for k in SK]), max_size=2),
        "#t": st.lists(st.sampled_from(["a", "b"]), max_size=2),
        "since": st.integers(0, 5),
        "until": st.integers(0, 5),
        "search": st.lists(st.sampled_from(WORDS), max_size=3).map(" ".join),
    },
)
events = st.builds(
    ev,
    st.sampled_from(SK),
    st.sampled_from([1, 7, 30000]),
    st.lists(st.tuples(st.sampled_from(["t", "e", "d"]), st.sampled_from(["a", "b"])), max_size=2),
    st.integers(0, 5),
    st.lists(st.sampled_from(WORDS), max_size=4).map(" ".join),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(filters, min_size=1, max_size=3), max_size=6), events)
def test_index_agrees_with_a_linear_scan(subs, event):
    fan = FanOut()
    conns = []
    for i, fs in enumerate(subs):
        c = Conn()
        conns.append((c, [f(x) for x in fs]))
        fan.subscribe(c, f"s{i}", conns[-1][1])
    fan.publish(event, encode_event(event))
    for c, fs in conns:
        assert len(c.frames) == (1 if matches_any(fs, event) else 0)


def test_search_words_are_read_once_and_index_the_subscription(monkeypatch):
    """A live search is tokenized when it subscribes and indexed under one of its words:
    an event sharing no word with any query is matched against none of them, however
    many there are or however long they are (issue 37: every event re-tokenized every
    query); one that shares a word is matched with NIP-50's semantics."""
    from relay import fanout, filters

    calls = {"matches": 0, "query_words": 0}
    matches_any = fanout.matches_any
    query_words = filters.query_words

    def counting_matches(*args, **kwargs):
        calls["matches"] += 1
        return matches_any(*args, **kwargs)

    def counting_words(query):
        calls["query_words"] += 1
        return query_words(query)

    monkeypatch.setattr(fanout, "matches_any", counting_matches)
    monkeypatch.setattr(fanout, "query_words", counting_words)
    fan = FanOut()
    conns = [Conn() for _ in range(50)]
    for i, c in enumerate(conns):
        query = " ".join(f"w{i}x{j}" for j in range(32))  # distinct words, nothing shared
        fan.subscribe(c, "s", [f({"search": query}), f({"search": f"other{i}", "kinds": [1]})])
    hit = Conn()
    fan.subscribe(hit, "s", [f({"search": "Quick brown"})])
    assert calls["query_words"] == 101 and fan.searches == 51
    calls["query_words"] = 0
    miss = ev(SK[0], content="nothing any query asks for " * 100)
    assert fan.publish(miss, encode_event(miss)) == 0
    assert calls == {"matches": 0, "query_words": 0}
    brown = ev(SK[0], content="the quick, BROWN fox")
    assert fan.publish(brown, encode_event(brown)) == 1 and len(hit.frames) == 1
    assert calls == {"matches": 1, "query_words": 0}
    only_quick = ev(SK[0], content="quick only")
    assert fan.publish(only_quick, encode_event(only_quick)) == 0  # every word must be there
    engram = ev(SK[0], kind=30174, tags=[("d", "x")], content="quick brown")
    assert fan.publish(engram, encode_event(engram)) == 0  # ciphertext never matches
    for c in [*conns, hit]:
        fan.drop_connection(c)
    assert fan.searches == 0 and not fan._words and not fan._index
