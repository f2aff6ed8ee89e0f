"""A shop: products, goals in a fixed order, their splits, and the search index.

Shops are built once per process and shared by every env (``generated_shop``,
``official_shop``); the search index is built on first use.

Splits follow the official WebShop baselines (``baseline_models/env.py``) over the goal
list in its fixed order: ``test`` = goals 0-499, ``eval`` = goals 500-1499, ``train`` = the
rest, ``all`` = every goal. For the generated shop the order is the generator's (seeded);
for the official data it is the official shuffle (seed 233).
"""

from __future__ import annotations

import functools
import os
import time

from crl_envs.webshop.catalog import Goal, Product, load_or_generate
from crl_envs.webshop.official import load_official
from crl_envs.webshop.search import SEARCH_RETURN_N, SearchEngine

SPLITS: dict[str, tuple[int, int | None]] = {"test": (0, 500), "eval": (500, 1500), "train": (1500, None),
                                             "all": (0, None)}
DEFAULT_NUM_PRODUCTS = 5000
DEFAULT_NUM_GOALS = 6000


class Shop:
    """Products, goals and search for one catalog."""

    def __init__(self, products: list[Product], goals: list[Goal], name: str):
        self.name = name
        self.products = products
        self.goals = goals
        self.by_asin = {p.asin: p for p in products}
        self._engine: SearchEngine | None = None
        self.index_seconds = 0.0
        missing = [g.asin for g in goals if g.asin not in self.by_asin]
        if missing:
            raise ValueError(f"{name}: {len(missing)} goals name products not in the catalog, e.g. {missing[0]}")

    @property
    def engine(self) -> SearchEngine:
        """The BM25 index over titles and descriptions (built on first use)."""
        if self._engine is None:
            t = time.perf_counter()
            self._engine = SearchEngine([f"{p.title} {p.description}" for p in self.products])
            self.index_seconds = time.perf_counter() - t
        return self._engine

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[Product]:
        """The top ``k`` products for ``query``, best first."""
        return [self.products[i] for i in self.engine.search(query, k)]

    def split(self, name: str) -> list[Goal]:
        """The goals of split ``name`` (``test``, ``eval``, ``train`` or ``all``)."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; use one of {sorted(SPLITS)}")
        lo, hi = SPLITS[name]
        goals = self.goals[lo:hi]
        if not goals:
            raise ValueError(f"{self.name} has {len(self.goals)} goals, so split {name!r} (goals {lo}-{hi}) is "
                             "empty; use split='all'")
        return goals


@functools.lru_cache(maxsize=8)
def generated_shop(num_products: int = DEFAULT_NUM_PRODUCTS, num_goals: int = DEFAULT_NUM_GOALS,
                   seed: int = 0) -> Shop:
    """The generated shop for these settings (disk- and process-cached)."""
    products, goals = load_or_generate(num_products, num_goals, seed)
    return Shop(products, goals, f"generated catalog (seed {seed}, {num_products} products)")


def official_shop(data_dir: str | None = None, num_products: int | None = None) -> Shop:
    """The shop over the official files in ``data_dir`` (default ``$WEBSHOP_DATA``)."""
    key = os.path.abspath(os.path.expanduser(data_dir or os.environ.get("WEBSHOP_DATA", "") or "."))
    return _official_shop(key if (data_dir or os.environ.get("WEBSHOP_DATA")) else None, num_products)


@functools.lru_cache(maxsize=4)
def _official_shop(data_dir: str | None, num_products: int | None) -> Shop:
    products, goals = load_official(data_dir, num_products)
    return Shop(products, goals, f"official WebShop data in {data_dir}")
