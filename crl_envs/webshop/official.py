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

Beyond the official loader (which would crash): a product with ``Title`` instead of ``name`` keeps
its title; an ``items_ins_v2`` or ``items_human_ins`` entry that is one object instead of a list
of objects is read as a list of one; options without values are dropped; an unparsable price is
$100. A human instruction that is not an object, lacks ``instruction`` or has ill-typed
attributes/options, a human file that is not an asin map, or data where no instruction names a
loaded product raise :class:`WebShopDataError` naming the file, the asin and the field.
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
        if not isinstance(contents, list):  # one {"value", "image"} instead of a list of them
            contents = [contents]
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
        raise WebShopDataError(f"{items_path} must hold a JSON list of products, not a {type(raw).__name__}; "
                               + HOW_TO_GET)
    attributes = _read_json(Path(attrs_path)) if attrs_path != "None" else {}
    human = _read_json(Path(human_path))
    if not isinstance(human, dict):
        raise WebShopDataError(f"{human_path}: must map each asin to its instructions (a JSON object asin -> list of "
                               f"{{instruction, instruction_attributes, instruction_options}}), not a "
                               f"{type(human).__name__}; " + HOW_TO_GET)
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
        products.append(_product(p, asin, _catalog_attributes(attributes, asin), reviews.get(asin, {}), rng))
    goals: list[Goal] = []
    for product in products:
        for ins in _instructions(human, product.asin, human_path):
            attrs = ins["instruction_attributes"]
            if not attrs:
                continue
            upper, price_text = price_bound(product.price, rng)
            options = ins["instruction_options"]
            goals.append(Goal(
                asin=product.asin, instruction_text=ins["instruction"].strip(".") + price_text,
                attributes=attrs, goal_options=options, price_upper=upper, query=product.query,
                category=product.category, product_category=product.product_category, name=product.title,
            ))
    if not goals:
        raise WebShopDataError(f"no usable human instruction: none of the asins of {human_path} with instruction "
                               f"attributes is among the {len(products)} products read from {items_path}; "
                               "pair items_human_ins.json with the items_shuffle file of the same release")
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return products, goals


def _product(p: dict[str, Any], asin: str, attrs: list[str] | None, rev: dict[str, Any], rng: random.Random
             ) -> Product:
    """One product row after the official clean-up (``name`` or ``Title`` as the title)."""
    pricing = parse_pricing(p.get("pricing"))
    price = pricing[0] if len(pricing) == 1 else rng.uniform(*pricing)
    small = p.get("small_description")
    features = [str(s) for s in small if s] if isinstance(small, list) else ([str(small)] if small else [])
    rating = p.get("average_rating", rev.get("average_rating", "N.A."))
    return Product(
        asin=asin, title=str(p.get("name") or p.get("Title") or ""), category=str(p.get("category") or ""),
        query=str(p.get("query") or "").lower().strip(), product_category=str(p.get("product_category") or ""),
        pricing=pricing, price=price, attributes=list(attrs) if attrs else ["DUMMY_ATTR"],
        options=_options(p.get("customization_options")),
        description=str(p.get("full_description") or p.get("Description") or ""), features=features,
        reviews=_reviews(p.get("Reviews") or p.get("reviews") or rev.get("reviews")),
        rating=str(rating if rating not in (None, "") else "N.A."),
    )


def _catalog_attributes(attributes: Any, asin: str) -> list[str] | None:
    """The product's ``attributes`` from ``items_ins_v2`` (an entry may be one object or a list of them)."""
    entry = attributes.get(asin) if isinstance(attributes, dict) else None
    for e in entry if isinstance(entry, list) else [entry]:
        if isinstance(e, dict) and isinstance(e.get("attributes"), list):
            return [str(a) for a in e["attributes"]]
    return None


def _instructions(human: dict[str, Any], asin: str, path: str) -> list[dict[str, Any]]:
    """The asin's human instructions, validated (one object is taken as a list of one)."""
    entry = human.get(asin)
    if entry is None:
        return []
    entries = [entry] if isinstance(entry, dict) else entry
    if not isinstance(entries, list):
        raise WebShopDataError(f"{path}: asin {asin!r}: expected a list of instructions, not a {type(entry).__name__}")
    out = []
    for n, ins in enumerate(entries):
        where = f"{path}: asin {asin!r}, instruction {n}"
        if not isinstance(ins, dict):
            raise WebShopDataError(f"{where}: expected an object with instruction, instruction_attributes and "
                                   f"instruction_options, not a {type(ins).__name__}")
        text = ins.get("instruction")
        if not isinstance(text, str) or not text.strip():
            raise WebShopDataError(f"{where}: field 'instruction' must be a non-empty string")
        attrs = ins.get("instruction_attributes") or []
        if not isinstance(attrs, list):
            raise WebShopDataError(f"{where}: field 'instruction_attributes' must be a list of strings")
        options = ins.get("instruction_options") or []
        if isinstance(options, dict):
            options = {str(k).lower(): str(v).lower() for k, v in options.items() if v is not None}
        elif isinstance(options, list):
            options = [str(v).lower() for v in options if v is not None]
        else:
            raise WebShopDataError(f"{where}: field 'instruction_options' must be a list of option values "
                                   "(or an object option name -> value)")
        out.append({"instruction": text, "instruction_attributes": [str(a) for a in attrs],
                    "instruction_options": options})
    return out
