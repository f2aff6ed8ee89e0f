"""WebShop: catalog, search, reward, site navigation, oracle, the official-data loader and the conformance kit."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import crl_envs  # noqa: F401
from crl_envs.registry import crl_env_ids
from crl_envs.testing import check_text_env
from crl_envs.webshop import catalog as catalog_mod
from crl_envs.webshop.catalog import Goal, Product, generate_catalog, load_or_generate, price_bound
from crl_envs.webshop.official import GOAL_SHUFFLE_SEED, WebShopDataError, load_official, parse_pricing
from crl_envs.webshop.reward import get_reward, normalize_color, ratio, token_set_ratio
from crl_envs.webshop.search import BruteForceBM25, SearchEngine
from crl_envs.webshop.shop import generated_shop

WEBSHOP_IDS = [i for i in crl_env_ids() if i.startswith("crl/WebShop-")]

# ------------------------------------------------------------------ official-format fixture files


def _item(asin, name, query, category, product_category, pricing, options, small, full, rating="N.A."):
    return {
        "name": name, "images": [f"https://m.media-amazon.com/images/I/{asin}.jpg"], "asin": asin,
        "category": category, "query": query, "product_category": product_category, "pricing": pricing,
        "full_description": full, "small_description": small, "customization_options": options,
        "product_information": {"Item Weight": "3 Ounces", "Manufacturer": "Test Maker"}, "brand": "Brand",
        "brand_url": "https://www.amazon.com/s?k=Brand", "list_price": "", "availability_quantity": None,
        "availability_status": "In Stock.", "total_reviews": 12, "total_answered_questions": 0,
        "seller_id": "A1TEST", "seller_name": "Seller", "fulfilled_by_amazon": True, "fast_track_message": " ",
        "aplus_present": False, "small_description_old": "", "average_rating": rating,
    }


def _opts(**named):
    return {k.replace("_", " ").title(): [{"value": v, "image": None} for v in vs] for k, vs in named.items()}


DEO = "Beauty & Personal Care › Personal Care › Deodorants & Antiperspirants › Deodorant"
HAIR = "Beauty & Personal Care › Hair Care › Hair Extensions, Wigs & Accessories › Hair Extensions"
SNACK = "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars"

PRODUCTS = [
    _item("B078GWRC1J", "Bright Citrus Deodorant by Earth Mama | Natural and Safe for Sensitive Skin, Pregnancy and "
          "Breastfeeding, Contains Organic Calendula 3-Ounce", "deodorant", "beauty", DEO, "$10.99",
          _opts(scent=["Assorted Scents", "Bright Citrus", "Calming Lavender", "Ginger Fresh"],
                size=["Travel Set (4-Pack)", "3 Ounce (Pack of 1)", "3-Ounce (2-Pack)"]),
          ["NATURAL DEODORANT: free of aluminum and parabens", "SAFE FOR SENSITIVE SKIN"],
          "Earth Mama's natural deodorant keeps you fresh with organic calendula and bright citrus.", "4.7"),
    _item("B09QQP3356", "HAIYEE Hair Extensions Clip in 22 Inch Long Straight Synthetic Hairpiece", "hair extensions",
          "beauty", HAIR, "$8.99 - $12.99", _opts(color=["Light Blonde", "Dark Brown/Black"]),
          ["Natural looking clip in extension", "Heat resistant fiber"], "Long straight clip-in hair extension."),
    _item("nan", "Broken row without an asin", "deodorant", "beauty", DEO, "$5.00", None, [], ""),
    _item("B0123456789XYZ", "Row with an over-long asin", "deodorant", "beauty", DEO, "$5.00", None, [], ""),
    _item("B078GWRC1J", "Duplicate asin, must be skipped", "deodorant", "beauty", DEO, "$1.00", None, [], ""),
    _item("B07PRICE00", "Chocolate Protein Bars Gluten Free 12 Count", "protein bars", "food", SNACK, "",
          _opts(flavor_name=["Chocolate Chip", "Peanut Butter"]), "High protein snack bar",
          "Gluten free protein bars with 20g protein."),
    _item("B07NOOPTS1", "Lavender Natural Deodorant Stick for Women, Aluminum Free", "deodorant", "beauty", DEO,
          "$7.49", None, "Aluminum free", "A lavender deodorant stick, aluminum free and vegan."),
    _item("B07SNACK02", "Peanut Butter Protein Bar, Low Sugar, 15 Pack", "protein bars", "food", SNACK, "$24.99",
          _opts(size=["15 Count", "30 Count"]), ["Low sugar", "Plant based protein"], "Plant based peanut butter bars."),
]

ATTRIBUTES = {
    "B078GWRC1J": {"attributes": ["sensitive skin", "natural ingredients", "paraben free"],
                   "instruction": "i need a natural deodorant", "instruction_attributes": ["sensitive skin"]},
    "B09QQP3356": {"attributes": ["natural looking", "long hair", "heat resistant"]},
    "B07PRICE00": {"attributes": ["gluten free", "high protein"]},
    "B07SNACK02": {"attributes": ["low sugar", "plant based"]},
}

HUMAN = {
    "B078GWRC1J": [
        {"asin": "B078GWRC1J", "instruction": "i would like a 3 ounce bottle of bright citrus deodorant for "
         "sensitive skin.", "instruction_attributes": ["sensitive skin"],
         "instruction_options": ["bright citrus", "3 ounce (pack of 1)"], "assignment_id": "A1", "worker_id": "W1"},
        {"asin": "B078GWRC1J", "instruction": "i want a deodorant", "instruction_attributes": [],
         "instruction_options": [], "assignment_id": "A2", "worker_id": "W2"},
    ],
    "B09QQP3356": [
        {"asin": "B09QQP3356", "instruction": "i need a long clip-in hair extension which is natural looking",
         "instruction_attributes": ["natural looking", "long hair"], "instruction_options": ["light blonde"],
         "assignment_id": "A3", "worker_id": "W1"},
    ],
    "B07PRICE00": [
        {"asin": "B07PRICE00", "instruction": "find gluten free protein bars in chocolate chip flavor",
         "instruction_attributes": ["gluten free"], "instruction_options": ["chocolate chip"],
         "assignment_id": "A4", "worker_id": "W3"},
    ],
    "B07SNACK02": [
        {"asin": "B07SNACK02", "instruction": "i am looking for low sugar protein bars, 30 count",
         "instruction_attributes": ["low sugar"], "instruction_options": ["30 count"], "assignment_id": "A5",
         "worker_id": "W2"},
    ],
    "nan": [{"asin": "nan", "instruction": "never served", "instruction_attributes": ["x"],
             "instruction_options": []}],
}


def write_official_fixture(folder: Path) -> Path:
    """Write the three official files (the _1000 variants, as ``setup.sh -d small`` names them)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "items_shuffle_1000.json").write_text(json.dumps(PRODUCTS))
    (folder / "items_ins_v2_1000.json").write_text(json.dumps(ATTRIBUTES))
    (folder / "items_human_ins.json").write_text(json.dumps(HUMAN))
    return folder


