"""Loader for the official WebShop data files (``WEBSHOP_DATA``).

The official release (princeton-nlp/WebShop, ``setup.sh -d all``) ships, in one folder:

* ``items_shuffle.json`` (1.18M products) or ``items_shuffle_1000.json``: a JSON **list** of
  scraped products with keys such as ``asin``, ``name``, ``category``, ``query``,
  ``product_category``, ``full_description``, ``small_description``, ``pricing`` (a string
  like ``"$12.99"`` or ``"$8.99 - $12.99"``), ``customization_options`` (option name to a
  list of ``{"value", "image"}``), ``images``, ``average_rating``, ...;
* ``items_ins_v2.json`` / ``items_ins_v2_1000.json``: asin to ``{"attributes", "instruction",
  "instruction_attributes"}`` (the product's attributes, used by the reward);
* ``items_human_ins.json``: asin to a list of human instructions, each with ``instruction``,
  ``instruction_attributes`` and ``instruction_options``;
* optionally ``reviews.json``: a list of ``{"asin", "reviews", "average_rating"}``.

We follow the official ``load_products``/``get_human_goals``: skip asin ``"nan"``, asins
longer than 10 characters and repeated asins; a missing price is $100; a price range's paid
price is drawn uniformly in the range; option names and values are lower-cased and ``/``
becomes `` | ``; products missing from ``items_ins_v2`` get the attribute ``DUMMY_ATTR``;
instructions without attributes are skipped; human instructions carry no price, so
", and price lower than X dollars" is appended (X drawn the official way); goals are
shuffled with ``random.seed(233)``. The official code draws the range prices and price
bounds from an unseeded ``random``; we seed that stream (``OFFICIAL_PRICE_SEED``) so runs
are reproducible, and the goal order matches the official one.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import random
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from crl_envs.webshop.catalog import Goal, Product, price_bound

DATA_ENV = "WEBSHOP_DATA"
GOAL_SHUFFLE_SEED = 233
OFFICIAL_PRICE_SEED = 0
HOW_TO_GET = (
    "get the official files with princeton-nlp/WebShop's setup.sh (`./setup.sh -d all` or `-d small`), which "
    "downloads items_shuffle*.json, items_ins_v2*.json and items_human_ins.json into its data/ folder; then "
    f"`export {DATA_ENV}=/path/to/WebShop/data`, or use the generated catalog (crl/WebShop-v0)"
)


class WebShopDataError(FileNotFoundError):
    """The official WebShop files are missing or unreadable; the message says how to get them."""


def _pick(data_dir: Path, stem: str, suffix: str | None) -> Path | None:
    if suffix is not None and (data_dir / f"{stem}{suffix}.json").is_file():
        return data_dir / f"{stem}{suffix}.json"
    if (data_dir / f"{stem}.json").is_file():
        return data_dir / f"{stem}.json"
    found = sorted(glob.glob(str(data_dir / f"{stem}*.json")))
    return Path(found[0]) if found else None


def find_files(data_dir: str | os.PathLike | None = None) -> dict[str, Path | None]:
    """Locate the official files in ``data_dir`` (default ``$WEBSHOP_DATA``).

    Prefers the full ``items_shuffle.json`` over ``items_shuffle_1000.json`` and pairs it with
    the ``items_ins_v2`` file of the same suffix.

    Raises:
        WebShopDataError: no folder, or no products/human-instruction file in it.
    """
    if data_dir is None:
        data_dir = os.environ.get(DATA_ENV)
    if not data_dir:
        raise WebShopDataError(f"crl/WebShop-Official-v0 needs the official WebShop data: ${DATA_ENV} is not set; "
                               + HOW_TO_GET)
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise WebShopDataError(f"{DATA_ENV}={str(root)!r} is not a folder; " + HOW_TO_GET)
    items = _pick(root, "items_shuffle", None)
    suffix = items.stem[len("items_shuffle"):] if items else None
    files = {
        "items": items,
        "attributes": _pick(root, "items_ins_v2", suffix),
        "human": _pick(root, "items_human_ins", None),
        "reviews": root / "reviews.json" if (root / "reviews.json").is_file() else None,
    }
    missing = [name for name in ("items_shuffle*.json", "items_human_ins.json")
               if files["items" if name.startswith("items_shuffle") else "human"] is None]
    if missing:
        raise WebShopDataError(f"{', '.join(missing)} not found in {root}; " + HOW_TO_GET)
    return files


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise WebShopDataError(f"cannot read {path}: {e}; " + HOW_TO_GET) from e


def parse_pricing(pricing: Any) -> list[float]:
    """``"$12.99"`` -> [12.99]; ``"$8.99 - $12.99"`` -> [8.99, 12.99]; missing -> [100.0]."""
    if isinstance(pricing, (int, float)) and not isinstance(pricing, bool):
        return [float(pricing)]
    if isinstance(pricing, list):
        pricing = " ".join(f"${p}" if isinstance(p, (int, float)) else str(p) for p in pricing)
    if not isinstance(pricing, str) or not pricing.strip():
        return [100.0]
    values = []
    for part in pricing.split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            values.append(float(Decimal(digits)))
        except InvalidOperation:
            continue
    return values[:2] if values else [100.0]


def _options(raw: Any) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    if not isinstance(raw, dict):
        return options
    for name, contents in raw.items():
        if not contents:
            continue
        values = []
        for c in contents:
            v = c.get("value") if isinstance(c, dict) else c
            if v is not None:
                v = str(v).strip().replace("/", " | ").lower()
                if v and v not in values:
                    values.append(v)
        if values:
            options[str(name).lower()] = values
    return options


def _reviews(raw: Any) -> list[dict[str, Any]]:
    out = []
    for r in raw or []:
        if isinstance(r, dict):
            out.append({"score": r.get("score", r.get("stars", "")), "title": str(r.get("title", "") or ""),
                        "body": str(r.get("body", r.get("review", "")) or "")})
    return out


def load_official(data_dir: str | os.PathLike | None = None, num_products: int | None = None
                  ) -> tuple[list[Product], list[Goal]]:
    """Read the official products and human goals (goals in the official shuffled order).

    Args:
        data_dir: the folder with the official files (default ``$WEBSHOP_DATA``).
        num_products: keep only the first N products (the file is already shuffled), as the
            official ``num_products``.
    """
    files = find_files(data_dir)
    return _load_cached(str(files["items"]), str(files["attributes"]), str(files["human"]),
                        str(files["reviews"]), num_products)


@functools.lru_cache(maxsize=4)
def _load_cached(items_path: str, attrs_path: str, human_path: str, reviews_path: str,
                 num_products: int | None) -> tuple[list[Product], list[Goal]]:
    raw = _read_json(Path(items_path))
    if not isinstance(raw, list):
        raise WebShopDataError(f"{items_path} must hold a JSON list of products; " + HOW_TO_GET)
    attributes = _read_json(Path(attrs_path)) if attrs_path != "None" else {}
    human = _read_json(Path(human_path))
    reviews: dict[str, dict] = {}
    if reviews_path != "None":
        reviews = {r["asin"]: r for r in _read_json(Path(reviews_path)) if isinstance(r, dict) and "asin" in r}
    if num_products is not None:
        raw = raw[:num_products]
    rng = random.Random(OFFICIAL_PRICE_SEED)
    products: list[Product] = []
    seen: set[str] = set()
    for p in raw:
        asin = str(p.get("asin", "nan")) if isinstance(p, dict) else "nan"
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing = parse_pricing(p.get("pricing"))
        price = pricing[0] if len(pricing) == 1 else rng.uniform(*pricing)
        small = p.get("small_description") or []
        features = [str(s) for s in small] if isinstance(small, list) else [str(small)]
        rev = reviews.get(asin, {})
        rating = p.get("average_rating", rev.get("average_rating", "N.A."))
        attr_entry = attributes.get(asin) if isinstance(attributes, dict) else None
        attrs = attr_entry.get("attributes") if isinstance(attr_entry, dict) else None
        products.append(Product(
            asin=asin, title=str(p.get("name") or ""), category=str(p.get("category") or ""),
            query=str(p.get("query") or "").lower().strip(), product_category=str(p.get("product_category") or ""),
            pricing=pricing, price=price, attributes=list(attrs) if attrs else ["DUMMY_ATTR"],
            options=_options(p.get("customization_options")), description=str(p.get("full_description") or ""),
            features=features, reviews=_reviews(p.get("Reviews") or p.get("reviews") or rev.get("reviews")),
            rating=str(rating if rating not in (None, "") else "N.A."),
        ))
    goals: list[Goal] = []
    for product in products:
        for ins in human.get(product.asin, []) if isinstance(human, dict) else []:
            attrs = ins.get("instruction_attributes") or []
            if not attrs:
                continue
            upper, price_text = price_bound(product.price, rng)
            options = ins.get("instruction_options") or []
            goals.append(Goal(
                asin=product.asin, instruction_text=str(ins.get("instruction", "")).strip(".") + price_text,
                attributes=list(attrs), goal_options=dict(options) if isinstance(options, dict) else list(options),
                price_upper=upper, query=product.query, category=product.category,
                product_category=product.product_category, name=product.title,
            ))
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return products, goals
