"""Products, goals and the seeded catalog generator for the generated WebShop.

A :class:`Product` mirrors a product after the official loader's clean-up (``Title``,
``Description``, ``BulletPoints``, ``Attributes``, ``options``, ``pricing``, ``Price``,
``Reviews``, ``Rating``); a :class:`Goal` mirrors an official goal (``instruction_text``,
``attributes``, ``goal_options``, ``price_upper``, and the target's ``query``, ``category``,
``product_category`` and ``name``).

The generator draws products from the grammar in :mod:`crl_envs.webshop.vocab` and samples
each instruction from one generated product (its *target*): a subset of the target's
attributes, one value per option dimension of the target, and a price bound drawn the
official way (two of the first four multiples of $10 above the price, keep the larger).
So every instruction is satisfiable by construction: buying the target with those options
earns reward 1.

Catalogs are built once per ``(GENERATOR_VERSION, seed, num_products, num_goals)`` and
cached on disk (``$CRL_CACHE/webshop``, default ``~/.cache/crl-bench/webshop``) and in
process.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import re
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from crl_envs.webshop import vocab

GENERATOR_VERSION = 1
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
NO_PRICE_BOUND = 1_000_000.0


@dataclass
class Product:
    """One product, in the shape the official loader produces after its clean-up."""

    asin: str
    title: str
    category: str
    query: str
    product_category: str
    pricing: list[float]
    price: float
    attributes: list[str]
    options: dict[str, list[str]]
    description: str
    features: list[str]
    reviews: list[dict[str, Any]] = field(default_factory=list)
    rating: str = "N.A."

    @property
    def price_tag(self) -> str:
        """The price as the site shows it: ``$12.99`` or ``$8.99 to $12.99``."""
        if len(self.pricing) > 1:
            return f"${self.pricing[0]:.2f} to ${self.pricing[1]:.2f}"
        return f"${self.pricing[0]:.2f}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Product:
        return cls(**d)


@dataclass
class Goal:
    """One instruction and what the reward compares the purchase with."""

    asin: str
    instruction_text: str
    attributes: list[str]
    goal_options: dict[str, str] | list[str]
    price_upper: float
    query: str
    category: str
    product_category: str
    name: str

    @property
    def option_values(self) -> list[str]:
        """The wanted option values (official goals hold a dict or a plain list)."""
        return list(self.goal_options.values()) if isinstance(self.goal_options, dict) else list(self.goal_options)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Goal:
        return cls(**d)


def price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """The official price bound: two of the first four multiples of $10 above ``price``, the larger.

    Returns ``(price_upper, text)``; without two candidates there is no bound and no text.
    """
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return NO_PRICE_BOUND, ""
    upper = max(rng.sample(candidates, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


# ---------------------------------------------------------------- generator
def _asin(rng: random.Random, taken: set[str]) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    while True:
        asin = "B0" + "".join(rng.choices(alphabet, k=8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _price(lo: float, hi: float, rng: random.Random) -> float:
    raw = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    return max(0.99, math.floor(raw) + rng.choice((0.99, 0.95, 0.49, 0.0)))


def _fill(template: str, slots: dict[str, str]) -> str:
    return template.format(**slots)


def _product(cat: str, pt: vocab.ProductType, rng: random.Random, taken: set[str]) -> Product:
    brand = rng.choice(vocab.BRANDS[cat])
    noun = rng.choice(pt.nouns)
    attrs = rng.sample(pt.attributes, k=min(len(pt.attributes), rng.randint(3, 5)))
    options: dict[str, list[str]] = {}
    for name, pool in pt.options:
        if rng.random() < 0.9:
            k = rng.randint(min(2, len(pool)), min(6, len(pool)))
            chosen = set(rng.sample(pool, k))
            options[name] = [v for v in pool if v in chosen]
    price = _price(*pt.price, rng)
    pricing = [price]
    if rng.random() < 0.12:
        pricing = [price, round(price * rng.uniform(1.2, 1.8), 2)]
        price = round(rng.uniform(*pricing), 2)
    use = rng.choice(pt.uses)
    in_title = attrs[: rng.randint(0, 2)]
    words = [brand] + ([rng.choice(vocab.TITLE_EXTRAS)] if rng.random() < 0.5 else []) + [noun.title()]
    title = " ".join(words)
    if in_title:
        title += " - " + ", ".join(a.title() for a in in_title)
    if rng.random() < 0.6:
        title += f" for {rng.choice(vocab.AUDIENCES)}"
    a = attrs + attrs  # enough slots even for three-attribute products
    slots = {"noun": noun, "brand": brand, "use": use, "a1": a[0], "a2": a[1], "a3": a[2],
             "A1": a[0].title(), "A2": a[1].title(), "A3": a[2].title()}
    description = " ".join(_fill(s, slots) for s in rng.sample(vocab.DESCRIPTION_SENTENCES, rng.randint(3, 4)))
    features = [_fill(s, slots) for s in vocab.FEATURE_SENTENCES[: rng.randint(3, 5)]]
    reviews = []
    for _ in range(rng.choices((0, 1, 2, 3), weights=(2, 3, 3, 2))[0]):
        score = rng.choices((5, 4, 3, 2, 1), weights=(5, 3, 1.5, 0.8, 0.7))[0]
        head, *bodies = vocab.REVIEW_TEXTS[score]
        reviews.append({"score": score, "title": head, "body": _fill(rng.choice(bodies), slots)})
    rating = f"{sum(r['score'] for r in reviews) / len(reviews):.1f}" if reviews else "N.A."
    return Product(
        asin=_asin(rng, taken), title=title, category=cat, query=pt.query,
        product_category=" › ".join(pt.path), pricing=pricing, price=price, attributes=attrs,
        options=options, description=description, features=features, reviews=reviews, rating=rating,
    )


def _instruction_noun(product: Product) -> str:
    for cat_types in vocab.TYPES.values():
        for pt in cat_types:
            if pt.query == product.query:
                for noun in pt.nouns:
                    if noun.lower() in product.title.lower():
                        return noun
                return pt.nouns[0]
    return product.query


def _option_phrase(name: str, value: str) -> str:
    if name == "color":
        return f"in {value} color"
    if name == "size":
        return f"in size {value}"
    if name in ("flavor name", "scent"):
        return f"with {value} {name.split()[0]}"
    return f"with {name}: {value}"


def make_goal(product: Product, rng: random.Random) -> Goal:
    """Sample one instruction that ``product`` satisfies (with the options it names)."""
    k = rng.choices((1, 2, 3), weights=(4, 5, 1))[0]
    attrs = rng.sample(product.attributes, k=min(k, len(product.attributes)))
    goal_options = {name: rng.choice(values) for name, values in product.options.items()}
    upper, price_text = price_bound(product.price, rng)
    noun = _instruction_noun(product)
    opts = " and ".join(_option_phrase(n, v) for n, v in goal_options.items())
    text = rng.choice(vocab.INSTRUCTION_TEMPLATES).format(
        article="" if noun.endswith("s") else "a", attrs=" and ".join(attrs), noun=noun,
        opts=f", {opts}" if opts else "",
    )
    text = re.sub(r"\ba ([aeiou])", r"an \1", " ".join(text.split()))
    return Goal(
        asin=product.asin, instruction_text=text + price_text, attributes=attrs,
        goal_options=goal_options, price_upper=upper, query=product.query, category=product.category,
        product_category=product.product_category, name=product.title,
    )


def generate_catalog(num_products: int, num_goals: int, seed: int) -> tuple[list[Product], list[Goal]]:
    """Generate ``num_products`` products and ``num_goals`` instructions, deterministically from ``seed``."""
    if num_products < 1 or num_goals < 1:
        raise ValueError(f"need num_products >= 1 and num_goals >= 1, got {num_products}, {num_goals}")
    rng = random.Random(f"webshop-catalog-v{GENERATOR_VERSION}-{seed}")
    kinds = [(cat, pt) for cat, types in vocab.TYPES.items() for pt in types]
    taken: set[str] = set()
    products = [_product(*rng.choice(kinds), rng, taken) for _ in range(num_products)]
    goals = [make_goal(rng.choice(products), rng) for _ in range(num_goals)]
    return products, goals


# -------------------------------------------------------------------- cache
def cache_dir() -> Path:
    """``$CRL_CACHE/webshop`` (default ``~/.cache/crl-bench/webshop``)."""
    return Path(os.environ.get("CRL_CACHE") or Path.home() / ".cache" / "crl-bench") / "webshop"


def load_or_generate(num_products: int, num_goals: int, seed: int) -> tuple[list[Product], list[Goal]]:
    """The generated catalog, read from the disk cache or generated and written there.

    A corrupt or unreadable cache file is regenerated; an unwritable cache dir only warns.
    """
    path = cache_dir() / f"catalog-v{GENERATOR_VERSION}-seed{seed}-p{num_products}-g{num_goals}.json.gz"
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
        return [Product.from_dict(p) for p in data["products"]], [Goal.from_dict(g) for g in data["goals"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    products, goals = generate_catalog(num_products, num_goals, seed)
    payload = {"generator_version": GENERATOR_VERSION, "seed": seed,
               "products": [p.to_dict() for p in products], "goals": [g.to_dict() for g in goals]}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as raw, gzip.open(raw, "wt", encoding="utf-8", compresslevel=3) as f:
            json.dump(payload, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # atomic: concurrent workers never read half a file
    except OSError as e:
        warnings.warn(f"could not cache the WebShop catalog in {path.parent}: {e}; set $CRL_CACHE", stacklevel=2)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return products, goals