@pytest.fixture(scope="module")
def official_dir(tmp_path_factory) -> Path:
    return write_official_fixture(tmp_path_factory.mktemp("webshop_data"))


# ------------------------------------------------------------------------------------ conformance
def test_both_ids_are_registered_with_the_15_step_limit():
    assert WEBSHOP_IDS == ["crl/WebShop-Official-v0", "crl/WebShop-v0"]
    assert all(gym.spec(i).max_episode_steps == 15 for i in WEBSHOP_IDS)


@pytest.mark.parametrize("env_id", WEBSHOP_IDS)
def test_conformance_kit_passes(env_id, official_dir):
    kwargs = {"data_dir": str(official_dir)} if "Official" in env_id else {}
    report = check_text_env(env_id, make_kwargs=kwargs)
    assert "gymnasium check_env" in report.checks and "truncation at max_episode_steps" in report.checks


# ----------------------------------------------------------------------------------------- reward
def _product(**kw) -> Product:
    base = dict(asin="B000000001", title="Acme Running Shoes - Non Slip for Men", category="fashion",
                query="running shoes", product_category="Clothing › Men › Shoes › Running", pricing=[40.0],
                price=40.0, attributes=["non slip", "rubber sole"], options={"size": ["9", "10"]},
                description="Light shoes.", features=["Mesh upper"])
    return Product(**{**base, **kw})


