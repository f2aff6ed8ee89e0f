"""The bank's vector index: hnswlib (cosine), saved as generation-stamped files.

A folder holds ``index-<generation>.hnsw`` and ``index.json`` (``generation``, ``dim``, ``count``).
:meth:`VectorIndex.save` writes the index file, then the JSON, each through a temporary file,
``fsync`` and an atomic rename, so the JSON never names a torn file. :meth:`VectorIndex.load`
returns ``None`` unless the saved generation and count match what the caller (SQLite) says and
the file's header has the caller's dimension (hnswlib itself would read a file of another
dimension without complaint, and return garbage); the caller then rebuilds from its stored vectors.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

MIN_CAPACITY = 1024


def _hnswlib():
    try:
        import hnswlib
    except ImportError as e:
        raise ImportError('the experience bank needs hnswlib: pip install "crl-bench[agent]"') from e
    return hnswlib


def _header_fits(path: Path, dim: int, count: int) -> bool:
    """Whether an hnswlib file's header describes ``dim``-float vectors and at least ``count`` elements.

    The header starts with six little-endian ``size_t``: level-0 offset, capacity, element count,
    bytes per element, label offset and data offset; label offset minus data offset is the vector size.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(48)
    except OSError:
        return False
    if len(head) < 48:
        return False
    _, capacity, elements, _, label_offset, data_offset = struct.unpack("<6Q", head)
    return label_offset - data_offset == 4 * dim and count <= elements <= capacity


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class VectorIndex:
    """An hnswlib cosine index keyed by integer ids, growing on demand.

    Args:
        dim: vector dimension.
        m, ef_construction: graph parameters.
        capacity: initial number of slots (it doubles when full).
    """

    def __init__(self, dim: int, *, m: int = 32, ef_construction: int = 400, capacity: int = MIN_CAPACITY):
        self.dim = dim
        self._h = _hnswlib().Index(space="cosine", dim=dim)
        self._h.init_index(max_elements=max(MIN_CAPACITY, capacity), ef_construction=ef_construction, M=m)

    @classmethod
    def load(cls, folder: Path, generation: int, count: int, dim: int) -> VectorIndex | None:
        """The index saved at ``generation`` with ``count`` live entries, or ``None`` if missing, stale or torn."""
        try:
            meta = json.loads((folder / "index.json").read_text())
        except (OSError, ValueError):
            return None
        path = folder / f"index-{generation}.hnsw"
        if not isinstance(meta, dict) or (meta.get("generation"), meta.get("dim"), meta.get("count")) != (
            generation, dim, count
        ):
            return None
        if not _header_fits(path, dim, count):
            return None
        self = cls.__new__(cls)
        self.dim = dim
        self._h = _hnswlib().Index(space="cosine", dim=dim)
        try:
            self._h.load_index(str(path), max_elements=max(MIN_CAPACITY, 2 * count))
        except (RuntimeError, MemoryError, ValueError):
            return None
        return self

    @classmethod
    def build(cls, dim: int, count: int, batches: Iterable[tuple[np.ndarray, np.ndarray]], **params: int) -> VectorIndex:
        """A fresh index from ``(ids, vectors)`` batches."""
        self = cls(dim, capacity=2 * count, **params)
        for ids, vecs in batches:
            self.add(vecs, ids)
        return self

    def save(self, folder: Path, generation: int, count: int) -> None:
        """Write ``index-<generation>.hnsw`` and point ``index.json`` at it; older index files are removed."""
        target = folder / f"index-{generation}.hnsw"
        tmp = target.with_suffix(".tmp")
        self._h.save_index(str(tmp))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
        tmp_meta = folder / "index.json.tmp"
        with open(tmp_meta, "w") as f:
            json.dump({"generation": generation, "dim": self.dim, "count": count}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_meta, folder / "index.json")
        _fsync_dir(folder)
        for old in folder.glob("index-*.hnsw"):
            if old != target:
                old.unlink(missing_ok=True)

    def add(self, vecs: np.ndarray, ids: np.ndarray | list[int]) -> None:
        """Insert vectors (an existing id gets its vector replaced)."""
        need = self._h.get_current_count() + len(ids)
        if need > self._h.get_max_elements():
            self._h.resize_index(max(need, 2 * self._h.get_max_elements()))
        self._h.add_items(np.asarray(vecs, dtype=np.float32), np.asarray(ids, dtype=np.int64))

    def mark_deleted(self, ids: Iterable[int]) -> None:
        """Hide ids from searches; ids that are absent or already deleted are ignored."""
        for i in ids:
            try:
                self._h.mark_deleted(int(i))
            except RuntimeError:
                pass

    def knn(
        self, queries: np.ndarray, k: int, ef: int, allowed: set[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Labels and cosine similarities of the ``k`` nearest (within ``allowed``), per query row.

        The search keeps ``max(ef, 2 * k)`` candidates: one that keeps only as many as it returns
        (the manager fetches 64 for its diversified top 4) misses many of the true neighbours.

        Raises:
            RuntimeError: fewer than ``k`` reachable candidates (e.g. after many deletions).
        """
        self._h.set_ef(max(ef, 2 * k))
        labels, dists = self._h.knn_query(
            queries, k=k, num_threads=1, filter=None if allowed is None else allowed.__contains__
        )
        return labels, 1.0 - dists

    def get(self, ids: list[int]) -> np.ndarray:
        """The stored (unit) vectors of ``ids``.

        Raises:
            RuntimeError: an id is absent or deleted.
        """
        if not ids:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray(self._h.get_items(list(ids)), dtype=np.float32)

    def live_ids(self) -> set[int]:
        """Every id that searches can return."""
        live = set()
        for label in self._h.get_ids_list():
            try:
                self._h.get_items([label])
                live.add(int(label))
            except RuntimeError:
                pass  # marked deleted
        return live
