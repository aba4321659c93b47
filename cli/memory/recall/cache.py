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
import warnings
from pathlib import Path

import msgspec
import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from cli.memory.recall.index import Known, RecallIndex, dequantize, quantize

MAGIC = b"engram-recall-cache/2\n"  # 2: each entry's version, trust, role and validity
KEY_LABEL = b"engram/recall-cache/v1"
APP_NAME = "engram-relay"  # the same data directory as `engram serve`'s embedded PostgreSQL


def default_dir() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import platformdirs

        return Path(platformdirs.user_data_dir(APP_NAME)) / "recall"


class Payload(msgspec.Struct, array_like=True):
    slugs: list[str]
    ids: list[str]
    created: list[int]
    values: list[str | None]
    live_vectors: bytes  # int8, rows of the live entries in order
    scales: bytes  # float32 per live row
    relays: dict[str, int]  # relay -> newest created_at it has given us
    checked: float = 0.0  # when the last exact reconciliation ran (unix seconds)
    # per entry, in `slugs` order: (version, trust, role, valid_from, valid_until)
    about: list[tuple[str, str | None, str, int | None, int | None]] = []


class CacheFile:
    """The cache of one memory (agent, owner) for one embedding model."""

    def __init__(
        self, directory: Path | None, agent: str, owner: str, model: str, conversation_key: bytes
    ) -> None:
        self.directory = directory or default_dir()
        self.header = MAGIC + f"{agent}\n{owner}\n{model}\n".encode()
        name = hashlib.sha256(self.header).hexdigest()[:32]
        self.path = self.directory / f"{name}.bin"
        key = HKDF(hashes.SHA256(), 32, salt=None, info=KEY_LABEL).derive(conversation_key)
        self._aead = AESGCM(key)

    def load(self, index: RecallIndex) -> Payload | None:
        """Fill `index` from the file; None (index untouched) when there is none or it fails
        to open for any reason: the caller then builds from the relays."""
        try:
            data = self.path.read_bytes()
        except OSError:
            return None
        try:
            if not data.startswith(self.header) or len(data) < len(self.header) + 12 + 16:
                return None
            nonce = data[len(self.header) : len(self.header) + 12]
            plain = self._aead.decrypt(nonce, data[len(self.header) + 12 :], self.header)
            payload = msgspec.msgpack.decode(plain, type=Payload)
            n = len(payload.slugs)
            sizes = (len(payload.ids), len(payload.created), len(payload.values))
            if sizes != (n, n, n) or len(payload.about) != n:
                return None
            live = sum(v is not None for v in payload.values)
            dim = index.embedder.dim
            q = np.frombuffer(payload.live_vectors, dtype=np.int8)
            scales = np.frombuffer(payload.scales, dtype=np.float32)
            if q.size != live * dim or scales.size != live:
                return None
        except (InvalidTag, ValueError, msgspec.DecodeError, msgspec.ValidationError):
            return None
        vectors = dequantize(q.reshape(live, dim), scales)
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
        )
        return payload

    def save(self, index: RecallIndex, relays: dict[str, int], checked: float) -> None:
        """Write the index atomically (a temporary file in the same directory, renamed)."""
        slugs = list(index.heads)
        known = [index.heads[s] for s in slugs]
        live_slugs, vectors = index.vectors()
        order = {s: i for i, s in enumerate(live_slugs)}
        rows = [order[s] for s, k in zip(slugs, known, strict=True) if k.value is not None]
        vectors = vectors[rows] if rows else np.zeros((0, index.embedder.dim), np.float32)
        q, scales = quantize(vectors)
        payload = Payload(
            slugs,
            [k.event_id for k in known],
            [k.created_at for k in known],
            [k.value for k in known],
            q.tobytes(),
            scales.tobytes(),
            relays,
            checked,
            [(k.version, k.trust, k.role, k.valid_from, k.valid_until) for k in known],
        )
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, msgspec.msgpack.encode(payload), self.header)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".recall-", dir=self.directory)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(self.header + nonce + sealed)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
