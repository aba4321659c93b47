"""NIP-AE bodies (spec: *Bodies*): the decrypted JSON object of an engram.

`encode_body` is byte-exact with the reference vectors (slug first, no whitespace).
`parse_body` is strict where ordinary JSON parsers are lenient: msgspec and `json.loads`
keep the last of duplicate member names, and `json.loads` also accepts NaN/Infinity and
lone surrogate escapes, so two readers could disagree about one body. All are rejected.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from engram.errors import BodyTooLargeError, InvalidBodyError
from engram.slug import CORE_SLUG, validate_slug

BODY_MAX_BYTES = 65_535  # NIP44_PLAINTEXT_MAX: the body is the NIP-44 plaintext


class Memory(msgspec.Struct, frozen=True):
    """`{"slug":"mem/…","value":"…"}`: one live entry."""

    slug: str
    value: str


class Tombstone(msgspec.Struct, frozen=True):
    """`{"slug":"mem/…","value":null}`: the slug reads as absent."""

    slug: str


class Core(msgspec.Struct, frozen=True):
    """`{"slug":"core","profile":"…"}`: the agent's identity surface."""

    profile: str

    @property
    def slug(self) -> str:
        return CORE_SLUG


Body = Memory | Tombstone | Core

_MISSING: Any = object()
_encode = msgspec.json.encode  # dicts keep insertion order, so "slug" comes first


def body_text(body: Body) -> str | None:
    """The free text a body carries (`value` or `profile`); None for a tombstone."""
    if isinstance(body, Memory):
        return body.value
    if isinstance(body, Core):
        return body.profile
    return None


def encode_body(body: Body) -> bytes:
    """Serialize without whitespace, slug first; raise if over 65,535 bytes or not UTF-8."""
    obj: dict[str, str | None]
    if isinstance(body, Core):
        obj = {"slug": CORE_SLUG, "profile": body.profile}
    elif isinstance(body, Memory):
        if body.slug == CORE_SLUG:
            raise InvalidBodyError("a memory body cannot use the 'core' slug")
        obj = {"slug": validate_slug(body.slug), "value": body.value}
    elif isinstance(body, Tombstone):
        if body.slug == CORE_SLUG:
            raise InvalidBodyError("core has no tombstone; write an empty profile instead")
        obj = {"slug": validate_slug(body.slug), "value": None}
    else:
        raise InvalidBodyError(f"not a body: {type(body).__name__}")
    try:
        data = _encode(obj)
    except UnicodeEncodeError as exc:
        raise InvalidBodyError("body text contains a lone surrogate (not UTF-8)") from exc
    if len(data) > BODY_MAX_BYTES:
        raise BodyTooLargeError(f"serialized body is {len(data)} bytes, more than {BODY_MAX_BYTES}")
    return data


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise InvalidBodyError("duplicate member name in body")
    return obj


def _no_constants(name: str) -> Any:
    raise InvalidBodyError(f"{name} is not JSON")


def _check_strings(value: Any) -> None:
    """Reject lone surrogates (from `\\ud800`-style escapes) anywhere, keys included."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            item.encode("utf-8")  # raises UnicodeEncodeError on a lone surrogate
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def parse_object(text: str | bytes) -> dict[str, Any]:
    """Strict JSON: one object, no duplicate names at any depth, no NaN/Infinity,
    no lone surrogates, nothing after it. Spec: *Validity* rule 3."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        else:
            text.encode("utf-8")
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
        if "\\u" in text:  # only an escape can smuggle in a lone surrogate
            _check_strings(obj)
    except InvalidBodyError:
        raise
    except UnicodeError as exc:
        raise InvalidBodyError("body is not valid UTF-8 (lone surrogate)") from exc
    except RecursionError as exc:
        raise InvalidBodyError("body nests too deeply") from exc
    except ValueError as exc:  # json.JSONDecodeError, including "Extra data"
        why = getattr(exc, "msg", None) or str(exc)
        raise InvalidBodyError(f"body is not valid JSON: {why}") from exc
    if not isinstance(obj, dict):
        raise InvalidBodyError("body is not a JSON object")
    return obj


def slug_of(obj: dict[str, Any]) -> str:
    """The object's `slug` member if it is a valid slug (spec: rule 4, first half)."""
    slug = obj.get("slug")
    if not isinstance(slug, str):
        raise InvalidBodyError("body has no string 'slug' member")
    validate_slug(slug)
    return slug


def body_from_object(obj: dict[str, Any]) -> Body:
    """Typed body from a parsed object; unknown members ignored (spec: rule 5)."""
    slug = slug_of(obj)
    if slug == CORE_SLUG:
        profile = obj.get("profile", _MISSING)
        if not isinstance(profile, str):
            raise InvalidBodyError("core body needs a string 'profile'")
        return Core(profile=profile)
    value = obj.get("value", _MISSING)
    if value is None:
        return Tombstone(slug=slug)
    if not isinstance(value, str):
        raise InvalidBodyError("memory body needs 'value': a string or null")
    return Memory(slug=slug, value=value)


def parse_body(text: str | bytes) -> Body:
    """Strictly parse a decrypted body; raises `InvalidBodyError` or `InvalidSlugError`."""
    return body_from_object(parse_object(text))
