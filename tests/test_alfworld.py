from __future__ import annotations

import json
import os
import shutil

import gymnasium as gym
import pytest

pytest.importorskip("alfworld", reason="ALFWorld needs alfworld (pip install -e '.[alfworld]')")
pytest.importorskip("textworld", reason="ALFWorld needs textworld (pip install -e '.[alfworld]')")

import crl_envs  # noqa: E402,F401
from crl_envs.alfworld import games as games_mod  # noqa: E402
from crl_envs.alfworld.generator import TASK_TYPES, build_problem, mangle  # noqa: E402
from crl_envs.alfworld.official import OfficialDataNotFound, official_games  # noqa: E402
from crl_envs.registry import crl_env_ids  # noqa: E402
from crl_envs.testing import check_text_env  # noqa: E402

# Game seeds come from range(NUM_GAMES): every test below reuses the same few generated games
# (seeds 0 and 1 map to the two different games of each id).
NUM_GAMES = 2
ALF_IDS = [i for i in crl_env_ids() if i.startswith("crl/ALFWorld-")]
VARIANT = {"pick_and_place_simple": "PickPlace", "look_at_obj_in_light": "Look",
           "pick_clean_then_place_in_recep": "PickClean", "pick_heat_then_place_in_recep": "PickHeat",
           "pick_cool_then_place_in_recep": "PickCool", "pick_two_obj_and_place": "PickTwo"}


@pytest.fixture(scope="module", autouse=True)
def game_cache(tmp_path_factory):
    """Generate games into a per-module cache, not the user's."""
    old = os.environ.get("CRL_CACHE")
    os.environ["CRL_CACHE"] = str(tmp_path_factory.mktemp("crl_cache"))
    yield os.environ["CRL_CACHE"]
    if old is None:
        os.environ.pop("CRL_CACHE", None)
    else:
        os.environ["CRL_CACHE"] = old


@pytest.fixture(scope="module")
def official_tree(tmp_path_factory, game_cache):
    """A tiny tree in the official layout, with every case alfworld's loader skips."""
    root = tmp_path_factory.mktemp("alfworld_data")
    split = root / "json_2.1.1" / "valid_unseen"

    def put(task_dir: str, trial: str, task_type: str, seed: int, edit=None, traj_task_type=None):
        src = os.path.dirname(games_mod.get_game(task_type, seed))
        dst = split / task_dir / trial
        dst.mkdir(parents=True)
        shutil.copy(os.path.join(src, "game.tw-pddl"), dst / "game.tw-pddl")
        traj = json.loads(open(os.path.join(src, "traj_data.json")).read())
        if traj_task_type:
            traj["task_type"] = traj_task_type
        (dst / "traj_data.json").write_text(json.dumps(traj))
        if edit:
            data = json.loads((dst / "game.tw-pddl").read_text())
            edit(data)
            (dst / "game.tw-pddl").write_text(json.dumps(data))
        return str(dst / "game.tw-pddl")

    good = [put("pick_and_place_simple-A-None-B-1", "trial_T1", "pick_and_place_simple", 0),
            put("pick_heat_then_place_in_recep-A-None-B-2", "trial_T2", "pick_heat_then_place_in_recep", 0),
            put("look_at_obj_in_light-A-None-C-3", "trial_T3", "look_at_obj_in_light", 0)]
    put("pick_and_place_with_movable_recep-A-Mug-B-4", "trial_T4", "pick_and_place_simple", 1)
    put("pick_and_place_simple-AppleSliced-None-B-5", "trial_T5", "pick_and_place_simple", 1)
    put("pick_two_obj_and_place-A-None-B-6", "trial_T6", "pick_two_obj_and_place", 0,
        edit=lambda d: d.pop("solvable"))
    put("pick_two_obj_and_place-A-None-B-7", "trial_T7", "pick_two_obj_and_place", 0,
        edit=lambda d: d.update(solvable=False))
    put("pick_and_place_simple-A-None-B-8", "trial_T8", "pick_and_place_simple", 1,
        traj_task_type="pick_and_place_with_movable_recep")
    (split / "pick_and_place_simple-A-None-B-9" / "trial_T9").mkdir(parents=True)  # no files at all
    return str(root), sorted(good)


