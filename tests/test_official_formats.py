"""The loaders on files laid out exactly as the official releases lay them out.

Fixtures are written here in the real formats: ALFWorld's ``alfworld-download`` tree
(``json_2.1.1/<split>/<task>/<trial>/`` with ``traj_data.json``, ``initial_state.pddl`` and, for most
trials, ``game.tw-pddl``), WebShop's ``items_shuffle*.json`` / ``items_ins_v2*.json`` /
``items_human_ins.json``, and SWE-bench instance files as exported from the Hugging Face datasets
(JSON-encoded test lists, timestamps, numeric versions, extra columns, JSON-lines in a ``.json``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from pathlib import Path

import gymnasium as gym
import pytest

import crl_envs  # noqa: F401

# =============================================================================================== ALFWorld
ALF_TASKS = ("pick_and_place_simple", "look_at_obj_in_light")


def _traj_data(task_type: str, params: dict, floor_plan: str, trial: str, task_desc: str) -> dict:
    """A ``traj_data.json`` with the fields of ALFRED's real trajectory files."""
    scene_num = int(floor_plan.removeprefix("FloorPlan"))
    return {
        "images": [{"high_idx": 0, "image_name": "000000000.png", "low_idx": 0}],
        "pddl_params": {"mrecep_target": "", "object_sliced": False, "object_target": params["object_target"],
                        "parent_target": params["parent_target"], "toggle_target": params["toggle_target"]},
        "plan": {"high_pddl": [{"discrete_action": {"action": "GotoLocation", "args": ["sofa"]}, "high_idx": 0}],
                 "low_actions": [{"api_action": {"action": "MoveAhead", "forceAction": True}, "high_idx": 0}]},
        "scene": {"dirty_and_empty": False, "floor_plan": floor_plan, "init_action": {"action": "TeleportFull",
                  "horizon": 30, "rotateOnTeleport": True, "rotation": 90, "x": -1.25, "y": 0.9, "z": 0.5},
                  "object_poses": [], "object_toggles": [], "random_seed": 1964318146, "scene_num": scene_num},
        "task_id": trial,
        "task_type": task_type,
        "turk_annotations": {"anns": [{"assignment_id": "A1TEST", "high_descs": ["Walk to the sofa."],
                                       "task_desc": task_desc, "votes": [1, 1, 1]}]},
    }


def _put_trial(split_dir: Path, task_dir: str, trial: str, traj: dict, game: dict | None, problem: str) -> Path:
    dst = split_dir / task_dir / trial
    dst.mkdir(parents=True)
    (dst / "traj_data.json").write_text(json.dumps(traj, indent=4))
    (dst / "initial_state.pddl").write_text(problem)
    if game is not None:
        (dst / "game.tw-pddl").write_text(json.dumps(game))
    return dst / "game.tw-pddl"


