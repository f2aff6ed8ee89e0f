"""Hostile actions against one env per family: every one is answered, none corrupts the episode.

Each family gets the same battery (empty, whitespace, 1 MB, NUL, lone surrogates, bidi and
zero-width unicode, ANSI escapes, newline-joined multi-actions, non-``str`` objects, format
strings) plus its own traps (WebShop brackets, ALFWorld paths, raw NetHack keys, moves after
the end). Each hostile step must return normally: an invalid move (reward 0, feedback,
state unchanged) wherever the family cannot apply it. Afterwards a twin env that never saw
the hostile steps must agree with the attacked one on the next valid action, and the family's
oracle must still finish the episode. A hang fails through pytest-timeout.
"""

from __future__ import annotations

import os

import gymnasium as gym
import pytest

import crl_envs  # noqa: F401 - registers crl/* ids
from crl_envs.core import MAX_OBS_CHARS

BIG = 10_000  # step limits raised so the battery itself never truncates an episode

COMMON = {
    "empty": "",
    "whitespace": " \t\n\r\x0b ",
    "1MB": "north " * ((1 << 20) // 6),
    "nul": "\x00",
    "nul-suffix": "north\x00",
    "lone-surrogate": "\ud800",
    "surrogate-in-word": "nor\udcffth",
    "rtl-zero-width": "\u202enorth\u200b",
    "ansi-escape": "\x1b[2J\x1b[31mnorth\x1b[0m",
    "newline-multi": "north\nsouth",
    "format-str": "{0.__class__.__mro__}",
    "printf": "%s%n%x%p",
    "none": None,
    "int": 3,
    "bytes": b"north",
    "list": ["north"],
}
NOT_TEXT = ("none", "int", "bytes", "list")


def _step_checked(env: gym.Env, action, *, expect_valid: bool | None = False):
    """Step with ``action`` and check the answer is well-formed (and invalid, unless told otherwise)."""
    before = env.unwrapped._last_obs
    out = env.step(action)
    assert isinstance(out, tuple) and len(out) == 5
    obs, reward, term, trunc, info = out
    assert isinstance(obs, str) and len(obs) <= MAX_OBS_CHARS
    obs.encode("utf-8")  # never echoes a lone surrogate back
    assert {"valid_action", "success", "progress", "task", "admissible_actions"} <= set(info)
    if expect_valid is False:
        assert not info["valid_action"], f"{action!r:.60} was accepted"
        assert reward == 0 and not term and not trunc
        assert obs.startswith("Invalid action") and obs.endswith(before), "an invalid move changed the state"
        assert "\x00" not in obs and "\x1b" not in obs  # the feedback quotes hostile text escaped
    elif expect_valid:
        assert info["valid_action"], obs[:300]
    return obs, reward, term, trunc, info


def _battery(env: gym.Env, actions, **kw) -> None:
    for action in actions:
        _step_checked(env, action, **kw)


def _twin_agrees_and_oracle_finishes(env: gym.Env, twin: gym.Env, max_steps: int = 200) -> dict:
    """The next oracle action gives the same result on ``env`` and on a twin that skipped the hostile steps."""
    action = env.unwrapped.oracle_action()
    twin.unwrapped.oracle_action()  # keep the twin's planner in step too
    got, want = env.step(action), twin.step(action)
    assert got[:4] == want[:4] and got[4]["admissible_actions"] == want[4]["admissible_actions"]
    return _oracle_finish(env, max_steps, got)


def _oracle_finish(env: gym.Env, max_steps: int, last=None) -> dict:
    obs, reward, term, trunc, info = last or (None, 0.0, False, False, {})
    for _ in range(max_steps):
        if term or trunc:
            break
        obs, reward, term, trunc, info = env.step(env.unwrapped.oracle_action())
    assert term and info["success"] and reward == 1.0, obs
    after = env.step("north")  # a step after the end is an invalid move that asks for reset()
    assert not after[4]["valid_action"] and "call reset()" in after[0] and after[1] == 0
    return info


def _make(env_id: str, **kw) -> gym.Env:
    return gym.make(env_id, max_episode_steps=BIG, **kw)


# ------------------------------------------------------------------------ Sokoban
def test_sokoban_answers_every_hostile_action_and_still_solves():
    env, twin = _make("crl/Sokoban-6x6-2-v0"), _make("crl/Sokoban-6x6-2-v0")
    env.reset(seed=4), twin.reset(seed=4)
    _battery(env, [*COMMON.values(), "up up", "upp", "UP!", "\u0430p", "search[up]", "#", "Q"])
    _twin_agrees_and_oracle_finishes(env, twin)
    for action in ("up", "", None, "\ud800"):  # moves after the episode ended
        obs, reward, term, trunc, info = env.step(action)
        assert not info["valid_action"] and reward == 0 and term and "call reset()" in obs  # still over
        assert info["admissible_actions"] is None and info["success"]
    assert env.reset(seed=4)[0] == twin.reset(seed=4)[0]


def test_a_text_env_stepped_before_reset_raises_reset_needed():
    from crl_envs.sokoban.env import SokobanEnv

    with pytest.raises(gym.error.ResetNeeded, match="call reset"):
        SokobanEnv().step("up")


# ----------------------------------------------------------------------- MiniHack
MINIHACK_KEYS = ["#", "?", ":", "*", ",", "^C", "\x03", "\x04", "\x1a", "\x1b", "\x10", "\r", "#pray", "#quit"]


def test_minihack_rejects_raw_nethack_keys_and_keeps_the_game():
    pytest.importorskip("minihack")
    env, twin = _make("crl/MiniHack-KeyRoom-S5-v0"), _make("crl/MiniHack-KeyRoom-S5-v0")
    env.reset(seed=0), twin.reset(seed=0)
    # letters are answers to questions only: S (save), Q (quit), i (inventory) never reach NetHack's command loop
    _battery(env, [*COMMON.values(), *MINIHACK_KEYS, "i", "S", "Q", "y", "S\nyes"])
    _twin_agrees_and_oracle_finishes(env, twin)


def test_minihack_raw_keys_inside_a_question_neither_save_nor_quit_the_game():
    pytest.importorskip("minihack")
    env = _make("crl/MiniHack-KeyRoom-S5-v0")
    env.reset(seed=0)
    for action in ("northwest", "pickup", "apply"):
        _step_checked(env, action, expect_valid=True)
    assert env.unwrapped._prompt.startswith("What do you want to use or apply?")
    _battery(env, [*COMMON.values(), *MINIHACK_KEYS])  # still invalid while NetHack asks
    for letter in ("S", "Q", "i", "y", "n"):  # item letters we do not have: NetHack says so and asks again
        obs, reward, term, trunc, info = _step_checked(env, letter, expect_valid=True)
        assert not term and not trunc and "What do you want to use or apply?" in obs
    _step_checked(env, "escape", expect_valid=True)
    assert env.unwrapped._prompt == ""
    _oracle_finish(env, 150)


def test_minihack_a_message_ending_in_a_question_mark_does_not_open_raw_keys():
    pytest.importorskip("minihack")
    import numpy as np

    env = _make("crl/MiniHack-Room-5x5-v0")
    env.reset(seed=0)
    u = env.unwrapped
    fake = np.zeros_like(u._obs["message"])
    text = b"You hear someone counting money. Who could it be?"
    fake[: len(text)] = np.frombuffer(text, dtype=np.uint8)
    u._obs = {**u._obs, "message": fake}  # a message that reads like a question, at the command loop
    u._continue()
    assert u._prompt == ""
    for key in ("S", "Q", "i"):  # save, quit, inventory would reach NetHack's command loop
        _step_checked(env, key)
    _oracle_finish(env, 100)


# ----------------------------------------------------------------------- ALFWorld
@pytest.fixture(scope="module")
def alfworld_cache(tmp_path_factory):
    pytest.importorskip("alfworld")
    old = os.environ.get("CRL_CACHE")
    os.environ["CRL_CACHE"] = str(tmp_path_factory.mktemp("crl_cache"))
    yield
    if old is None:
        os.environ.pop("CRL_CACHE", None)
    else:
        os.environ["CRL_CACHE"] = old


ALFWORLD_TRAPS = ["go to ../../etc", "go to /etc/passwd", "take ../../etc/shadow from countertop 1",
                  "examine ../../../", "go to", "put", "move to", "look; inventory", "look\ninventory",
                  "go to countertop 1 && rm -rf /", "open $(reboot)", "help me", "\\x00", "GO TO ../ETC"]


def test_alfworld_rejects_path_like_and_injected_commands_and_still_solves(alfworld_cache):
    env = _make("crl/ALFWorld-PickPlace-v0", num_games=2)
    twin = _make("crl/ALFWorld-PickPlace-v0", num_games=2)
    env.reset(seed=0), twin.reset(seed=0)
    _battery(env, [*COMMON.values(), *ALFWORLD_TRAPS])
    _twin_agrees_and_oracle_finishes(env, twin, max_steps=60)


# ------------------------------------------------------------------------ WebShop
WEBSHOP_TRAPS = ["search[", "search]", "click[]]", "click[]", "click[", "click[[Buy Now]]", "click[Buy Now",
                 "[]", "click[<script>alert(1)</script>]", "click[../../admin]", "click[Next >][Buy Now]",
                 "search[x] click[Buy Now]", "click [Buy Now]", "CLICK[nope]", "search[" + "a" * 600 + "]",
                 "search[ ]", "buy now", "click[\x00]", "click[\ud800]"]


def test_webshop_rejects_malformed_brackets_and_keeps_the_session():
    env, twin = _make("crl/WebShop-v0"), _make("crl/WebShop-v0")
    env.reset(seed=3), twin.reset(seed=3)
    on_search_page = [t for t in WEBSHOP_TRAPS if not t.startswith("search[x]")]  # that one is a real search
    _battery(env, [*COMMON.values(), *on_search_page])
    for _ in range(2):  # onto the results page, then an item page
        action = env.unwrapped.oracle_action()
        twin.unwrapped.oracle_action()
        assert env.step(action)[:4] == twin.step(action)[:4]
    _battery(env, [*COMMON.values(), *WEBSHOP_TRAPS, "search[earbuds]"])  # no search bar here
    _twin_agrees_and_oracle_finishes(env, twin, max_steps=20)


def test_webshop_search_with_nested_brackets_searches_their_text():
    env = _make("crl/WebShop-v0")
    env.reset(seed=3)
    obs, *_ = _step_checked(env, "search[wireless [earbuds]]", expect_valid=True)
    assert "Total results" in obs


# ---------------------------------------------------------------------------- SWE
SWE_INVALID = ("empty", "whitespace", "1MB", "nul", "nul-suffix", "lone-surrogate", "surrogate-in-word", *NOT_TEXT)


def test_swe_rejects_untypeable_commands_and_runs_the_rest_harmlessly():
    from tests.swe_support import skip_module_without_bwrap

    skip_module_without_bwrap()
    env = _make("crl/SWE-Mini-v0", max_steps=BIG)
    env.reset(seed=0)
    for name, action in COMMON.items():
        if name in SWE_INVALID:
            _step_checked(env, action)
        else:  # any other text is a shell command: it runs in the sandbox and the episode goes on
            obs, reward, term, trunc, info = _step_checked(env, action, expect_valid=None)
            assert info["valid_action"] and not term and not trunc and "[exit code" in obs
    obs, *_ = _step_checked(env, "git status --short && echo CLEAN", expect_valid=True)
    assert "CLEAN" in obs and "\n M " not in obs
    _oracle_finish(env, 10)