# ------------------------------------------------------------------ conformance
@pytest.mark.parametrize("env_id", ALF_IDS)
def test_conformance_kit_passes_on_every_alfworld_id(env_id, official_tree):
    kwargs = ({"data_path": official_tree[0]} if "Official" in env_id
              else {} if "House" in env_id else {"num_games": NUM_GAMES})  # House: one household per world
    check_text_env(env_id, seeds=(0, 1), n_steps=3, make_kwargs=kwargs)


def test_official_id_without_data_fails_at_make_with_instructions(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(OfficialDataNotFound, match=r"alfworld-download.*ALFWORLD_DATA"):
        gym.make("crl/ALFWorld-Official-v0")


# ------------------------------------------------------------------ official loader
def test_official_loader_applies_alfworlds_rules_in_sorted_order(official_tree):
    root, good = official_tree
    assert list(official_games("valid_unseen", root)) == good
    look = [g for g in good if "look_at_obj_in_light" in g]
    assert official_games("valid_unseen", root, ("look_at_obj_in_light",)) == tuple(look)
    with pytest.raises(OfficialDataNotFound):
        official_games("train", root)


def test_official_env_seed_i_plays_game_i_and_the_oracle_wins_it(official_tree):
    root, good = official_tree
    env = gym.make("crl/ALFWorld-Official-v0", data_path=root)
    for seed in range(len(good)):
        _, info = env.reset(seed=seed)
        assert info["game_file"] == good[seed]
        assert _play_oracle(env)[0]
    env.close()


def test_reset_can_play_a_given_game_file(official_tree):
    _, good = official_tree
    env = gym.make("crl/ALFWorld-v0", num_games=NUM_GAMES)
    _, info = env.reset(seed=0, options={"game_file": good[1]})
    assert info["game_file"] == good[1] and _play_oracle(env)[0]
    with pytest.raises(FileNotFoundError, match="game_file"):
        env.reset(options={"game_file": good[1] + ".missing"})
    env.close()


# ------------------------------------------------------------------ generator
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_generated_games_of_every_task_type_are_won_by_the_oracle(task_type):
    env = gym.make(f"crl/ALFWorld-{VARIANT[task_type]}-v0", num_games=NUM_GAMES)
    for seed in (0, 1):
        _, info = env.reset(seed=seed)
        assert info["task_type"] == task_type
        won, reward, steps = _play_oracle(env)
        assert won and reward == 1.0 and steps == len(env.unwrapped._stored_plan()) <= 12
    env.close()


@pytest.mark.slow
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_oracle_wins_twenty_generated_games_per_task_type(task_type):
    env = gym.make(f"crl/ALFWorld-{VARIANT[task_type]}-v0")
    results = []
    for seed in range(20):
        env.reset(seed=seed)
        results.append(_play_oracle(env)[0])
    env.close()
    assert sum(results) >= 19, results


def test_scenes_are_real_floor_plans_with_distractors_closed_receptacles_and_alfworld_ids():
    spec, problem = build_problem("pick_clean_then_place_in_recep", 3)
    assert spec.floor_plan in range(1, 31) or spec.floor_plan in range(401, 431)  # kitchens and bathrooms clean
    assert problem.count(" - object") >= 15  # distractors, not just the target
    assert "(openable " in problem and "(opened " not in problem  # closed drawers/cabinets/fridges
    assert "Sink_bar_" in problem and "_bar_SinkBasin - receptacle" in problem
    assert mangle("Sink|-01.90|+00.97|-01.50|SinkBasin") == "Sink_bar__minus_01_dot_90_bar__plus_00_dot_97_bar__minus_01_dot_50_bar_SinkBasin"
    env = gym.make("crl/ALFWorld-PickClean-v0", num_games=NUM_GAMES)
    _, info = env.reset(seed=0)
    assert any(a.startswith("go to sinkbasin ") for a in info["admissible_actions"])
    env.close()


def test_generated_game_file_has_alfworlds_keys_and_a_verified_walkthrough():
    path = games_mod.get_game("pick_cool_then_place_in_recep", 0)
    data = games_mod.read_game(path)
    assert data["solvable"] is True and data["walkthrough"]
    assert "Your task is to: " + data["crl"]["goal_text"] in data["grammar"]
    traj = json.loads(open(os.path.join(os.path.dirname(path), "traj_data.json")).read())
    assert traj["task_type"] == "pick_cool_then_place_in_recep"
    assert any(c.startswith("cool ") for c in data["walkthrough"])


def test_corrupt_cached_game_is_regenerated_with_a_warning():
    path = games_mod.get_game("pick_and_place_simple", 1)
    original = open(path).read()
    with open(path, "w") as f:
        f.write('{"pddl_domain": "trunc')
    with pytest.warns(UserWarning, match="regenerating"):
        assert games_mod.get_game("pick_and_place_simple", 1) == path
    assert open(path).read() == original


# ------------------------------------------------------------------ env behaviour
def test_same_seed_gives_the_same_game_and_transcript():
    def transcript(env, seed):
        obs, info = env.reset(seed=seed)
        out = [obs, info["task"], info["game_file"]]
        for _ in range(6):
            action = info["admissible_actions"][len(out) % len(info["admissible_actions"])]
            obs, _, term, _, info = env.step(action)
            out.append((action, obs))
            if term:
                break
        return out

    a, b = gym.make("crl/ALFWorld-v0", num_games=NUM_GAMES), gym.make("crl/ALFWorld-v0", num_games=NUM_GAMES)
    first = transcript(a, 0)
    assert transcript(a, 1) != first
    assert transcript(a, 0) == first == transcript(b, 0)
    a.close()
    b.close()


def test_old_put_spelling_is_an_alias_of_move():
    env = gym.make("crl/ALFWorld-PickPlace-v0", num_games=NUM_GAMES)
    env.reset(seed=0)
    plan = env.unwrapped._stored_plan()
    assert plan[-1].startswith("move ")
    for command in plan[:-1]:
        env.step(command)
    obj, recep = plan[-1][len("move "):].split(" to ")
    obs, reward, term, _, info = env.step(f"Put {obj} in/on {recep}.")
    assert info["valid_action"] and term and reward == 1.0 and info["success"]
    env.close()


def test_unknown_text_is_an_invalid_move_with_the_engines_feedback():
    env = gym.make("crl/ALFWorld-PickHeat-v0", num_games=NUM_GAMES)
    _, info = env.reset(seed=0)
    before = info["admissible_actions"]
    for action in ["fly to the moon", "take everything", "go to", "put", "🚀"]:
        obs, reward, term, trunc, info = env.step(action)
        assert not info["valid_action"] and reward == 0 and not term
        assert "Nothing happens." in obs and info["admissible_actions"] == before
    env.close()


def test_oracle_replans_after_the_agent_wanders_off_the_plan():
    env = gym.make("crl/ALFWorld-PickTwo-v0", num_games=NUM_GAMES)
    _, info = env.reset(seed=1)
    plan = list(env.unwrapped._stored_plan())
    # take the first object, then carry it somewhere else and drop it there
    for command in plan[:plan.index(next(c for c in plan if c.startswith("take "))) + 1]:
        _, _, _, _, info = env.step(command)
    detour = [a for a in info["admissible_actions"] if a.startswith("go to ") and a not in plan][0]
    env.step(detour)
    won, reward, _ = _play_oracle(env)
    assert won and reward == 1.0
    env.close()


def test_progress_counts_goal_subconditions_and_reaches_one_on_success():
    env = gym.make("crl/ALFWorld-PickClean-v0", num_games=NUM_GAMES)
    env.reset(seed=0)
    seen = []
    for command in env.unwrapped._stored_plan():
        _, _, term, _, info = env.step(command)
        seen.append(info["progress"])
    assert seen == sorted(seen) and seen[-1] == 1.0 and term
    assert 1 / 3 in seen and 2 / 3 in seen  # picked up, then cleaned
    env.close()


def test_memoised_engine_plays_exactly_like_plain_textworld():
    from crl_envs.alfworld import engine

    path = games_mod.get_game("pick_and_place_simple", 1)  # a living room: plain TextWorld is slow on kitchens
    plan = games_mod.read_game(path)["walkthrough"]
    commands = ["look", "inventory", "nonsense"] + plan

    def play(fast: bool):
        env = engine.make_textworld_env(path)
        run = (lambda f: f()) if not fast else (lambda f: _with_fast(engine, f))
        out = [run(env.reset)]
        out += [run(lambda c=c: env.step(c)) for c in commands]
        engine.close_textworld_env(env)
        return out

    assert play(False) == play(True)


def _with_fast(engine, fn):
    with engine.fast_path():
        return fn()


def _play_oracle(env):
    reward, info, steps = 0.0, {"success": False}, 0
    while steps < env.spec.max_episode_steps:
        _, reward, term, trunc, info = env.step(env.unwrapped.oracle_action())
        steps += 1
        if term or trunc:
            break
    return info["success"], reward, steps