@pytest.fixture(scope="module")
def alf_tree(tmp_path_factory):
    """An ``alfworld-download`` tree built from two generated games, rewritten in the official form.

    valid_unseen: a pick-and-place game whose walkthrough uses the pre-0.4 ``put X in/on Y``
    spelling, a second trial of the same task without ``game.tw-pddl`` (as in the real tree), a
    look-at-in-light game without a ``walkthrough`` key, and a movable-receptacle trial;
    valid_seen and train: one game each. No file carries crl's own ``crl`` key.
    """
    pytest.importorskip("alfworld")
    pytest.importorskip("textworld")
    from alfworld.agents.utils.misc import add_task_to_grammar
    from alfworld.info import ALFRED_TWL2_PATH

    from crl_envs.alfworld import games as games_mod

    old_cache = os.environ.get("CRL_CACHE")
    os.environ["CRL_CACHE"] = str(tmp_path_factory.mktemp("crl_cache"))
    try:
        sources = {t: games_mod.get_game(t, 0) for t in ALF_TASKS}
    finally:
        if old_cache is None:
            os.environ.pop("CRL_CACHE", None)
        else:
            os.environ["CRL_CACHE"] = old_cache
    root = tmp_path_factory.mktemp("alfworld") / "data"
    grammar_src = Path(ALFRED_TWL2_PATH).read_text()
    rng = random.Random(0)
    made: dict[str, list[str]] = {"train": [], "valid_seen": [], "valid_unseen": []}
    for n, task_type in enumerate(ALF_TASKS):
        src = json.loads(Path(sources[task_type]).read_text())
        spec = src["crl"]
        params = {k: spec[k] for k in ("object_target", "parent_target", "toggle_target")}
        floor_plan = f"FloorPlan{spec['floor_plan']}"
        task_dir = "-".join([task_type, params["object_target"], "None",
                             params["parent_target"] or params["toggle_target"], str(spec["floor_plan"])])
        for split in made:
            trial = f"trial_T2019090{n + 1}_17412{len(made[split])}_04346{n}"
            traj = _traj_data(task_type, params, floor_plan, trial, f"Put the {params['object_target']} away.")
            random.seed(rng.random())  # add_task_to_grammar draws its template from the global random
            game = {"pddl_domain": src["pddl_domain"], "grammar": add_task_to_grammar(grammar_src, traj),
                    "pddl_problem": src["pddl_problem"], "solvable": True, "walkthrough": list(src["walkthrough"])}
            if task_type == "pick_and_place_simple":
                game["walkthrough"] = [c.replace(" to ", " in/on ").replace("move ", "put ", 1)
                                       if c.startswith("move ") else c for c in game["walkthrough"]]
            else:
                del game["walkthrough"]  # the older (0.2.2) assets have no walkthrough
            made[split].append(str(_put_trial(root / "json_2.1.1" / split, task_dir, trial, traj, game,
                                              src["pddl_problem"])))
            if split == "valid_unseen" and n == 0:  # the same task, a trial that has no game.tw-pddl
                _put_trial(root / "json_2.1.1" / split, task_dir, trial + "9", traj, None, src["pddl_problem"])
                movable = "pick_and_place_with_movable_recep-Pillow-Box-ArmChair-217"
                _put_trial(root / "json_2.1.1" / split, movable, trial, {**traj, "task_type": movable.split("-")[0]},
                           game, src["pddl_problem"])
    (root / "logic").mkdir()
    (root / "logic" / "alfred.twl2").write_text(grammar_src)
    return root, {k: sorted(v) for k, v in made.items()}


def _alfworld_own_collect(split_path: Path) -> list[str]:
    """The games alfworld 0.4.2's own ``AlfredTWEnv.collect_game_files`` keeps (its 134 on valid_unseen)."""
    pytest.importorskip("alfworld")
    pytest.importorskip("textworld")
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    config = {"env": {"goal_desc_human_anns_prob": 0.0, "task_types": [1, 2, 3, 4, 5, 6]},
              "dataset": {"eval_ood_data_path": str(split_path), "num_eval_games": -1}}
    return sorted(AlfredTWEnv(config, train_eval="eval_out_of_distribution").game_files)


def test_alfworld_download_tree_lists_each_split_and_skips_trials_without_a_game_file(alf_tree):
    from crl_envs.alfworld.official import official_games

    root, made = alf_tree
    for split, games in made.items():
        assert list(official_games(split, str(root))) == games
    unseen = root / "json_2.1.1" / "valid_unseen"
    assert len([p for p in unseen.rglob("traj_data.json")]) == 4  # 2 games, 1 trial without one, 1 movable
    assert list(official_games("valid_unseen", str(root))) == _alfworld_own_collect(unseen)


def test_official_game_count_matches_alfworlds_own_loader_on_every_skip_rule(tmp_path):
    """The rules that make valid_unseen 134 games: same set as alfworld's own collector."""
    from crl_envs.alfworld.official import official_games

    split = tmp_path / "json_2.1.1" / "valid_unseen"
    game = {"pddl_domain": "(define (domain alfred))", "grammar": "grammar :: ...", "pddl_problem": "(define)",
            "solvable": True, "walkthrough": ["look"]}
    params = {"object_target": "Mug", "parent_target": "Shelf", "toggle_target": ""}
    cases = {  # task folder -> (task_type in traj_data, game.tw-pddl or None)
        "pick_and_place_simple-Mug-None-Shelf-308": ("pick_and_place_simple", game),
        "pick_two_obj_and_place-Mug-None-Shelf-308": ("pick_two_obj_and_place", game),
        "pick_cool_then_place_in_recep-Mug-None-Shelf-308": ("pick_cool_then_place_in_recep", None),
        "pick_heat_then_place_in_recep-Mug-None-Shelf-308": ("pick_heat_then_place_in_recep", {**game, "solvable": False}),
        "pick_clean_then_place_in_recep-Mug-None-Shelf-308": ("pick_clean_then_place_in_recep",
                                                              {k: v for k, v in game.items() if k != "solvable"}),
        "pick_and_place_with_movable_recep-Mug-Pan-Shelf-308": ("pick_and_place_with_movable_recep", game),
        "pick_and_place_simple-AppleSliced-None-Shelf-308": ("pick_and_place_simple", game),
        "look_at_obj_in_light-Mug-None-DeskLamp-308": ("look_at_obj_in_light", game),
    }
    for i, (task_dir, (task_type, g)) in enumerate(sorted(cases.items())):
        for t in range(2):
            trial = f"trial_T20190908_0{i}{t}000_000000"
            _put_trial(split, task_dir, trial, _traj_data(task_type, params, "FloorPlan308", trial, "x"), g, "(p)")
    ours = list(official_games("valid_unseen", str(tmp_path)))
    assert ours == _alfworld_own_collect(split) and len(ours) == 6


