"""The WebShop oracle: search with the instruction's key terms, find the target, pick its options, buy.

It reads the hidden goal (target ASIN and goal options), so it is for ``--agent oracle``
and tests only. From any state it chooses the next action:

* search page: ``search[<key terms>]`` if the target is among those top-50 results, else
  ``search[<target title>]`` (the fallback the official baselines call "go to search");
* results page: click the target if shown, else page towards it, else back to search;
* item page of another product or a sub page: ``< Prev``;
* the target's item page: click each wanted option value not yet selected, then ``Buy Now``.

Worst case 1 search + 4 pages + 1 click + options + 1 buy, within the 15-step limit.
"""

from __future__ import annotations

import functools
import re

from crl_envs.webshop.catalog import Goal, Product
from crl_envs.webshop.reward import token_set_ratio
from crl_envs.webshop.search import tokenize
from crl_envs.webshop.shop import Shop
from crl_envs.webshop.site import BACK_TO_SEARCH, BUY_NOW, NEXT_PAGE, PREV_PAGE, PRODUCT_WINDOW, WebShopSite

_FILLER = frozenset(
    "i im i'm am looking need want would like buy find me show which that is are some please get".split()
)
_OPTION_CLAUSE = re.compile(r",? (?:in|with) [^,]*$")


def key_terms(goal: Goal) -> str:
    """The instruction's key terms: no price clause, no option clause, no filler or stop words."""
    text = re.sub(r",? and price lower than [\d.]+ dollars$", "", goal.instruction_text.lower())
    text = _OPTION_CLAUSE.sub("", text) if "," in text else text
    words = [w for w in re.findall(r"[a-z0-9'.-]+", text) if w not in _FILLER]
    kept = [w for w in words if tokenize(w)]
    return " ".join(kept) or goal.query or goal.name


@functools.lru_cache(maxsize=4096)
def _ranked(shop: Shop, query: str) -> tuple[str, ...]:
    return tuple(p.asin for p in shop.search(query))


def oracle_query(site: WebShopSite) -> str:
    """Key terms if they find the target, else the target's title."""
    goal = site.goal
    query = key_terms(goal)
    if goal.asin in _ranked(site.shop, query):
        return query
    return goal.name


def wanted_options(product: Product, goal: Goal) -> dict[str, str]:
    """Which value of each of the product's options the goal asks for."""
    if isinstance(goal.goal_options, dict):
        return {n: v for n, v in goal.goal_options.items() if v in product.options.get(n, ())}
    out: dict[str, str] = {}
    for want in goal.option_values:  # official human goals: a list of values without names
        best = max(((token_set_ratio(want, v), n, v) for n, vs in product.options.items() for v in vs),
                   default=(0, "", ""))
        if best[0] > 85 and best[1] not in out:
            out[best[1]] = best[2]
    return out


def oracle_action(site: WebShopSite) -> str:
    """The next action towards buying the goal's target with its options."""
    s = site.state
    goal = site.goal
    if s.page == "search":
        return f"search[{oracle_query(site)}]"
    if s.page == "results":
        if goal.asin in s.results:
            page = s.results.index(goal.asin) // PRODUCT_WINDOW + 1
            if page == s.page_no:
                return f"click[{goal.asin}]"
            return f"click[{NEXT_PAGE if page > s.page_no else PREV_PAGE}]"
        return f"click[{BACK_TO_SEARCH}]"
    if s.page == "sub" or (s.page == "item" and s.asin != goal.asin):
        return f"click[{PREV_PAGE}]"
    if s.page == "item":
        chosen = s.chosen
        for name, value in wanted_options(site.shop.by_asin[s.asin], goal).items():
            if chosen.get(name) != value:
                return f"click[{value}]"
        return f"click[{BUY_NOW}]"
    return f"click[{BUY_NOW}]"  # done page: the episode is over; any action is refused by the env