def _goal(**kw) -> Goal:
    base = dict(asin="B000000001", instruction_text="x", attributes=["non slip"], goal_options={"size": "10"},
                price_upper=50.0, query="running shoes", category="fashion",
                product_category="Clothing › Men › Shoes › Running", name="Acme Running Shoes - Non Slip for Men")
    return Goal(**{**base, **kw})


def test_fuzzy_ratios_match_thefuzz_reference_values():
    assert round(ratio("this is a test", "this is a test!")) == 97  # thefuzz README
    assert token_set_ratio("fuzzy was a bear", "fuzzy fuzzy was a bear") == 100
    assert token_set_ratio("new york mets", "new york yankees") == 76
    assert token_set_ratio("", "x") == 0
    assert normalize_color("navy blue") == "blue" and normalize_color("10") == "10"


def test_perfect_purchase_scores_one_with_every_component_full():
    b = get_reward(_product(), _goal(), 40.0, {"size": "10"})
    assert b.reward == 1.0 and b.r_type == 1.0 and b.r_att == 1.0 and b.r_option == 1.0 and b.r_price
    assert (b.num_attr_matches, b.num_option_matches, b.num_attributes, b.num_options) == (1, 1, 1, 1)


def test_attribute_matches_fuzzily_on_attributes_or_as_text_and_otherwise_not():
    goal = _goal(attributes=["non-slip", "mesh upper", "waterproof"], goal_options={})
    b = get_reward(_product(), goal, 40.0, {})
    # "non-slip" ~ "non slip" (token set 100); "mesh upper" is in the features; "waterproof" nowhere
    assert b.num_attr_matches == 2 and b.r_att == pytest.approx(2 / 3)
    assert b.reward == pytest.approx((2 + 0 + 1) / (3 + 0 + 1))


def test_size_options_match_exactly_and_other_options_fuzzily():
    product = _product(options={"size": ["9", "10", "10.5"], "color": ["dark navy", "red"]},
                       title="Acme Running Shoes", description="", features=[])
    goal = _goal(attributes=["non slip"], goal_options={"size": "10", "color": "navy"})
    near = get_reward(product, goal, 40.0, {"size": "10.5", "color": "dark navy"})
    assert near.num_option_matches == 1  # size 10.5 != 10 (exact); colour "dark navy" ~ "navy" (fuzzy)
    assert near.reward == pytest.approx((1 + 1 + 1) / (1 + 2 + 1))
    assert get_reward(product, goal, 40.0, {"size": "10", "color": "red"}).num_option_matches == 1
    assert get_reward(product, goal, 40.0, {}).num_option_matches == 0


def test_price_above_the_bound_loses_the_price_point():
    b = get_reward(_product(), _goal(price_upper=30.0), 40.0, {"size": "10"})
    assert not b.r_price and b.reward == pytest.approx(2 / 3)


