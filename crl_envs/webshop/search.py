"""BM25 product search, as the official WebShop's Lucene index but offline.

The official site searches a pyserini (Lucene) index and shows the top 50 hits, 10 per
page. We index each product's title and description with ``bm25s`` using Lucene's scoring
(``method="lucene"``) and pyserini's default parameters (k1 = 0.9, b = 0.4). The index is
built once per catalog and shared by every env in the process.

:class:`BruteForceBM25` scores every document in plain Python with the same formula; it is
the baseline ``benchmarks/webshop_step.py`` compares against, and the tests check both
rank the same products.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

try:
    import bm25s
except ImportError as e:  # pragma: no cover - exercised only without the extra
    from gymnasium.error import DependencyNotInstalled

    raise DependencyNotInstalled('WebShop search needs bm25s: pip install -e ".[webshop]"') from e

SEARCH_RETURN_N = 50
K1, B = 0.9, 0.4
_TOKEN = re.compile(r"[^\W_]+")  # runs of Unicode letters and digits: "crème" stays one word
STOPWORDS = frozenset(bm25s.stopwords.STOPWORDS_EN)


def tokenize(text: str) -> list[str]:
    """Lower-case letter-and-digit tokens (any script) without English stop words."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


def _top_k(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` best positive scores, best first, ties broken by index."""
    positive = np.flatnonzero(scores > 0)
    if positive.size == 0:
        return []
    if positive.size > k:
        part = np.argpartition(-scores[positive], k - 1)[:k]
        # keep every doc tied with the k-th score, so the index tie-break below is exact
        kth = scores[positive[part]].min()
        positive = positive[scores[positive] >= kth]
    order = np.lexsort((positive, -scores[positive]))
    return [int(i) for i in positive[order][:k]]


class SearchEngine:
    """BM25 (Lucene variant) over ``docs``, backed by bm25s' sparse score matrix.

    Args:
        docs: one text per product (title and description).
    """

    def __init__(self, docs: Sequence[str]):
        self.size = len(docs)
        self._bm25 = bm25s.BM25(method="lucene", k1=K1, b=B)
        self._bm25.index([tokenize(d) for d in docs], show_progress=False)
        self._vocab = self._bm25.vocab_dict

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (zeros where no term matches)."""
        tokens = [t for t in tokenize(query) if t in self._vocab]
        if not tokens:
            return np.zeros(self.size, dtype=np.float32)
        return self._bm25.get_scores(tokens)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Indices of the top ``k`` documents for ``query``, best first."""
        return _top_k(self.scores(query), k)


class BruteForceBM25:
    """The same ranking computed naively: every document scored in Python per query."""

    def __init__(self, docs: Sequence[str]):
        self._docs = [Counter(tokenize(d)) for d in docs]
        self._lens = [sum(c.values()) for c in self._docs]
        self._avg = sum(self._lens) / max(1, len(self._lens))
        df: Counter[str] = Counter()
        for c in self._docs:
            df.update(c.keys())
        n = len(self._docs)
        self._idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> np.ndarray:
        terms = tokenize(query)
        out = np.zeros(len(self._docs), dtype=np.float64)
        for i, (doc, dl) in enumerate(zip(self._docs, self._lens, strict=True)):
            s = 0.0
            norm = K1 * (1 - B + B * dl / self._avg)
            for t in terms:
                tf = doc.get(t)
                if tf:
                    s += self._idf[t] * tf / (tf + norm)
            out[i] = s
        return out

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        return _top_k(self.scores(query), k)
