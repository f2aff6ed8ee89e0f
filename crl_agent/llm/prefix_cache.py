"""A prefix KV cache keyed by token ids, bounded by a memory budget (least recently used goes first).

A chat agent's prompt at turn ``t+1`` usually starts with its whole prompt from turn ``t``; so do
the prompts of a scoring policy that sends the same chat with different candidates. The backend
stores the keys and values it computed for each prompt here, and a new request looks up the stored
prompt sharing the longest run of leading token ids with it: only the tokens after that run are
run through the model. Keys and values at position ``i`` depend only on tokens ``0..i``, so any
leading slice of an entry is exact for any prompt that shares it.

Entries are ``(token ids, per-layer key/value tensors)``. An entry whose ids are a prefix of a new
entry's ids is dropped when the new one is stored (the new one answers every lookup the old one
did), so a conversation holds one entry however many turns it has. An entry that a new one branched
from (an agent that rewrites its last turn compactly each step leaves one such branch per turn) moves
to the front of the eviction order. When the stored bytes exceed ``max_bytes`` the least recently
used entries are evicted; an entry bigger than the whole budget
is never stored. :meth:`PrefixCache.clear` drops everything and bumps the cache's version; an entry
computed under an older version (a batch that was running when the weights changed) is refused.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KV = list[tuple[Any, Any]]  # per layer: (keys, values), each [1, kv_heads, length, head_dim]


@dataclass
class PrefixCacheStats:
    """Counters for tests and benchmarks."""

    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    looked_up_tokens: int = 0
    stored: int = 0
    evicted: int = 0
    refused: int = 0


@dataclass
class _Entry:
    ids: np.ndarray
    kv: KV
    nbytes: int
    key: tuple[int, ...] = field(default=())


def kv_nbytes(kv: KV) -> int:
    """Bytes held by the key and value tensors of one entry."""
    return sum(int(k.numel() * k.element_size() + v.numel() * v.element_size()) for k, v in kv)


class PrefixCache:
    """LRU cache of prompt keys/values, looked up by longest shared token-id prefix.

    Args:
        max_bytes: memory budget for all entries; 0 disables the cache (every lookup misses).
    """

    def __init__(self, max_bytes: int):
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"prefix cache max_bytes must be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.version = 0
        self.stats = PrefixCacheStats()
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held now (never above ``max_bytes``)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, ids: list[int], limit: int | None = None) -> tuple[int, KV | None]:
        """The longest stored prefix of ``ids`` (at most ``limit`` tokens): ``(length, kv)``.

        ``kv`` holds views of the stored tensors cut to ``length`` (``None`` when nothing
        matched); the caller copies what it needs before the next :meth:`put`.
        """
        limit = len(ids) if limit is None else min(limit, len(ids))
        with self._lock:
            self.stats.lookups += 1
            self.stats.looked_up_tokens += len(ids)
            if limit <= 0 or not self._entries:
                return 0, None
            query = np.asarray(ids[:limit], dtype=np.int64)
            best, best_len = None, 0
            for entry in self._entries.values():
                n = min(len(entry.ids), limit)
                if n <= best_len:
                    continue
                same = entry.ids[:n] == query[:n]
                k = n if same.all() else int(same.argmin())
                if k > best_len:
                    best, best_len = entry, k
            if best is None:
                return 0, None
            self._entries.move_to_end(best.key)
            self.stats.hits += 1
            self.stats.hit_tokens += best_len
            return best_len, [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in best.kv]

    def put(self, ids: list[int], kv: KV, version: int) -> bool:
        """Store ``kv`` (owned by the cache from now on) for ``ids``; False when refused.

        Refused: the cache is disabled, the entry alone is over the budget, or ``version`` is not
        the cache's current version (the weights changed while it was computed).
        """
        if not ids:
            return False
        nbytes = kv_nbytes(kv)
        key = tuple(ids)
        with self._lock:
            if version != self.version or nbytes > self.max_bytes:
                self.stats.refused += 1
                return False
            arr = np.asarray(ids, dtype=np.int64)
            for e in self._entries.values():
                if len(e.ids) >= len(arr) and np.array_equal(e.ids[: len(arr)], arr):
                    self._entries.move_to_end(e.key)  # already held, as this entry or a longer one
                    return True
            for old_key in [k for k, e in self._entries.items()
                            if len(e.ids) <= len(arr) and np.array_equal(e.ids, arr[: len(e.ids)])]:
                self._bytes -= self._entries.pop(old_key).nbytes  # superseded: the new entry extends it
            parent = self._closest(arr)
            if parent is not None:
                # the entry this one branched from (a prompt that rewrote its last turn) is the likeliest
                # never to be asked for again: evict it before other conversations' entries
                self._entries.move_to_end(parent.key, last=False)
            self._entries[key] = _Entry(arr, kv, nbytes, key)
            self._bytes += nbytes
            self.stats.stored += 1
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.stats.evicted += 1
            return True

    def _closest(self, arr: np.ndarray) -> _Entry | None:
        """The entry sharing the longest (non-empty) prefix with ``arr``."""
        best, best_len = None, 0
        for entry in self._entries.values():
            n = min(len(entry.ids), len(arr))
            same = entry.ids[:n] == arr[:n]
            k = n if same.all() else int(same.argmin())
            if k > best_len:
                best, best_len = entry, k
        return best

    def clear(self) -> int:
        """Drop every entry and bump the version (after a weight update); returns the new version."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self.version += 1
            return self.version