def test_type_score_cases_from_the_official_rules():
    goal = _goal()
    same_query = _product(title="Totally Different Words", product_category="A › B")
    assert get_reward(same_query, goal, 40.0, {"size": "10"}).r_type == 0.0  # title score 0 wins
    # 1 of the 6 goal type words (acme running shoes non slip men) in the title: 1/6 in [0.1, 0.2]
    weak = _product(title="Acme Kettle", query="kettle", product_category="Home › Kitchen")
    b = get_reward(weak, goal, 40.0, {"size": "10"})
    assert b.title_score == pytest.approx(1 / 6) and not b.query_match and not b.category_match
    assert b.r_type == 0.5 and b.reward == pytest.approx(0.5 * (1 + 1 + 1) / 3)
    cat = _product(title="Acme Kettle", query="kettle", product_category="Clothing › Men › Other")
    assert get_reward(cat, goal, 40.0, {}).r_type == 1.0  # two shared category levels
    tiny = _product(title="Men Kettle", query="kettle", product_category="Home")
    goal_long = _goal(name="Acme Running Shoes Non Slip Trail Racing Road Training Sport Men")
    assert get_reward(tiny, goal_long, 40.0, {}).r_type == 0.1  # 1/11 < 0.1


# ---------------------------------------------------------------------------------- catalog
def test_catalog_is_deterministic_per_seed_and_realistic():
    a, ga = generate_catalog(300, 200, seed=3)
    b, gb = generate_catalog(300, 200, seed=3)
    c, _ = generate_catalog(300, 200, seed=4)
    assert [p.to_dict() for p in a] == [p.to_dict() for p in b] and ga == gb
    assert [p.title for p in a] != [p.title for p in c]
    assert len({p.asin for p in a}) == 300 and len({p.category for p in a}) == 5 and len({p.query for p in a}) > 30
    assert all(p.title and p.description and p.features and p.attributes for p in a)
    assert any(len(p.pricing) == 2 for p in a) and any(p.reviews for p in a)


def test_every_generated_instruction_is_satisfied_by_its_target():
    shop = generated_shop()
    assert len(shop.products) == 5000 and len(shop.goals) == 6000
    for g in shop.goals:
        p = shop.by_asin[g.asin]
        assert set(g.attributes) <= set(p.attributes) and p.price <= g.price_upper
        assert all(v in p.options[n] for n, v in g.goal_options.items())
        assert g.instruction_text.endswith(f", and price lower than {g.price_upper:.2f} dollars")
        assert get_reward(p, g, p.price, dict(g.goal_options)).reward == 1.0


def test_catalog_cache_round_trips_and_survives_a_corrupt_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CRL_CACHE", str(tmp_path))
    products, goals = load_or_generate(50, 20, 7)
    (path,) = (tmp_path / "webshop").glob("catalog-v*-seed7-p50-g20.json.gz")
    again = load_or_generate(50, 20, 7)
    assert [p.to_dict() for p in again[0]] == [p.to_dict() for p in products] and again[1] == goals
    path.write_bytes(b"not gzip")
    assert load_or_generate(50, 20, 7)[0][0].to_dict() == products[0].to_dict()
    with gzip.open(path, "rt") as f:
        assert json.load(f)["generator_version"] == catalog_mod.GENERATOR_VERSION


def test_price_bound_follows_the_official_recipe():
    rng = random.Random(0)
    bounds = {price_bound(23.5, rng)[0] for _ in range(200)}
    assert bounds == {40.0, 50.0, 60.0}  # the larger of two of 30, 40, 50, 60
    assert price_bound(985.0, rng) == (catalog_mod.NO_PRICE_BOUND, "")


# ----------------------------------------------------------------------------------- search
def test_bm25s_ranks_like_brute_force_scoring():
    products, _ = generate_catalog(800, 1, seed=1)
    docs = [f"{p.title} {p.description}" for p in products]
    fast, slow = SearchEngine(docs), BruteForceBM25(docs)
    for q in ["gluten free protein bars chocolate", "navy blue running shoes", "hdmi cable 10 ft", "deodorant stick"]:
        np.testing.assert_allclose(fast.scores(q), slow.scores(q), rtol=1e-4, atol=1e-5)
        got, want = fast.search(q), slow.search(q)
        assert len(got) == min(50, int((slow.scores(q) > 0).sum())) > 0
        np.testing.assert_allclose(slow.scores(q)[got], slow.scores(q)[want], rtol=1e-4)
    assert fast.search("zzzqqq xyzzy") == [] and fast.search("the of and") == []


