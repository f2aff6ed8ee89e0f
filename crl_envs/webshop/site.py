"""The WebShop site as a state machine, rendered in WebShop's ``[SEP]`` text form.

Pages and their clickables (the official templates, text "simple" mode):

* **search**: ``WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search``; action ``search[keywords]``.
* **results**: ``Back to Search``, ``< Prev`` (page > 1), ``Next >`` (more results), and per
  product its ASIN (clickable), title and price; 10 products a page out of the top 50.
* **item**: ``Back to Search``, ``< Prev`` (to the results), each option's values
  (clicking one selects it), title, price, rating, ``Description``, ``Features``,
  ``Reviews`` and ``Buy Now``.
* **description / features / reviews**: ``Back to Search``, ``< Prev`` (to the item).
* **done**: after ``Buy Now``; the episode ends with the reward.

Clicks match labels case-insensitively. Search is only possible on the search page (the
only page with a search bar). Every malformed or unavailable action raises
:class:`~crl_envs.core.InvalidAction` *before* any state changes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from crl_envs.core import InvalidAction
from crl_envs.webshop.catalog import Goal, Product
from crl_envs.webshop.reward import RewardBreakdown, get_reward
from crl_envs.webshop.shop import Shop

PRODUCT_WINDOW = 10
MAX_QUERY_CHARS = 500
BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW = "Back to Search", "Next >", "< Prev", "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")
_ACTION = re.compile(r"^(search|click)\[(.*)\]$", re.DOTALL | re.IGNORECASE)
_PRICE_CLAUSE = re.compile(r",? and price lower than [\d.]+ dollars$")


@dataclass(frozen=True)
class PageState:
    """Where the browser is. Immutable: each action builds the next state."""

    page: str = "search"  # search | results | item | sub | done
    keywords: str = ""
    results: tuple[str, ...] = ()
    page_no: int = 1
    asin: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    sub: str = ""

    @property
    def chosen(self) -> dict[str, str]:
        return dict(self.options)


@dataclass
class Purchase:
    """What was bought and its reward."""

    asin: str
    options: dict[str, str]
    price: float
    breakdown: RewardBreakdown
    info: dict = field(default_factory=dict)


def search_query_hint(instruction: str) -> str:
    """The instruction without its price clause (the query the WebShop rule baseline sends)."""
    return _PRICE_CLAUSE.sub("", instruction.strip())


class WebShopSite:
    """One shopping session for ``goal`` on ``shop``."""

    def __init__(self, shop: Shop, goal: Goal):
        self.shop = shop
        self.goal = goal
        self.state = PageState()
        self.purchase: Purchase | None = None
        self.feedback = ""

    # ----------------------------------------------------------- clickables
    def clickables(self) -> list[str]:
        """The labels one can click on the current page, in page order."""
        s = self.state
        if s.page == "results":
            labels = [BACK_TO_SEARCH] + ([PREV_PAGE] if s.page_no > 1 else [])
            labels += [NEXT_PAGE] if s.page_no * PRODUCT_WINDOW < len(s.results) else []
            return labels + list(self._window())
        if s.page == "item":
            product = self.shop.by_asin[s.asin]
            labels = [BACK_TO_SEARCH, PREV_PAGE]
            for values in product.options.values():
                labels += [v for v in values if v not in labels]
            return labels + list(SUB_PAGES) + [BUY_NOW]
        if s.page == "sub":
            return [BACK_TO_SEARCH, PREV_PAGE]
        return []

    def admissible_actions(self) -> list[str]:
        """Every clickable as ``click[label]``; on the search page one ``search[...]`` suggestion."""
        if self.state.page == "search":
            return [f"search[{search_query_hint(self.goal.instruction_text)}]"]
        return [f"click[{label}]" for label in self.clickables()]

    def _window(self) -> tuple[str, ...]:
        s = self.state
        return s.results[(s.page_no - 1) * PRODUCT_WINDOW: s.page_no * PRODUCT_WINDOW]

    # --------------------------------------------------------------- acting
    def act(self, action: str) -> bool:
        """Apply ``search[...]`` or ``click[...]``; return True when the episode ends (a purchase)."""
        m = _ACTION.match(action)
        if m is None:
            raise InvalidAction(
                f"{action[:80]!r} is not an action; use search[keywords] on the search page or click[label] "
                "with a label shown on the page."
            )
        kind, arg = m.group(1).lower(), " ".join(m.group(2).split())
        if kind == "search":
            self.state, self.feedback = self._search(arg), ""
            return False
        return self._click(arg)

    def _search(self, keywords: str) -> PageState:
        if self.state.page != "search":
            raise InvalidAction("there is no search bar on this page; click[Back to Search] first.")
        if not keywords:
            raise InvalidAction("the search is empty; write keywords inside search[...].")
        if len(keywords) > MAX_QUERY_CHARS:
            raise InvalidAction(f"the search is longer than {MAX_QUERY_CHARS} characters; use a few keywords.")
        results = tuple(p.asin for p in self.shop.search(keywords))
        return PageState(page="results", keywords=keywords, results=results, page_no=1)

    def _click(self, label: str) -> bool:
        s = self.state
        if s.page == "search":
            raise InvalidAction("nothing to click on the search page; use search[keywords].")
        lookup = {c.lower(): c for c in reversed(self.clickables())}
        target = lookup.get(label.lower())
        if target is None:
            shown = ", ".join(self.clickables()[:12])
            raise InvalidAction(f"{label[:80]!r} is not clickable on this page; clickables: {shown}")
        self.feedback = ""
        if target == BACK_TO_SEARCH:
            self.state = PageState()
        elif s.page == "results":
            if target == NEXT_PAGE:
                self.state = replace(s, page_no=s.page_no + 1)
            elif target == PREV_PAGE:
                self.state = replace(s, page_no=s.page_no - 1)
            else:
                self.state = replace(s, page="item", asin=target, options=())
        elif s.page == "sub":
            self.state = replace(s, page="item", sub="")
        elif target == PREV_PAGE:  # item page back to its results page
            self.state = replace(s, page="results", asin=None, options=())
        elif target in SUB_PAGES:
            self.state = replace(s, page="sub", sub=target)
        elif target == BUY_NOW:
            self._buy()
            return True
        else:
            self._select(target)
        return False

    def _select(self, value: str) -> None:
        product = self.shop.by_asin[self.state.asin]
        name = next(n for n, values in product.options.items() if value in values)
        chosen = self.state.chosen
        chosen[name] = value
        self.state = replace(self.state, options=tuple(chosen.items()))
        self.feedback = f"You have clicked {value}."

    def _buy(self) -> None:
        product = self.shop.by_asin[self.state.asin]
        chosen = self.state.chosen
        breakdown = get_reward(product, self.goal, product.price, chosen)
        self.purchase = Purchase(product.asin, chosen, product.price, breakdown)
        self.state = replace(self.state, page="done")

    # ------------------------------------------------------------ rendering
    def render(self) -> str:
        """The current page in WebShop's text form."""
        s = self.state
        head = ["WebShop", "Instruction:", self.goal.instruction_text]
        if s.page == "search":
            parts = head + ["Search"]
        elif s.page == "results":
            parts = head + [BACK_TO_SEARCH, f"Page {s.page_no} (Total results: {len(s.results)})"]
            parts += [PREV_PAGE] if s.page_no > 1 else []
            parts += [NEXT_PAGE] if s.page_no * PRODUCT_WINDOW < len(s.results) else []
            for asin in self._window():
                p = self.shop.by_asin[asin]
                parts += [asin, p.title, p.price_tag]
        elif s.page == "item":
            p = self.shop.by_asin[s.asin]
            parts = head + [BACK_TO_SEARCH, PREV_PAGE]
            for name, values in p.options.items():
                parts += [name, *values]
            parts += [p.title, f"Price: {p.price_tag}", f"Rating: {p.rating}", *SUB_PAGES, BUY_NOW]
        elif s.page == "sub":
            parts = head + [BACK_TO_SEARCH, PREV_PAGE] + self._sub_page(self.shop.by_asin[s.asin], s.sub)
        else:
            assert self.purchase is not None
            r = self.purchase.breakdown.reward
            parts = ["Thank you for shopping with us!", "Purchased", "asin", self.purchase.asin, "options",
                     json.dumps(self.purchase.options), "Your score (min 0.0, max 1.0)", f"{r:.4g}"]
        text = " [SEP] ".join(x for x in parts if x != "")
        if s.page == "item" and s.options:
            text += " [SEP] Selected: " + ", ".join(f"{n}: {v}" for n, v in s.options)
        return f"{self.feedback}\n{text}" if self.feedback else text

    @staticmethod
    def _sub_page(p: Product, sub: str) -> list[str]:
        if sub == "Description":
            return [p.description or "(no description)"]
        if sub == "Features":
            return list(p.features) or ["(no features)"]
        if not p.reviews:
            return ["(no reviews)"]
        out = []
        for r in p.reviews:
            out += [str(r.get("title", "")), str(r.get("score", "")), str(r.get("body", ""))]
        return out
