"""Diversified retrieval: keep the actor from seeing the same few entries every episode.

From the Complementary RL paper and its code: fetch ``oversample × k`` nearest candidates, then
rank them by

    score = −rank − λ·log1p(retrieve_count) − 1[retrieved within the last ``recent_window_s``]

(``rank`` is the candidate's 0-based similarity rank). With probability ``dropout_p`` the first
of the top-``k`` that was used recently is moved to the end of the ranking (a "dropout move"),
which lets the next candidate in. The returned entries' usage stats are then updated.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass

import numpy as np

from crl_agent.experience.bank import ExperienceBank, ExperienceEntry


@dataclass(frozen=True)
class DiversityConfig:
    """Knobs of the diversified retrieval (defaults from the paper's code).

    Attributes:
        oversample: candidates fetched per wanted entry.
        lam: weight of the ``log1p(retrieve_count)`` penalty.
        recent_window_s: entries retrieved within this many seconds pay a penalty of 1.
        dropout_p: probability of the dropout move.
    """

    oversample: int = 16
    lam: float = 0.4
    recent_window_s: float = 300.0
    dropout_p: float = 0.5


def _recent(entry: ExperienceEntry, now: float, window: float) -> bool:
    return entry.last_retrieved is not None and now - entry.last_retrieved < window


def diversify(
    candidates: list[ExperienceEntry],
    k: int,
    config: DiversityConfig,
    rng: np.random.Generator,
    now: float,
) -> list[ExperienceEntry]:
    """Pick ``k`` of ``candidates`` (given best-first by similarity) by the diversified score."""
    scored = []
    for rank, e in enumerate(candidates):
        recent = _recent(e, now, config.recent_window_s)
        score = -rank - config.lam * math.log1p(e.retrieve_count) - (1.0 if recent else 0.0)
        scored.append((score, rank, e))
    order = [e for _, _, e in sorted(scored, key=lambda s: (-s[0], s[1]))]
    if len(order) > k and rng.random() < config.dropout_p:
        for i, e in enumerate(order[:k]):
            if _recent(e, now, config.recent_window_s):
                order.append(order.pop(i))
                break
    return order[:k]


class Retriever:
    """Diversified search over a bank, with a seeded RNG for the dropout move.

    Args:
        bank: the experience bank.
        config: diversification knobs.
        seed: seed of the dropout-move RNG.
    """

    def __init__(self, bank: ExperienceBank, config: DiversityConfig | None = None, seed: int = 0):
        self.bank = bank
        self.config = config or DiversityConfig()
        self.rng = np.random.default_rng(seed)

    def select(
        self, hits: list[tuple[int, float]], k: int, now: float | None = None, record: bool = True,
        key: str = "",
    ) -> list[ExperienceEntry]:
        """Diversify nearest-neighbour ``hits`` (best first) to ``k`` entries and update usage stats.

        ``record=False`` (a held-out episode) changes nothing a later search depends on: no usage stats, and
        the dropout move draws from an RNG of its own seeded by ``key`` (e.g. the query), not the
        retriever's, so training searches after it see the same draws as without it."""
        now = time.time() if now is None else now
        candidates = self.bank.get_many([i for i, _ in hits])
        rng = self.rng if record else np.random.default_rng(zlib.crc32(key.encode("utf-8", "replace")))
        chosen = diversify(candidates, k, self.config, rng, now)
        if record and chosen:
            self.bank.record_retrieval([e.id for e in chosen], now)
        return chosen

    def retrieve(self, query: str, k: int = 4, task: str | None = None, now: float | None = None) -> list[ExperienceEntry]:
        """The ``k`` diversified entries for ``query`` (optionally within one task)."""
        if k <= 0:
            return []
        q = self.bank.embedder.embed([query])
        hits = self.bank.search_vectors(q, k * self.config.oversample, task)[0]
        return self.select(hits, k, now)


def near_duplicates(
    bank: ExperienceBank,
    task: str,
    threshold: float,
    since: float = 0.0,
    neighbours: int = 8,
    max_cluster: int = 5,
) -> list[list[ExperienceEntry]]:
    """Clusters of ``task``'s entries linked by cosine similarity >= ``threshold`` (union-find).

    Only entries updated at or after ``since`` seed the neighbour search (the rest were examined
    by an earlier pass); clusters larger than ``max_cluster`` are split into chunks.
    """
    entries = bank.entries(task)
    seeds = [e for e in entries if e.updated >= since]
    if len(entries) < 2 or not seeds:
        return []
    parent = {e.id: e.id for e in entries}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    hits = bank.search_vectors(bank.embeddings([e.id for e in seeds]), neighbours + 1, task)
    for e, row in zip(seeds, hits, strict=True):
        for j, sim in row:
            if j != e.id and j in parent and sim >= threshold:
                parent[root(j)] = root(e.id)
    groups: dict[int, list[ExperienceEntry]] = {}
    for e in entries:
        groups.setdefault(root(e.id), []).append(e)
    return [g[s : s + max_cluster] for g in groups.values() for s in range(0, len(g), max_cluster) if len(g[s : s + max_cluster]) >= 2]
