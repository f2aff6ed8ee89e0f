"""The WebShop text env."""

from __future__ import annotations

from typing import Any

from crl_envs.core import StepOutcome, TextEnv
from crl_envs.webshop import solver
from crl_envs.webshop.shop import DEFAULT_NUM_GOALS, DEFAULT_NUM_PRODUCTS, Shop, generated_shop, official_shop
from crl_envs.webshop.site import WebShopSite

SOURCES = ("generated", "official")


class WebShopEnv(TextEnv):
    """Buy the product an instruction describes on a simulated shopping site (WebShop, Yao et al. 2022).

    ## Description
    A faithful offline rebuild of WebShop. The site is a state machine over the search page,
    paginated results (top 50, 10 a page), item pages with options and Description /
    Features / Reviews sub-pages, and Buy Now. Search is BM25 over titles and descriptions.
    ``source="generated"`` serves a seeded generated catalog (5,000 products over 5
    categories and 40 product types, 6,000 instructions, each satisfiable by construction);
    ``source="official"`` serves the official products and human instructions from
    ``$WEBSHOP_DATA`` (see :mod:`crl_envs.webshop.official`).

    ## Action Space
    ``UnicodeText``: ``search[keywords]`` on the search page, ``click[label]`` with a label
    shown on the page (case-insensitive), e.g. ``click[Next >]``, ``click[< Prev]``,
    ``click[B0ABC12345]``, ``click[large]``, ``click[Description]``, ``click[Back to Search]``,
    ``click[Buy Now]``. Anything else (unknown label, malformed brackets, empty or over-long
    search, search without a search bar) is an invalid move: reward 0, feedback, state unchanged.

    ## Observation Space
    ``UnicodeText``: the page in WebShop's text form, elements joined by `` [SEP] ``, always
    starting ``WebShop [SEP] Instruction: [SEP] <instruction>``. Item pages end with the
    selected options; "You have clicked X." precedes the page after an option click.

    ## Starting State
    The search page for one instruction of the split. ``reset(seed=i)`` serves goal
    ``i mod len(split)`` of the split's fixed goal order, so seeds 0-499 are exactly the
    test split; ``reset()`` without a seed draws a goal from ``np_random``;
    ``options={"goal_index": k}`` picks goal ``k``.

    ## Rewards
    0 until ``Buy Now``; then WebShop's reward in [0, 1] (attribute, option, price and
    product-type matching; :mod:`crl_envs.webshop.reward` has the formula).

    ## Episode End
    Terminates at ``Buy Now``; truncates at ``max_episode_steps`` (15, as ReAct/AgentBench
    evaluations of WebShop).

    ## Information
    ``task`` (the instruction), ``admissible_actions`` (``click[label]`` per clickable; on the
    search page one ``search[<instruction without its price clause>]`` suggestion, the WebShop
    rule baseline's query; any search is accepted), ``valid_action``, ``success`` (reward == 1),
    ``progress`` (= reward); after a purchase ``reward_info`` (every reward component),
    ``purchased_asin`` and ``purchased_options``; at reset ``goal_index``, ``split``, ``catalog``.

    ## Arguments
    ``source`` ("generated" or "official"), ``split`` ("test" = goals 0-499, "eval" = 500-1499,
    "train" = the rest, "all"; the official baselines' splits), ``num_products`` (generated
    default 5000; official default all), ``num_goals`` (generated, default 6000),
    ``catalog_seed`` (generated, default 0), ``data_dir`` (official, default ``$WEBSHOP_DATA``),
    ``render_mode`` ("ansi" or None).

    ## Version History
    * v0: initial version (generator version 1).
    """

    fast_steps = True  # microsecond-to-millisecond steps: in-process pools call it on the event loop

    family = "WebShop"

    def __init__(self, source: str = "generated", split: str = "test", num_products: int | None = None,
                 num_goals: int = DEFAULT_NUM_GOALS, catalog_seed: int = 0, data_dir: str | None = None,
                 render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        if source not in SOURCES:
            raise ValueError(f"source={source!r}; use one of {SOURCES}")
        self.source, self.split = source, split
        if source == "generated":
            self.shop: Shop = generated_shop(int(num_products or DEFAULT_NUM_PRODUCTS), int(num_goals),
                                             int(catalog_seed))
        else:
            self.shop = official_shop(data_dir, None if num_products is None else int(num_products))
        self.goals = self.shop.split(split)
        self._reset_seed: int | None = None
        self._site: WebShopSite | None = None
        self._goal_index = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._reset_seed = seed
        return super().reset(seed=seed, options=options)

    def _reset_task(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        n = len(self.goals)
        if options and "goal_index" in options:
            idx = int(options["goal_index"]) % n
        elif self._reset_seed is not None:
            idx = int(self._reset_seed) % n
        else:
            idx = int(self.np_random.integers(n))
        self._goal_index = idx
        self._site = WebShopSite(self.shop, self.goals[idx])
        info = {"task": self.goals[idx].instruction_text, "goal_index": idx, "split": self.split,
                "catalog": self.shop.name}
        return self._site.render(), info

    def _apply(self, action: str) -> StepOutcome:
        site = self._site
        assert site is not None, "reset() first"
        bought = site.act(action)
        obs = site.render()
        if not bought:
            return StepOutcome(obs)
        purchase = site.purchase
        assert purchase is not None
        reward = purchase.breakdown.reward
        info = {"reward_info": purchase.breakdown.as_dict(), "purchased_asin": purchase.asin,
                "purchased_options": dict(purchase.options)}
        return StepOutcome(obs, reward=reward, terminated=True, success=reward >= 1.0, progress=reward, info=info)

    def _admissible_actions(self) -> list[str] | None:
        return self._site.admissible_actions() if self._site is not None else None

    def oracle_action(self) -> str:
        assert self._site is not None, "reset() first"
        return solver.oracle_action(self._site)

    @property
    def site(self) -> WebShopSite:
        """The current session (for tests and tools; never show its goal to agents)."""
        assert self._site is not None, "reset() first"
        return self._site
