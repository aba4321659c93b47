"""The recall index between runs: one file per agent/owner pair and model, under the user's
data directory, mode 0600, encrypted.

Slugs and values (and the words of the lexical index, made from them) are decrypted memory,
so the whole payload is sealed with AES-256-GCM under a key derived from the pair's NIP-44
conversation key (HKDF-SHA256, its own label): only a holder of the agent's or the owner's
secret key can read or forge it. The header (format, agent, owner, model) is the AEAD's
associated data. A file that is not ours, not this pair's, another model's, truncated or
tampered fails to open and the index is rebuilt from the relays; nothing in it is trusted
before the tag checks. The relays stay the truth: deleting the file loses nothing.

Vectors are stored as int8 with a scale per row (a quarter of float32; the recall figures
in bench/RESULTS.md are measured through this cache).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from cli.memory.recall.index import Known, RecallIndex, ranked
from cli.memory.recall.lexical import Terms
from cli.nostr.files import data_dir

# 4: resolved dates in the terms, titles without numbers; 5: core's profile kept (its
# people resolved in the terms)
MAGIC = b"engram-recall-cache/5\n"
KEY_LABEL = b"engram/recall-cache/v1"
CHUNK = 1 << 20  # bytes encrypted or decrypted at a time


def default_dir() -> Path:
    return data_dir("recall")


class Payload(msgspec.Struct, array_like=True):
    slugs: list[str]
    ids: list[str]
    created: list[int]
    values: list[str | None]
    live_vectors: bytes  # int8, rows of the live entries in order
    scales: bytes  # float32 per live row
    relays: dict[str, int]  # relay -> newest created_at it has given us
    checked: dict[str, float]  # relay -> when it was last read exactly (unix seconds)
    seen_at: list[int]  # events seen that are no head (older versions, invalid): their
    seen_ids: bytes  # created_at and ids, so that NIP-77 does not fetch them again
    # the live entries' lexical terms (lexical.Terms; int32 arrays): no re-tokenizing
    vocab: list[str]
    term_counts: bytes
    term_ids: bytes
    term_tfs: bytes
    term_lengths: bytes
    # per entry, in `slugs` order: (version, trust, role, valid_from, valid_until)
    about: list[tuple[str, str | None, str, int | None, int | None]]


class CacheFile:
    """The cache of one memory (agent, owner) for one embedding model."""

    def __init__(
        self, directory: Path | None, agent: str, owner: str, model: str, conversation_key: bytes
    ) -> None:
        self.directory = directory or default_dir()
        self.header = MAGIC + f"{agent}\n{owner}\n{model}\n".encode()
        name = hashlib.sha256(self.header).hexdigest()[:32]
        self.path = self.directory / f"{name}.bin"
        self._key = HKDF(hashes.SHA256(), 32, salt=None, info=KEY_LABEL).derive(conversation_key)

    def _open_file(self) -> bytearray | None:
        """The decrypted payload, or None when there is none or it fails to open. AES-GCM
        a MiB at a time (header | nonce | ciphertext | tag, as AESGCM writes it): the file
        and its plaintext are never both in memory, and nothing is used before the tag
        checks."""
        try:
            fh = self.path.open("rb")
        except OSError:
            return None
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size < len(self.header) + 12 + 16 or fh.read(len(self.header)) != self.header:
                return None
            nonce = fh.read(12)
            body = size - len(self.header) - 12 - 16
            fh.seek(size - 16)
            tag = fh.read(16)
            fh.seek(len(self.header) + 12)
            dec = Cipher(algorithms.AES(self._key), modes.GCM(nonce, tag)).decryptor()
            dec.authenticate_additional_data(self.header)
            plain = bytearray(body + 15)  # update_into wants room for a block more
            view, at = memoryview(plain), 0
            while at < body:
                chunk = fh.read(min(CHUNK, body - at))
                if not chunk:
                    return None
                at += dec.update_into(chunk, view[at:])
            try:
                at += len(dec.finalize())
            except InvalidTag:
                return None
            view.release()
        del plain[at:]
        return plain

    def load(self, index: RecallIndex) -> Payload | None:
        """Fill `index` from the file; None (index untouched) when there is none or it fails
        to open for any reason: the caller then builds from the relays."""
        plain = self._open_file()
        if plain is None:
            return None
        try:
            payload = msgspec.msgpack.decode(plain, type=Payload)
            del plain
            n = len(payload.slugs)
            sizes = (len(payload.ids), len(payload.created), len(payload.values))
            if sizes != (n, n, n) or len(payload.about) != n:
                return None
            if n and min(payload.created) < 0:  # NIP-77 could not name it: not ours
                return None
            pairs = zip(payload.slugs, payload.values, strict=True)
            live = sum(ranked(s, Known("", 0, v)) for s, v in pairs)
            dim = index.embedder.dim
            q = np.frombuffer(payload.live_vectors, dtype=np.int8)
            scales = np.frombuffer(payload.scales, dtype=np.float32)
            if q.size != live * dim or scales.size != live:
                return None
            if len(payload.seen_ids) != 32 * len(payload.seen_at):
                return None
            terms = Terms(
                payload.vocab,
                np.frombuffer(payload.term_counts, dtype=np.int32),
                np.frombuffer(payload.term_ids, dtype=np.int32),
                np.frombuffer(payload.term_tfs, dtype=np.int32),
                np.frombuffer(payload.term_lengths, dtype=np.int32),
            )
            total = int(terms.counts.sum())
            if not (len(terms.counts) == len(terms.lengths) == live):
                return None
            if not (len(terms.ids) == len(terms.tfs) == total) or (terms.counts < 0).any():
                return None
            if total and not (terms.ids.min() >= 0 and terms.ids.max() < len(terms.vocab)):
                return None
        except (InvalidTag, ValueError, msgspec.DecodeError, msgspec.ValidationError):
            return None
        vectors = (q.reshape(live, dim), scales)
        index.put(
            {
                s: Known(i, c, v, *about)
                for s, i, c, v, about in zip(
                    payload.slugs,
                    payload.ids,
                    payload.created,
                    payload.values,
                    payload.about,
                    strict=True,
                )
            },
            vectors,
            terms,
        )
        return payload

    def save(
        self,
        index: RecallIndex,
        relays: dict[str, int],
        checked: dict[str, float],
        seen: dict[str, int],
        unchanged: Callable[[], bool] | None = None,
    ) -> bool:
        """Write the index atomically (a temporary file in the same directory, renamed).
        The payload is encoded a member at a time straight into the cipher (`_encoded`):
        at 100,000 memories the whole msgpack payload is 57 MB, and holding it beside the
        index put the saving process's peak RSS past 400 MB (bench recall speed).

        `unchanged`, for a save in a thread while the event loop keeps the index (the
        updater's background save): asked before the rename, and when the index changed
        while it was read (or reading it failed because it did) nothing is written and
        False is returned; the caller saves again later."""
        nonce = os.urandom(12)
        enc = Cipher(algorithms.AES(self._key), modes.GCM(nonce)).encryptor()
        enc.authenticate_additional_data(self.header)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".recall-", dir=self.directory)  # mode 0600
        try:
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(self.header + nonce)
                    for part in _encoded(index, relays, checked, seen):
                        view = memoryview(part)
                        for at in range(0, len(view), CHUNK):
                            fh.write(enc.update(view[at : at + CHUNK]))
                        del view, part
                    fh.write(enc.finalize() + enc.tag)
            except (RuntimeError, KeyError, IndexError, ValueError):
                if unchanged is None or unchanged():
                    raise
            if unchanged is not None and not unchanged():  # read while it changed
                os.unlink(tmp)
                return False
            os.replace(tmp, self.path)
            return True
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _raw(a: np.ndarray) -> memoryview:
    """The array's bytes, without a copy (as bytes, not a cast: a cast refuses an empty
    2-D array, the vectors of a memory with nothing live)."""
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


# `Payload` as msgpack, written a member at a time: its array header, then each member in
# the order of its fields (checked here, so that a new field cannot be written out of
# place); what `load` decodes is exactly `msgspec.msgpack.encode(payload)`'s format.
_FIELDS = (
    "slugs", "ids", "created", "values", "live_vectors", "scales", "relays", "checked",
    "seen_at", "seen_ids", "vocab", "term_counts", "term_ids", "term_tfs", "term_lengths",
    "about",
)  # fmt: skip
if Payload.__struct_fields__ != _FIELDS:  # pragma: no cover
    raise ImportError("cli.memory.recall.cache: _FIELDS must follow Payload's fields")
_ARRAY_HEADER = msgspec.msgpack.encode([None] * len(_FIELDS))[: -len(_FIELDS)]


def _bin(a: np.ndarray) -> Iterator[bytes | memoryview]:
    """An array's bytes as a msgpack bin (bin 32), without copying them."""
    raw = _raw(a)
    yield b"\xc6" + len(raw).to_bytes(4, "big")
    yield raw


def _encoded(
    index: RecallIndex, relays: dict[str, int], checked: dict[str, float], seen: dict[str, int]
) -> Iterator[bytes | memoryview]:
    """The payload of `index`, a member at a time (each made when it is written)."""
    encode = msgspec.msgpack.encode
    slugs = list(index.heads)
    known = [index.heads[s] for s in slugs]
    live = [s for s, k in zip(slugs, known, strict=True) if ranked(s, k)]
    yield _ARRAY_HEADER
    yield encode(slugs)
    yield encode([k.event_id for k in known])
    yield encode([k.created_at for k in known])
    yield encode([k.value for k in known])
    q, scales = index.quantized(live)
    yield from _bin(q)
    del q
    yield from _bin(scales)
    yield encode(relays)
    yield encode(checked)
    yield encode(list(seen.values()))
    yield encode(b"".join(bytes.fromhex(i) for i in seen))
    terms = index.terms_of(live)
    yield encode(terms.vocab)
    for array in (terms.counts, terms.ids, terms.tfs, terms.lengths):
        yield from _bin(array)
    del terms
    yield encode([(k.version, k.trust, k.role, k.valid_from, k.valid_until) for k in known])