def test_alfworld_data_may_name_json_2_1_1_itself_or_use_vars_and_home(alf_tree, monkeypatch):
    from crl_envs.alfworld.official import official_games

    root, made = alf_tree
    assert list(official_games("valid_unseen", str(root / "json_2.1.1"))) == made["valid_unseen"]
    monkeypatch.setenv("CRL_TEST_ALF_ROOT", str(root))
    monkeypatch.setenv("ALFWORLD_DATA", "$CRL_TEST_ALF_ROOT/json_2.1.1")
    assert list(official_games("valid_seen")) == made["valid_seen"]
    monkeypatch.setenv("HOME", str(root.parent))
    monkeypatch.setenv("ALFWORLD_DATA", "~/data")
    assert list(official_games("train")) == made["train"]


def test_unset_alfworld_data_falls_back_to_alfworld_downloads_default_folder(alf_tree, monkeypatch, tmp_path):
    from crl_envs.alfworld.official import OfficialDataNotFound, official_games

    root, made = alf_tree
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(OfficialDataNotFound, match=r"ALFWORLD_DATA is not set.*alfworld-download"):
        official_games("valid_unseen")
    (tmp_path / ".cache" / "alfworld").mkdir(parents=True)
    (tmp_path / ".cache" / "alfworld" / "json_2.1.1").symlink_to(root / "json_2.1.1")
    assert len(official_games("valid_unseen")) == len(made["valid_unseen"])


def test_a_data_folder_whose_own_path_says_movable_or_sliced_still_loads(alf_tree, tmp_path):
    from crl_envs.alfworld.official import official_games

    root, made = alf_tree
    moved = tmp_path / "runs_movable_Sliced" / "alfworld"
    shutil.copytree(root / "json_2.1.1" / "valid_seen", moved / "json_2.1.1" / "valid_seen")
    assert len(official_games("valid_seen", str(moved))) == len(made["valid_seen"])


@pytest.mark.parametrize(("file", "content", "match"), [
    ("traj_data.json", "{truncated", r"traj_data\.json: not a readable JSON file"),
    ("traj_data.json", json.dumps({"scene": {}}), r"traj_data\.json: field 'task_type' is missing"),
    ("game.tw-pddl", "", r"game\.tw-pddl: not a readable JSON file"),
    ("game.tw-pddl", json.dumps({"pddl_domain": "(d)", "grammar": "g", "solvable": True}),
     r"game\.tw-pddl: field 'pddl_problem' is missing"),
    ("game.tw-pddl", json.dumps(["not", "a", "game"]), r"game\.tw-pddl: a game\.tw-pddl file must hold a JSON object"),
])
def test_broken_official_files_raise_errors_naming_the_file_and_field(alf_tree, tmp_path, file, content, match):
    from crl_envs.alfworld.official import OfficialDataError, official_games

    root, made = alf_tree
    shutil.copytree(root / "json_2.1.1" / "train", tmp_path / "json_2.1.1" / "train")
    target = Path(made["train"][0].replace(str(root), str(tmp_path))).parent / file
    target.write_text(content)
    with pytest.raises(OfficialDataError, match=match) as err:
        official_games("train", str(tmp_path))
    assert str(target) in str(err.value)


