"""WebShop's reward for a purchase, rebuilt from the official ``get_reward``.

The official formula::

    reward = r_type * (attribute_matches + option_matches + price_ok) / (len(attributes) + len(options) + 1)

* **attribute_matches**: a goal attribute matches if some attribute of the bought product
  has ``token_set_ratio > 85`` with it, or else if it occurs as a substring of the bought
  product's title, features (bullet points) or description.
* **option_matches**: for each option the buyer *selected*, after colour normalisation: an
  option named ``size`` matches only if its value equals one of the goal's option values;
  any other option matches if ``token_set_ratio > 85`` with one of them. An unmatched
  selected value still counts if it occurs in the title, features or description.
* **price_ok**: 1 if the paid price is at most ``price_upper``, else 0.
* **r_type** (product type): 1.0 if the query matches, or the product categories share at
  least two levels, or the title score exceeds 0.2; 0.5 if none of these holds; then 0.1
  if the title score is below 0.1, and 0.0 if it is 0. The title score is the share of the
  goal title's type words that occur in the bought title.

Success means reward == 1.

What is simplified, and why:

* **Title type words.** The official code keeps spaCy ``en_core_web_lg`` nouns; that model
  is a large download from a model hub, which this benchmark never does. We keep the
  title's lower-case alphabetic words minus English stop words (so a few adjectives count
  as type words too). Only the thresholds 0.2/0.1/0 of the title score matter.
* **Fuzzy matching.** ``thefuzz.token_set_ratio`` is reimplemented here exactly (token
  sets, Indel similarity through a bit-parallel LCS, rounded to an integer) so the package
  needs no extra dependency.
* **Colour normalisation.** As the official ``normalize_color``, a value containing a
  basic colour word is reduced to the first such word of an alphabetical list; our list of
  basic colours is our own.
* **Clipping.** The official sum can exceed the denominator when extra selected options
  match through the title; we clip the reward to [0, 1].
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from crl_envs.webshop.catalog import Goal, Product

EXACT_MATCH_OPTIONS = ("size",)
FUZZY_THRESHOLD = 85
COLOR_WORDS = (
    "aqua", "beige", "black", "blue", "blush", "bronze", "brown", "burgundy", "camel", "champagne", "charcoal",
    "coral", "cream", "espresso", "fuchsia", "gold", "gray", "green", "grey", "indigo", "ivory", "khaki",
    "lavender", "lilac", "magenta", "maroon", "mauve", "mint", "mustard", "navy", "nude", "olive", "orange",
    "peach", "pink", "plum", "purple", "red", "rose", "silver", "tan", "taupe", "teal", "turquoise", "violet",
    "walnut", "white", "wine", "yellow",
)
STOP_WORDS = frozenset(
    "a an and are as at be but by for from has have in into is it its of on or that the their this to with "
    "without your you our we set pack pcs piece pieces new inch ft oz ounce count x".split()
)
_NON_ALNUM = re.compile(r"[^0-9a-z]+")
_WORD = re.compile(r"[a-z]+")


# ------------------------------------------------------------ fuzzy matching
def _process(s: str) -> str:
    return " ".join(_NON_ALNUM.sub(" ", s.lower()).split())


def _lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence (bit-parallel, Allison-Dix / Hyyrö)."""
    if not a or not b:
        return 0
    masks: dict[str, int] = {}
    for i, ch in enumerate(a):
        masks[ch] = masks.get(ch, 0) | (1 << i)
    full = (1 << len(a)) - 1
    v = full
    for ch in b:
        u = v & masks.get(ch, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - v.bit_count()


def ratio(a: str, b: str) -> float:
    """Indel similarity in [0, 100] (``fuzz.ratio`` before rounding)."""
    if not a and not b:
        return 100.0
    return 200.0 * _lcs_length(a, b) / (len(a) + len(b))


def token_set_ratio(a: str, b: str) -> int:
    """``thefuzz.fuzz.token_set_ratio``: compare the shared tokens with each side's extra tokens."""
    ta, tb = set(_process(a).split()), set(_process(b).split())
    if not ta or not tb:
        return 0
    inter, only_a, only_b = sorted(ta & tb), sorted(ta - tb), sorted(tb - ta)
    if inter and (not only_a or not only_b):
        return 100
    sect = " ".join(inter)
    comb_a = " ".join(inter + only_a)
    comb_b = " ".join(inter + only_b)
    best = ratio(comb_a, comb_b)
    if sect:
        best = max(best, ratio(sect, comb_a), ratio(sect, comb_b))
    return int(round(best))


def normalize_color(value: str) -> str:
    """Reduce a value containing a basic colour word to that word (the official normalisation)."""
    words = set(_WORD.findall(value.lower()))
    for color in COLOR_WORDS:
        if color in words:
            return color
    return value


def title_words(title: str) -> list[str]:
    """The type words of a title (see the module docstring)."""
    return [w for w in _WORD.findall(title.lower()) if w not in STOP_WORDS and len(w) > 1]


# ---------------------------------------------------------------- components
def _in_text(value: str, product: Product) -> bool:
    v = value.lower()
    return v in product.title.lower() or v in " ".join(product.features).lower() or v in product.description.lower()


def attribute_matches(product: Product, goal_attributes: list[str]) -> int:
    """How many goal attributes the product has (fuzzy on its attributes, else in its text)."""
    n = 0
    for g in goal_attributes:
        if any(token_set_ratio(p, g) > FUZZY_THRESHOLD for p in product.attributes) or _in_text(g, product):
            n += 1
    return n


def option_matches(product: Product, goal_values: list[str], chosen: dict[str, str]) -> int:
    """How many selected options match a goal option value (``size`` exactly, others fuzzily)."""
    goal_norm = [normalize_color(v) for v in goal_values]
    n = 0
    for name, value in chosen.items():
        v = normalize_color(value)
        if name.lower() in EXACT_MATCH_OPTIONS:
            matched = v in goal_norm
        else:
            matched = any(token_set_ratio(g, v) > FUZZY_THRESHOLD for g in goal_norm)
        if matched or _in_text(v, product):
            n += 1
    return n


def type_reward(product: Product, goal: Goal) -> dict[str, Any]:
    """The product-type score and what it was computed from."""
    query_match = product.query.strip().lower() == goal.query.strip().lower()
    bought = {x.strip() for x in product.product_category.split("›")}
    wanted = {x.strip() for x in goal.product_category.split("›")}
    category_match = len((bought & wanted) - {""}) >= 2
    want = title_words(goal.name)
    got = set(title_words(product.title))
    title_score = len(set(want) & got) / len(set(want)) if want else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


@dataclass
class RewardBreakdown:
    """The reward of one purchase and its components (exposed in ``info["reward_info"]``)."""

    reward: float
    r_type: float
    r_att: float
    r_option: float | None
    r_price: bool
    num_attr_matches: int
    num_option_matches: int
    num_attributes: int
    num_options: int
    query_match: bool
    category_match: bool
    title_score: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def get_reward(product: Product, goal: Goal, price: float, chosen: dict[str, str]) -> RewardBreakdown:
    """Score buying ``product`` at ``price`` with the ``chosen`` options against ``goal``."""
    t = type_reward(product, goal)
    goal_values = goal.option_values
    n_att = attribute_matches(product, goal.attributes)
    n_opt = option_matches(product, goal_values, chosen)
    price_ok = price <= goal.price_upper
    denom = len(goal.attributes) + len(goal_values) + 1
    total = (n_att + n_opt + int(price_ok)) / denom * t["r_type"]
    return RewardBreakdown(
        reward=min(1.0, max(0.0, total)),
        r_type=t["r_type"],
        r_att=n_att / len(goal.attributes) if goal.attributes else 1.0,
        r_option=n_opt / len(goal_values) if goal_values else None,
        r_price=price_ok,
        num_attr_matches=n_att,
        num_option_matches=n_opt,
        num_attributes=len(goal.attributes),
        num_options=len(goal_values),
        query_match=t["query_match"],
        category_match=t["category_match"],
        title_score=t["title_score"],
    )