def test_search_keeps_accented_and_non_latin_words_whole():
    docs = ["crème brûlée dessert kit", "cream cheese spread", "抹茶 green tea powder", "plain bagels"]
    engine = SearchEngine(docs)
    assert engine.search("crème brûlée")[0] == 0 and engine.search("CRÈME")[0] == 0
    assert engine.search("抹茶") == [2]
    assert engine.search("me") == []  # not a fragment of "crème"


# ----------------------------------------------------------------------------------- site
def _env(**kw):
    return gym.make("crl/WebShop-v0", **kw)


def _step(env, action):
    obs, reward, term, trunc, info = env.step(action)
    return obs, info


def test_search_page_shows_the_instruction_and_suggests_one_search():
    env = _env()
    obs, info = env.reset(seed=0)
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ") and obs.endswith(" [SEP] Search")
    assert info["task"] in obs and len(info["admissible_actions"]) == 1
    assert info["admissible_actions"][0].startswith("search[") and "price lower" not in info["admissible_actions"][0]
    assert info["goal_index"] == 0 and env.reset(seed=7)[1]["goal_index"] == 7


def test_seed_indexes_the_split_and_unseeded_resets_draw_from_np_random():
    env = _env()
    goals = env.unwrapped.goals
    assert env.reset(seed=503)[1]["task"] == goals[3].instruction_text  # seed mod len(split)
    assert env.reset(options={"goal_index": 42})[1]["goal_index"] == 42
    env.reset(seed=11)
    drawn = [env.reset()[1]["goal_index"] for _ in range(5)]
    env.reset(seed=11)
    assert [env.reset()[1]["goal_index"] for _ in range(5)] == drawn and len(set(drawn)) > 1


def test_results_paginate_ten_at_a_time_with_next_and_prev():
    env = _env()
    env.reset(seed=1)
    obs, info = _step(env, "search[wireless earbuds]")
    site = env.unwrapped.site
    ranked = [p.asin for p in site.shop.search("wireless earbuds")]
    assert len(ranked) == 50 and "Page 1 (Total results: 50)" in obs
    assert "click[< Prev]" not in info["admissible_actions"] and "click[Next >]" in info["admissible_actions"]
    seen = []
    for page in range(1, 6):
        asins = [a[6:-1] for a in info["admissible_actions"] if a[6:-1].startswith("B0")]
        assert len(asins) == 10 and f"Page {page} (Total results: 50)" in obs
        assert all(f"[SEP] {a} [SEP]" in obs for a in asins)
        seen += asins
        if page < 5:
            obs, info = _step(env, "click[Next >]")
    assert seen == ranked and "click[Next >]" not in info["admissible_actions"]
    obs, info = _step(env, "click[next >]")
    assert not info["valid_action"] and "not clickable" in obs
    obs, info = _step(env, "click[< Prev]")
    assert info["valid_action"] and "Page 4 (Total results: 50)" in obs