def test_official_env_plays_realistic_games_end_to_end_and_the_oracle_wins(alf_tree):
    root, made = alf_tree
    env = gym.make("crl/ALFWorld-Official-v0", data_path=str(root))
    try:
        for seed, game_file in enumerate(made["valid_unseen"]):
            obs, info = env.reset(seed=seed)
            assert info["game_file"] == game_file and info["task_type"] in ALF_TASKS
            assert "Your task is to:" in obs and info["task"] and "UNKNOWN GOAL" not in info["task"]
            assert info["admissible_actions"] and "look" in info["admissible_actions"]
            for _ in range(50):
                obs, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
                assert info["valid_action"], obs
                if terminated or truncated:
                    break
            assert terminated and reward == 1.0 and info["success"]
    finally:
        env.close()
    seen = gym.make("crl/ALFWorld-Official-v0", data_path=str(root / "json_2.1.1"), split="valid_seen")
    try:
        _, info = seen.reset(seed=0)
        assert info["game_file"] == made["valid_seen"][0]
    finally:
        seen.close()


# ================================================================================================ WebShop
def _ws_item(asin: str, **fields) -> dict:
    """A product row with the keys of the real ``items_shuffle*.json`` (scraped Amazon pages)."""
    item = {
        "name": f"Product {asin}", "full_description": "", "pricing": "$9.99", "images": [
            f"https://m.media-amazon.com/images/I/{asin}.jpg"], "product_category": "Beauty & Personal Care › Skin Care",
        "average_rating": 4.4, "small_description": ["Great product"], "model": "", "customization_options": {},
        "seller_id": "A2TEST", "seller_name": "Seller", "fulfilled_by_amazon": True, "fast_track_message": "",
        "aplus_present": True, "small_description_old": "", "brand": "Brand", "brand_url": "", "list_price": "",
        "availability_quantity": None, "availability_status": "In Stock.", "total_reviews": 7,
        "total_answered_questions": 0, "product_information": {"ASIN": asin}, "asin": asin,
        "category": "beauty", "query": "body butter", "page": 1,
    }
    item.update(fields)
    return item


def _ws_opts(**named: list) -> dict:
    return {name.replace("_", " ").title(): [{"value": v, "image": f"https://m.media-amazon.com/images/I/{v}.jpg"}
                                             for v in values] for name, values in named.items()}


WS_PRODUCTS = [
    _ws_item("B08UNICODE", name="Crème Brûlée Körperbutter – Shea & Cocoa Body Butter, 200 ml (6.7 fl oz)",
             full_description="Whipped body butter with shea, cocoa and a crème brûlée scent. Parfümfrei option.",
             pricing="$12.99", average_rating="4.6 out of 5 stars",
             customization_options={**_ws_opts(scent=["Vanilla/Bean", "Crème Brûlée"], size=["6.7 Fl Oz (Pack of 1)"]),
                                    "Color": []}),
    _ws_item("B07TITLEON", name=None, Title="Stainless Steel Travel Mug, 16 oz, Leak Proof Lid", query="travel mug",
             category="kitchen", product_category="Home & Kitchen › Kitchen & Dining › Travel Mugs",
             full_description="Vacuum insulated stainless steel travel mug with a leak proof lid.",
             pricing=None, customization_options=None, small_description=None, average_rating=None),
    _ws_item("B09RANGE01", name="Men's Cotton Crew Neck T-Shirt, Pack of 3", query="t shirt", category="fashion",
             product_category="Clothing, Shoes & Jewelry › Men › Clothing › T-Shirts",
             full_description="Soft breathable cotton crew neck tee.", pricing="$10.99 - $15.99",
             customization_options={"Size": None, "Color": [{"value": "Navy Blue", "image": None}, {"value": ""},
                                                            {"image": "https://x/no-value.jpg"}],
                                    "Fit Type": [{"value": "Regular"}, {"value": "Big & Tall"}]},
             small_description="Machine wash"),
    _ws_item("B0NOPRICE1", name="Organic Green Tea Bags, 100 Count", query="green tea", category="grocery",
             product_category="Grocery & Gourmet Food › Beverages › Tea", pricing="Currently unavailable.",
             full_description="Organic green tea, individually wrapped bags."),
    _ws_item("B0EXPENSV1", name="Espresso Machine with Milk Frother, 15 Bar", query="espresso machine",
             category="kitchen", product_category="Home & Kitchen › Coffee, Tea & Espresso", pricing="$1,249.00",
             full_description="A 15 bar espresso machine with a steam wand for milk frothing."),
]

