"""NIP-98 HTTP authorization, NIP-62 addressing and NIP-56 report parsing: the pure rules
in engram/, with events built and signed by nostr-sdk (a client nobody here wrote)."""

from __future__ import annotations

import base64
import hashlib

import msgspec
import pytest
from nostr_sdk import EventBuilder, Keys, Kind, Tag, Timestamp

from engram.nip01 import Event, sign_event
from engram.nip56 import reported_events
from engram.nip62 import names_relay
from engram.nip98 import HttpAuthError, parse_authorization, verify_authorization
from engram.urls import RelayUrl, parse_relay_url

NOW = 1_750_000_000
KEYS = Keys.parse("11" * 32)
BODY = b'{"method":"supportedmethods","params":[]}'
URLS = frozenset({RelayUrl(True, "relay.example", 443, "")})  # wss://relay.example


def header(
    url: str = "https://relay.example/",
    method: str = "POST",
    body: bytes = BODY,
    created_at: int = NOW,
    kind: int = 27235,
    payload: str | None = None,
) -> str:
    tags = [Tag.parse(["u", url]), Tag.parse(["method", method])]
    tags.append(Tag.parse(["payload", payload or hashlib.sha256(body).hexdigest()]))
    event = (
        EventBuilder(Kind(kind), "")
        .tags(tags)
        .custom_created_at(Timestamp.from_secs(created_at))
        .finalize(KEYS)
    )
    return "Nostr " + base64.b64encode(event.as_json().encode()).decode()


def verify(value: str, body: bytes = BODY, now: int = NOW) -> str:
    return verify_authorization(value, urls=URLS, path="/", method="POST", body=body, now=now)


def test_a_good_authorization_names_its_signer() -> None:
    assert verify(header()) == KEYS.public_key().to_hex()
    # https is wss seen from HTTP; the default port and a trailing slash change nothing
    for url in ("https://relay.example", "wss://relay.example:443/", "https://RELAY.example./"):
        assert verify(header(url=url)) == KEYS.public_key().to_hex()
    assert verify(header(created_at=NOW - 60)) == KEYS.public_key().to_hex()


def test_the_relay_url_is_compared_by_scheme_host_port_and_path() -> None:
    """A token made for this relay's host on another scheme or port is for another relay
    (one that may well be an attacker's: a page on http://relay.example:8080)."""
    for url in ("http://relay.example/", "ws://relay.example", "https://relay.example:8443/"):
        with pytest.raises(HttpAuthError, match="u tag"):
            verify(header(url=url))
    # a relay served under a path (behind a proxy): the path is part of its URL
    under = frozenset({RelayUrl(True, "relay.example", 443, "/nostr")})
    value = header(url="https://relay.example/nostr")
    pubkey = verify_authorization(value, urls=under, path="/", method="POST", body=BODY, now=NOW)
    assert pubkey == KEYS.public_key().to_hex()
    with pytest.raises(HttpAuthError, match="u tag"):
        verify_authorization(header(), urls=under, path="/", method="POST", body=BODY, now=NOW)


def test_relay_urls_normalize() -> None:
    same = ("wss://Relay.Example:443/", "wss://relay.example", "https://relay.example/")
    assert {parse_relay_url(u) for u in same} == {RelayUrl(True, "relay.example", 443, "")}
    assert parse_relay_url("ws://[0:0::1]:7777") == RelayUrl(False, "::1", 7777, "")
    assert str(RelayUrl(False, "::1", 7777, "")) == "ws://[::1]:7777"
    for bad in (
        "ftp://relay.example",
        "wss://",
        "relay.example",
        "wss://a@relay.example",
        "wss://relay.example:99999",
    ):
        assert parse_relay_url(bad) is None, bad


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "missing Authorization"),
        ("Bearer abc", "Nostr <base64"),
        ("Nostr !!!", "not base64"),
        ("Nostr " + base64.b64encode(b'{"kind": 1}').decode(), "not a Nostr event"),
        (header(kind=1), "kind 27235"),
        (header(url="https://other.example/"), "u tag"),
        (header(url="https://relay.example/admin"), "u tag"),
        (header(url="ftp://relay.example/"), "u tag"),
        (header(method="GET"), "method"),
        (header(payload="00" * 32), "payload"),
        (header(created_at=NOW - 61), "created_at"),
        (header(created_at=NOW + 61), "created_at"),
    ],
    # named ids: the signed headers differ per run (random BIP-340 aux), and pytest-xdist
    # workers must collect the same test ids
    ids=[
        "empty",
        "bearer",
        "not-base64",
        "not-an-event",
        "wrong-kind",
        "other-host",
        "other-path",
        "other-scheme",
        "wrong-method",
        "wrong-payload",
        "too-old",
        "too-new",
    ],
)
def test_each_refusal_says_why(value: str, why: str) -> None:
    with pytest.raises(HttpAuthError, match=why):
        verify(value)


def test_a_body_other_than_the_signed_one_is_refused() -> None:
    with pytest.raises(HttpAuthError, match="payload"):
        verify(header(), body=BODY + b" ")


def test_a_forged_signature_is_refused() -> None:
    event = parse_authorization(header())
    event.sig = "00" * 64
    forged = "Nostr " + base64.b64encode(msgspec.json.encode(event)).decode()
    with pytest.raises(HttpAuthError, match="signature"):
        verify(forged)


def _event(kind: int, tags: list[list[str]], content: str = "") -> Event:
    return sign_event(bytes.fromhex("22" * 32), NOW, kind, tags, content, bytes(32))


def test_a_request_to_vanish_names_relays_by_url_or_all() -> None:
    urls = frozenset({RelayUrl(True, "a.test", 443, ""), RelayUrl(False, "a.test", 7777, "")})
    assert names_relay(_event(62, [["relay", "wss://a.test"]]), urls)
    assert names_relay(_event(62, [["relay", "ws://A.test:7777/"]]), urls)
    assert names_relay(_event(62, [["relay", "ALL_RELAYS"]]), urls)
    assert not names_relay(_event(62, [["relay", "wss://b.test"]]), urls)
    assert not names_relay(_event(62, [["relay", "wss://a.test:7777"]]), urls)  # other scheme
    assert not names_relay(_event(62, [["relay", "ws://a.test:7778"]]), urls)  # other port
    assert not names_relay(_event(62, []), urls)


def test_reports_point_at_events_with_a_reason() -> None:
    target = "ab" * 32
    report = _event(1984, [["e", target, "spam"], ["p", "cd" * 32], ["e", "bad"]])
    assert reported_events(report) == [(target, "spam")]
    plain = _event(1984, [["e", target]], "it is spam")
    assert reported_events(plain) == [(target, "it is spam")]
    assert reported_events(_event(1, [["e", target]])) == []