def test_option_selection_sub_pages_and_back_navigation():
    env = _env()
    u = env.unwrapped
    seed = next(s for s, g in enumerate(u.goals) if len(u.shop.by_asin[g.asin].options) >= 2)
    env.reset(seed=seed)
    site = u.site
    for _ in range(8):
        if site.state.page == "item":
            break
        env.step(u.oracle_action())
    assert site.state.page == "item"
    product = site.shop.by_asin[site.state.asin]
    (n1, v1), (n2, v2) = [(n, vs) for n, vs in product.options.items()][:2]
    obs, info = _step(env, f"click[{v1[0].upper()}]")
    assert info["valid_action"] and obs.startswith(f"You have clicked {v1[0]}.") and site.state.chosen == {n1: v1[0]}
    _step(env, f"click[{v1[-1]}]")
    _step(env, f"click[{v2[0]}]")
    assert site.state.chosen == {n1: v1[-1], n2: v2[0]} and f"Selected: {n1}: {v1[-1]}, {n2}: {v2[0]}" in site.render()
    for sub, text in [("Description", product.description), ("Features", product.features[0]),
                      ("Reviews", "")]:
        obs, info = _step(env, f"click[{sub}]")
        assert text in obs and info["admissible_actions"] == ["click[Back to Search]", "click[< Prev]"]
        obs, info = _step(env, "click[< Prev]")
        assert product.title in obs and site.state.chosen == {n1: v1[-1], n2: v2[0]}  # options kept
    page_no = site.state.page_no
    obs, info = _step(env, "click[< Prev]")
    assert site.state.page == "results" and site.state.page_no == page_no and site.state.chosen == {}
    obs, info = _step(env, "click[Back to Search]")
    assert obs.endswith("[SEP] Search") and site.state.page == "search" and site.state.results == ()


@pytest.mark.parametrize("bad", ["click[Buy Now]", "click[B0NOTHERE1]", "search[", "click[Back to Search",
                                 "search[]", "search[   ]", "buy", "click]x[", "search[" + "x" * 600 + "]",
                                 "search[[nested]]x", "click[" + "a" * 3000 + "]"])
def test_bad_input_is_an_invalid_move_that_leaves_the_state_untouched(bad):
    env = _env()
    env.reset(seed=3)
    _step(env, "search[wireless earbuds]")
    site = env.unwrapped.site
    before, page = site.state, site.render()
    if bad.startswith("search["):
        _step(env, "click[Back to Search]")
        before, page = site.state, site.render()
    obs, reward, term, trunc, info = env.step(bad)
    assert not info["valid_action"] and reward == 0 and not term and obs.startswith("Invalid action:")
    assert site.state == before and site.render() == page and site.purchase is None


def test_search_needs_the_search_page():
    env = _env()
    env.reset(seed=4)
    _step(env, "search[shampoo]")
    obs, info = _step(env, "search[coffee]")
    assert not info["valid_action"] and "Back to Search" in obs


# --------------------------------------------------------------------------------- oracle / random
def _episode(env, seed, policy):
    obs, info = env.reset(seed=seed)
    for _ in range(15):
        obs, reward, term, trunc, info = env.step(policy(env, info))
        if term or trunc:
            return reward, info
    raise AssertionError("episode did not end within 15 steps")


def test_oracle_earns_reward_one_and_random_far_less():
    env = _env()
    oracle = [_episode(env, s, lambda e, i: e.unwrapped.oracle_action()) for s in range(150)]
    assert all(r == 1.0 and info["success"] for r, info in oracle)
    assert all(set(info["reward_info"]) >= {"r_type", "r_att", "r_option", "r_price", "title_score"}
               for _, info in oracle)
    rng = np.random.default_rng(0)
    rand = [_episode(env, s, lambda e, i: i["admissible_actions"][rng.integers(len(i["admissible_actions"]))])
            for s in range(150)]
    assert np.mean([r for r, _ in rand]) < 0.5 and sum(i["success"] for _, i in rand) < 20


@pytest.mark.slow
def test_oracle_earns_reward_one_on_every_generated_instruction():
    env = _env(split="all")
    for s in range(len(env.unwrapped.goals)):
        reward, info = _episode(env, s, lambda e, i: e.unwrapped.oracle_action())
        assert reward == 1.0, (s, info["reward_info"])


def test_splits_follow_the_official_goal_ranges():
    test, train = _env().unwrapped.goals, _env(split="train").unwrapped.goals
    every = _env(split="all").unwrapped.goals
    assert len(test) == 500 and test == every[:500] and train == every[1500:]
    assert _env(split="eval").unwrapped.goals == every[500:1500]
    with pytest.raises(ValueError, match="unknown split"):
        _env(split="dev")