WS_ATTRIBUTES = {
    "B08UNICODE": {"attributes": ["shea butter", "cruelty free", "dry skin"], "instruction": "i want body butter",
                   "instruction_attributes": ["dry skin"], "instruction_options": {"scent": "vanilla | bean"}},
    "B07TITLEON": [{"attributes": ["leak proof", "stainless steel"], "instruction": "i want a leak proof mug",
                    "instruction_attributes": ["leak proof"], "instruction_options": []}],
    "B09RANGE01": {"attributes": ["machine wash", "cotton"]},
}


def _human(asin: str, text: str, attrs: list, options, n: int) -> dict:
    return {"asin": asin, "instruction": text, "instruction_attributes": attrs, "instruction_options": options,
            "assignment_id": f"3ASSIGN{n}", "worker_id": f"AWORKER{n}"}


WS_HUMAN = {
    "B08UNICODE": [_human("B08UNICODE", "i'm looking for a crème brûlée body butter for dry skin in vanilla | bean "
                          "scent.", ["dry skin"], ["vanilla | bean", "6.7 fl oz (pack of 1)"], 1)],
    "B07TITLEON": _human("B07TITLEON", "i need a leak proof stainless steel travel mug.", ["leak proof"], [], 2),
    "B09RANGE01": [_human("B09RANGE01", "i want a navy blue cotton crew neck t-shirt, big & tall.",
                          ["cotton"], {"color": "navy blue", "fit type": "big & tall"}, 3),
                   _human("B09RANGE01", "a t-shirt", [], [], 4)],
    "B0NOPRICE1": [_human("B0NOPRICE1", "organic green tea bags, 100 count", ["organic"], None, 5)],
    "B0EXPENSV1": [_human("B0EXPENSV1", "i want an espresso machine with a milk frother", ["milk frother"], [], 6)],
    "B0NOTINCAT": [_human("B0NOTINCAT", "a product outside the 1000", ["x"], [], 7)],
}


