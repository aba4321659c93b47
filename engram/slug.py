"""NIP-AE slugs (spec: *Slugs*) and their blinded `d` tags (spec: *Addressing*).

Pure string and HMAC work. The slug never appears in a tag: only `d_tag(K_c, slug)` does.
"""

from __future__ import annotations

import hmac
import re

from engram.errors import InvalidSlugError

CORE_SLUG = "core"
MEM_PREFIX = "mem/"
SLUG_MAX_BYTES = 255
D_TAG_DOMAIN = b"agent-memory/v1/d-tag"

# fullmatch, not `$`: `$` would also accept a trailing newline.
_MEM_SLUG = re.compile(r"mem/[a-z0-9][a-z0-9_-]{0,63}(?:/[a-z0-9][a-z0-9_-]{0,63})*")


def is_valid_slug(slug: str) -> bool:
    """`core`, or `mem/…` per the grammar and at most 255 bytes (the grammar is ASCII-only)."""
    if slug == CORE_SLUG:
        return True
    return len(slug) <= SLUG_MAX_BYTES and _MEM_SLUG.fullmatch(slug) is not None


def validate_slug(slug: str) -> str:
    """Return `slug` unchanged if valid, else raise `InvalidSlugError` saying why."""
    if is_valid_slug(slug):
        return slug
    if not slug.startswith(MEM_PREFIX):
        raise InvalidSlugError(f"slug must be 'core' or start with 'mem/': {slug!r}")
    size = len(slug.encode("utf-8", "surrogatepass"))
    if size > SLUG_MAX_BYTES:
        raise InvalidSlugError(f"slug is {size} bytes, more than {SLUG_MAX_BYTES}")
    for segment in slug[len(MEM_PREFIX) :].split("/"):
        if not segment:
            raise InvalidSlugError(f"slug has an empty segment: {slug!r}")
        if len(segment) > 64:
            raise InvalidSlugError(f"slug segment longer than 64 bytes: {slug!r}")
    raise InvalidSlugError(
        f"slug segments must match [a-z0-9][a-z0-9_-]* (lower case, no dots or spaces): {slug!r}"
    )


def normalize_slug(raw: str) -> str:
    """Add a missing `mem/` prefix for the user (`"notes"` -> `"mem/notes"`), then validate.

    `core` and anything already under `mem/` pass through unchanged; so `"mem"` becomes
    `"mem/mem"`, and `"mem/"` stays invalid.
    """
    slug = raw if raw == CORE_SLUG or raw.startswith(MEM_PREFIX) else MEM_PREFIX + raw
    return validate_slug(slug)


def d_tag(conversation_key: bytes, slug: str) -> str:
    """lower_hex(HMAC-SHA256(K_c, D_TAG_DOMAIN || 0x00 || utf8(slug))); the slug is validated."""
    validate_slug(slug)
    return hmac.digest(
        conversation_key, D_TAG_DOMAIN + b"\x00" + slug.encode("ascii"), "sha256"
    ).hex()