# ---------------------------------------------------------------------------------- official data
def test_pricing_strings_parse_like_the_official_loader():
    assert parse_pricing("$12.99") == [12.99] and parse_pricing("$8.99 - $12.99") == [8.99, 12.99]
    assert parse_pricing("") == [100.0] and parse_pricing(None) == [100.0] and parse_pricing("$1,299.00") == [1299.0]


def test_official_loader_reads_the_fixture_files(official_dir):
    products, goals = load_official(official_dir)
    by = {p.asin: p for p in products}
    assert [p.asin for p in products] == ["B078GWRC1J", "B09QQP3356", "B07PRICE00", "B07NOOPTS1", "B07SNACK02"]
    assert by["B078GWRC1J"].title.startswith("Bright Citrus")  # the first of the repeated asins is kept
    assert by["B078GWRC1J"].options["size"] == ["travel set (4-pack)", "3 ounce (pack of 1)", "3-ounce (2-pack)"]
    assert by["B09QQP3356"].options["color"] == ["light blonde", "dark brown | black"]
    assert by["B09QQP3356"].pricing == [8.99, 12.99] and 8.99 <= by["B09QQP3356"].price <= 12.99
    assert by["B09QQP3356"].price_tag == "$8.99 to $12.99"
    assert by["B07PRICE00"].pricing == [100.0] and by["B07PRICE00"].features == ["High protein snack bar"]
    assert by["B07NOOPTS1"].attributes == ["DUMMY_ATTR"] and by["B07NOOPTS1"].options == {}
    assert by["B078GWRC1J"].rating == "4.7" and by["B078GWRC1J"].query == "deodorant"
    # the instruction without attributes is skipped; each gets the price clause; the order is the seed-233 shuffle
    expected = [HUMAN["B078GWRC1J"][0], HUMAN["B09QQP3356"][0], HUMAN["B07PRICE00"][0], HUMAN["B07SNACK02"][0]]
    random.Random(GOAL_SHUFFLE_SEED).shuffle(expected)
    assert [g.instruction_text.split(", and price lower than")[0] for g in goals] == \
        [e["instruction"].strip(".") for e in expected]
    for g in goals:
        upper = float(g.instruction_text.rsplit("lower than ", 1)[1].split()[0])
        assert upper == g.price_upper and by[g.asin].price < upper <= by[g.asin].price + 40


def test_official_env_serves_real_products_and_the_oracle_buys_them(official_dir):
    env = gym.make("crl/WebShop-Official-v0", data_dir=str(official_dir))
    assert len(env.unwrapped.goals) == 4
    for seed in range(4):
        obs, info = env.reset(seed=seed)
        assert "price lower than" in info["task"]
        reward, info = _episode(env, seed, lambda e, i: e.unwrapped.oracle_action())
        assert reward == 1.0 and info["purchased_asin"] == env.unwrapped.site.goal.asin
    env.reset(seed=0)
    obs, _ = _step(env, "search[bright citrus deodorant]")
    assert "B078GWRC1J" in obs and "$10.99" in obs


def test_official_env_without_data_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    with pytest.raises(WebShopDataError, match=r"WEBSHOP_DATA is not set.*setup\.sh"):
        gym.make("crl/WebShop-Official-v0")
    monkeypatch.setenv("WEBSHOP_DATA", str(tmp_path))
    with pytest.raises(WebShopDataError, match="items_shuffle.*not found"):
        gym.make("crl/WebShop-Official-v0")
    (tmp_path / "items_shuffle.json").write_text("{not json")
    (tmp_path / "items_human_ins.json").write_text("{}")
    with pytest.raises(WebShopDataError, match="cannot read"):
        gym.make("crl/WebShop-Official-v0")