def _write_webshop(folder: Path, products=WS_PRODUCTS, attributes=WS_ATTRIBUTES, human=WS_HUMAN) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "items_shuffle_1000.json").write_text(json.dumps(products, ensure_ascii=False), encoding="utf-8")
    (folder / "items_ins_v2_1000.json").write_text(json.dumps(attributes), encoding="utf-8")
    (folder / "items_human_ins.json").write_text(json.dumps(human), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def ws_dir(tmp_path_factory) -> Path:
    return _write_webshop(tmp_path_factory.mktemp("webshop_official") / "data")


@pytest.mark.parametrize(("pricing", "expected"), [
    ("$12.99", [12.99]), ("$10.99 - $15.99", [10.99, 15.99]), ("$1,249.00", [1249.0]), ("", [100.0]),
    (None, [100.0]), ("Currently unavailable.", [100.0]), ("$", [100.0]), ("$ 7.50", [7.5]),
    ("$0.99 - $1.49 - $2.00", [0.99, 1.49]), ("$12.99.1", [100.0]), (8.5, [8.5]),
])
def test_webshop_pricing_strings_in_every_shape_the_scrape_has(pricing, expected):
    from crl_envs.webshop.official import parse_pricing

    assert parse_pricing(pricing) == expected


def test_webshop_realistic_catalog_loads_titles_options_attributes_and_goals(ws_dir):
    from crl_envs.webshop.official import load_official

    products, goals = load_official(ws_dir)
    by = {p.asin: p for p in products}
    assert list(by) == ["B08UNICODE", "B07TITLEON", "B09RANGE01", "B0NOPRICE1", "B0EXPENSV1"]
    assert by["B08UNICODE"].title.startswith("Crème Brûlée Körperbutter")
    assert by["B08UNICODE"].options == {"scent": ["vanilla | bean", "crème brûlée"], "size": ["6.7 fl oz (pack of 1)"]}
    assert by["B07TITLEON"].title.startswith("Stainless Steel Travel Mug")  # only a "Title" key
    assert by["B07TITLEON"].attributes == ["leak proof", "stainless steel"]  # items_ins_v2 entry given as a list
    assert by["B07TITLEON"].pricing == [100.0] and by["B07TITLEON"].features == [] and by["B07TITLEON"].options == {}
    assert by["B09RANGE01"].options == {"color": ["navy blue"], "fit type": ["regular", "big & tall"]}
    assert by["B09RANGE01"].features == ["Machine wash"] and 10.99 <= by["B09RANGE01"].price <= 15.99
    assert by["B0NOPRICE1"].pricing == [100.0] and by["B0NOPRICE1"].attributes == ["DUMMY_ATTR"]
    assert {g.asin for g in goals} == {"B08UNICODE", "B07TITLEON", "B09RANGE01", "B0NOPRICE1", "B0EXPENSV1"}
    expensive = next(g for g in goals if g.asin == "B0EXPENSV1")
    assert "price lower than" not in expensive.instruction_text and expensive.price_upper >= 1e6
    mug = next(g for g in goals if g.asin == "B07TITLEON")
    assert mug.name == by["B07TITLEON"].title and mug.instruction_text.startswith("i need a leak proof")


def test_webshop_official_env_serves_human_instructions_and_the_oracle_earns_1(ws_dir):
    env = gym.make("crl/WebShop-Official-v0", data_dir=str(ws_dir), split="all")
    n = len(env.unwrapped.goals)
    assert n == 5
    for seed in range(n):
        obs, info = env.reset(seed=seed)
        assert info["task"] in obs
        for _ in range(15):
            obs, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
            assert info["valid_action"], obs
            if terminated or truncated:
                break
        assert terminated and reward == 1.0, (info["task"], info.get("reward_info"))
        assert info["purchased_asin"] == env.unwrapped.site.goal.asin
    env.close()


@pytest.mark.parametrize(("which", "bad", "match"), [
    ("human", {"B08UNICODE": ["just a string"]}, r"items_human_ins\.json: asin 'B08UNICODE', instruction 0"),
    ("human", [{"asin": "B08UNICODE"}], r"items_human_ins\.json: must map each asin to its instructions"),
    ("human", {"B08UNICODE": [{"instruction_attributes": ["dry skin"]}]},
     r"items_human_ins\.json: asin 'B08UNICODE', instruction 0: field 'instruction'"),
    ("human", {"B0NOTINCAT": WS_HUMAN["B0NOTINCAT"]}, r"no usable human instruction.*items_shuffle_1000\.json"),
    ("products", {"B08UNICODE": WS_PRODUCTS[0]}, r"items_shuffle_1000\.json must hold a JSON list"),
])
def test_webshop_malformed_files_name_the_file_and_field(tmp_path, which, bad, match):
    from crl_envs.webshop.official import WebShopDataError, load_official

    kwargs = {"products": bad} if which == "products" else {"human": bad}
    folder = _write_webshop(tmp_path / "data", **kwargs)
    with pytest.raises(WebShopDataError, match=match) as err:
        load_official(folder)
    assert str(folder) in str(err.value)


# ============================================================================================== SWE-bench
SHA = "a0df2cbb10419037d11d04352b3175405ab52941"
PATCH = ("diff --git a/requests/sessions.py b/requests/sessions.py\n--- a/requests/sessions.py\n"
         "+++ b/requests/sessions.py\n@@ -425,1 +425,1 @@\n-        method = builtin_str(method)\n"
         "+        method = to_native_string(method)\n")
TEST_PATCH = ("diff --git a/test_requests.py b/test_requests.py\n--- a/test_requests.py\n+++ b/test_requests.py\n"
              "@@ -1,1 +1,2 @@\n import os\n+import io\n")


def _swe_row(n: int, **fields) -> dict:
    """A row as the Hugging Face ``princeton-nlp/SWE-bench_Verified`` split gives it (test lists JSON-encoded)."""
    row = {
        "repo": "psf/requests", "instance_id": f"psf__requests-{2317 + n}", "base_commit": SHA, "patch": PATCH,
        "test_patch": TEST_PATCH, "problem_statement": "method = builtin_str(method) breaks binary methods",
        "hints_text": "", "created_at": "2014-11-01T02:20:16Z", "version": "2.4",
        "FAIL_TO_PASS": json.dumps(["test_requests.py::RequestsTestCase::test_HTTP_200_OK_GET_ALTERNATIVE"]),
        "PASS_TO_PASS": json.dumps(["test_requests.py::RequestsTestCase::test_BASICAUTH_TUPLE_HTTP_200_OK_GET",
                                    "test_requests.py::TestMorselToCookieExpires::test_expires_none"]),
        "environment_setup_commit": "091991be0da19de9108dbe5e3752917fea3d7fdc", "difficulty": "<15 min fix",
    }
    row.update(fields)
    return row


def test_swe_jsonl_export_with_string_test_lists_numeric_versions_and_extras(tmp_path):
    from crl_envs.swe.instances import load_instances

    rows = [_swe_row(0), _swe_row(1, version=2.4, hints_text=None),
            _swe_row(2, image_assets=json.dumps({"problem_statement": ["https://i.imgur.com/x.png"], "patch": []})),
            _swe_row(3, version=3, created_at=1415000000000)]
    path = tmp_path / "verified.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(UserWarning, match=r"field 'version' is a number .*'1\.10' and '1\.1'"):
        insts = load_instances(path)
    assert [i.version for i in insts] == ["2.4", "2.4", "2.4", "3"]
    assert insts[0].FAIL_TO_PASS == ("test_requests.py::RequestsTestCase::test_HTTP_200_OK_GET_ALTERNATIVE",)
    assert len(insts[0].PASS_TO_PASS) == 2 and insts[1].hints_text == ""
    assert insts[0].extra["difficulty"] == "<15 min fix" and "image_assets" in insts[2].extra
    assert insts[3].created_at == "2014-11-03T07:33:20Z"  # epoch milliseconds, as pandas writes datetimes
    assert insts[0].environment_setup_commit == "091991be0da19de9108dbe5e3752917fea3d7fdc"


def test_swe_parquet_with_timestamps_float_versions_and_array_test_lists_loads_and_saves(tmp_path):
    pd = pytest.importorskip("pandas")
    from crl_envs.swe.instances import load_instances, save_instances

    df = pd.DataFrame([_swe_row(0), _swe_row(1, version="0.20")])
    df["created_at"] = pd.to_datetime(df["created_at"])  # what a pandas round trip leaves
    df["updated_at"] = pd.to_datetime(["2015-01-01", "2015-01-02"])  # an extra timestamp column
    df["FAIL_TO_PASS"] = df["FAIL_TO_PASS"].map(json.loads)  # real lists, as SWE-Gym stores them
    path = tmp_path / "test-00000-of-00001.parquet"
    df.to_parquet(path)
    insts = load_instances(path)
    assert insts[0].created_at == "2014-11-01T02:20:16Z" and insts[1].version == "0.20"
    assert insts[0].FAIL_TO_PASS == ("test_requests.py::RequestsTestCase::test_HTTP_200_OK_GET_ALTERNATIVE",)
    again = load_instances(save_instances(insts, tmp_path / "again.jsonl"))
    assert again == insts and again[0].extra["updated_at"].startswith("2015-01-01")


@pytest.mark.parametrize("writer", ["datasets_to_json", "pandas_columns", "pandas_records", "pandas_index",
                                    "pandas_split", "instances_key"])
def test_swe_json_exports_in_every_layout_hf_and_pandas_write(tmp_path, writer):
    pd = pytest.importorskip("pandas")
    from crl_envs.swe.instances import load_instances

    rows = [_swe_row(0), _swe_row(1)]
    path = tmp_path / "lite.json"
    if writer == "datasets_to_json":  # Dataset.to_json writes JSON lines, even into a .json file
        datasets = pytest.importorskip("datasets")
        datasets.Dataset.from_list(rows).to_json(str(path))
    elif writer == "instances_key":
        path.write_text(json.dumps({"instances": rows}))
    else:
        df = pd.DataFrame(rows)
        df["created_at"] = pd.to_datetime(df["created_at"])
        with warnings.catch_warnings():  # pandas 3 deprecates "epoch", the default of pandas 1-2 users have
            warnings.simplefilter("ignore")
            df.to_json(path, orient=writer.removeprefix("pandas_"), date_format="epoch")
    insts = load_instances(path)
    assert [i.instance_id for i in insts] == ["psf__requests-2317", "psf__requests-2318"]
    assert insts[0].created_at == "2014-11-01T02:20:16Z" and insts[0].version == "2.4"
    assert insts[1].PASS_TO_PASS[1] == "test_requests.py::TestMorselToCookieExpires::test_expires_none"


@pytest.mark.parametrize(("name", "content", "match"), [
    ("empty.json", "", r"empty\.json: the file is empty"),
    ("empty.parquet", "", r"empty\.parquet: not a readable parquet file"),
    ("blank.jsonl", "\n\n", r"blank\.jsonl: the file holds no instances"),
    ("noid.jsonl", "ROW_NO_ID", r"noid\.jsonl:2: missing required field 'instance_id'"),
    ("noid.parquet", "ROW_NO_ID", r"noid\.parquet row 1: missing required field 'instance_id'"),
    ("bool.json", "BOOL_VERSION", r"bool\.json\[0\] \(instance_id='psf__requests-2317'\): field 'version'"),
    ("snapshot", "HF_SNAPSHOT", r"snapshot: is a folder; pass one instance file.*test-00000-of-00001\.parquet"),
    ("f2p.jsonl", "BAD_F2P", r"f2p\.jsonl:1 \(instance_id='psf__requests-2317'\): field 'FAIL_TO_PASS' is a string "
                             r"but not valid JSON"),
])
def test_swe_malformed_or_empty_files_name_the_file_row_and_field(tmp_path, name, content, match):
    from crl_envs.swe.instances import InstanceFileError, load_instances

    path = tmp_path / name
    if content == "ROW_NO_ID":
        rows = [_swe_row(0), {k: v for k, v in _swe_row(1).items() if k != "instance_id"}]
        if name.endswith(".parquet"):
            pd = pytest.importorskip("pandas")
            pd.DataFrame(rows).to_parquet(path)
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif content == "BOOL_VERSION":
        path.write_text(json.dumps([_swe_row(0, version=True)]))
    elif content == "HF_SNAPSHOT":  # what `huggingface-cli download princeton-nlp/SWE-bench_Lite` leaves
        (path / "data").mkdir(parents=True)
        for split in ("dev", "test"):
            (path / "data" / f"{split}-00000-of-00001.parquet").write_bytes(b"PAR1")
        (path / "README.md").write_text("---\ndataset_info: ...\n---\n")
    elif content == "BAD_F2P":
        path.write_text(json.dumps(_swe_row(0, FAIL_TO_PASS="test_requests.py::test_a, test_b")) + "\n")
    else:
        path.write_text(content)
    with pytest.raises(InstanceFileError, match=match) as err:
        load_instances(path)
    assert str(path) in str(err.value)


def test_swe_bench_env_without_the_repository_offline_names_the_fix(tmp_path):
    from crl_envs.swe.sandbox import SandboxUnavailable

    path = tmp_path / "lite.jsonl"
    path.write_text(json.dumps(_swe_row(0)) + "\n")
    with pytest.raises(FileNotFoundError, match=r"No repository for psf__requests-2317 \(psf/requests\)") as err:
        try:
            gym.make("crl/SWE-Bench-v0", instances=str(path), repos_dir=str(tmp_path / "repos"))  # fails at make
        except SandboxUnavailable as e:
            pytest.skip(f"the bwrap sandbox cannot run here: {e}")
    msg = str(err.value)
    assert str(tmp_path / "repos" / "psf__requests.git") in msg and "repos_dir" in msg and "SWE_REPOS" in msg


def test_swe_multimodal_javascript_rows_load_with_their_swebench_log_parser(tmp_path):
    pytest.importorskip("swebench")
    from crl_envs.swe.instances import load_instances

    row = _swe_row(0, repo="Automattic/wp-calypso", instance_id="Automattic__wp-calypso-21648", version="10.10.0",
                   image_assets={"problem_statement": ["https://user-images.githubusercontent.com/1/x.png"],
                                 "patch": [], "test_patch": []},
                   FAIL_TO_PASS=json.dumps(["client/state/selectors/test/index.js | should return the site"]))
    path = tmp_path / "multimodal.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n")
    (inst,) = load_instances(path)
    assert inst.parser_name == "parse_log_calypso" and inst.version == "10.10.0"
    assert inst.extra["image_assets"]["problem_statement"][0].endswith("x.png")
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY

    classic = tmp_path / "lite.jsonl"
    classic.write_text(json.dumps(_swe_row(0)) + "\n")
    assert load_instances(classic)[0].parser_name == MAP_REPO_TO_PARSER_PY["psf/requests"].__name__
