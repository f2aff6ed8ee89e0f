"""The Objects part of MiniHack observations: exact offsets, order, cap, no leaks from the dark.

Expected objects are computed here independently of ``crl_envs.minihack.objects``: from
NLE's glyph predicates and NetHack 3.6's own map-symbol numbering (rm.h), the agent's
position in ``blstats`` and ``screen_descriptions``; the observation is parsed as an agent
would read it.
"""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("nle", reason="MiniHack needs nle (pip install -e '.[minihack]')")
pytest.importorskip("minihack", reason="MiniHack needs minihack (pip install -e '.[minihack]')")

from nle import nethack  # noqa: E402

import crl_envs  # noqa: E402,F401
from crl_envs.minihack.objects import MAX_OBJECTS, ObjectFinder, offset_words  # noqa: E402
from crl_envs.minihack.render import Renderer  # noqa: E402

# rm.h (NetHack 3.6): S_stone, the eleven walls S_vwall..S_trwall, S_room, S_darkroom, S_corr, S_litcorr.
TERRAIN_CMAP = frozenset(range(0, 12)) | {19, 20, 21, 22}
MOVES = ("north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest")
ENTRY = re.compile(r"^(?P<desc>.*) \((?P<sym>.)\): (?P<off>.+?)(?P<adj> \(adjacent\))?$")
SIGN = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1)}
STEP_OF = {(-1, 0): "north", (1, 0): "south", (0, -1): "west", (0, 1): "east",
           (-1, 1): "northeast", (1, 1): "southeast", (1, -1): "southwest", (-1, -1): "northwest"}


def _cells(obs: dict) -> tuple[tuple[int, int], list[tuple[str, str, int, int]]]:
    """The agent's cell and every non-terrain cell as (description, symbol, rows south, cols east)."""
    x, y = int(obs["blstats"][0]), int(obs["blstats"][1])
    out = []
    for (r, c), g in np.ndenumerate(obs["glyphs"]):
        g = int(g)
        if (r, c) == (y, x) or g == nethack.NO_GLYPH:
            continue
        if nethack.glyph_is_cmap(g) and nethack.glyph_to_cmap(g) in TERRAIN_CMAP:
            continue
        desc = bytes(obs["screen_descriptions"][r, c]).split(b"\x00", 1)[0].decode("latin-1").strip()
        out.append((desc, chr(int(obs["chars"][r, c])), r - y, c - x))
    return (y, x), out


def expected_objects(obs: dict) -> tuple[list[tuple[str, str, int, int]], int]:
    """What the Objects part must list (nearest first, capped) and how many are left over."""
    _, cells = _cells(obs)
    cells.sort(key=lambda e: (max(abs(e[2]), abs(e[3])), abs(e[2]) + abs(e[3]), e[2], e[3]))
    return cells[:MAX_OBJECTS], max(0, len(cells) - MAX_OBJECTS)


def parse_offset(text: str) -> tuple[int, int]:
    rows = cols = 0
    for part in text.split(", "):
        n, word = part.split(" ")
        dr, dc = SIGN[word]
        rows, cols = rows + int(n) * dr, cols + int(n) * dc
    return rows, cols


def parse_objects(obs_text: str) -> tuple[list[tuple[str, str, int, int]], int]:
    """The Objects line as (description, symbol, rows south, cols east) entries and the leftover count."""
    (line,) = [ln for ln in obs_text.splitlines() if ln.startswith("Objects: ")]
    body = line[len("Objects: "):]
    if body == "none in sight":
        return [], 0
    entries, more = [], 0
    for part in body.split("; "):
        m = re.fullmatch(r"and (\d+) more farther away", part)
        if m:
            more = int(m.group(1))
            continue
        e = ENTRY.match(part)
        assert e, part
        rows, cols = parse_offset(e.group("off"))
        assert bool(e.group("adj")) == (max(abs(rows), abs(cols)) == 1), part
        entries.append((e.group("desc"), e.group("sym"), rows, cols))
    return entries, more


def map_of(obs_text: str) -> tuple[list[str], int, int]:
    """The map rows and the agent's (row, column) in them, as the observation states them."""
    lines = obs_text.splitlines()
    start = lines.index("Map:") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("Agent the "))
    m = re.search(r"You \(@\) are at row (\d+), column (\d+) of the map", obs_text)
    return lines[start:end], int(m.group(1)), int(m.group(2))


def _walk(env: gym.Env, seed: int, steps: int, random_moves: bool = True):
    """One seeded episode's observations, each with the Objects computed here from NLE's arrays.

    Oracle and seeded-random moves alternate (only oracle moves without ``random_moves``).
    """
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    yield obs, expected_objects(env.unwrapped._obs)
    for t in range(steps):
        action = env.unwrapped.oracle_action() if t % 2 or not random_moves else MOVES[int(rng.integers(8))]
        obs, reward, term, trunc, info = env.step(action)
        if term or trunc:
            assert random_moves or info["success"], obs
            return
        yield obs, expected_objects(env.unwrapped._obs)


# ------------------------------------------------------------------ offsets are exact
OFFSET_IDS = ["crl/MiniHack-Room-Random-15x15-v0", "crl/MiniHack-MazeWalk-9x9-v0", "crl/MiniHack-KeyRoom-S5-v0"]


def _check_offsets(env_id: str, seeds) -> int:
    env = gym.make(env_id)
    checked = 0
    for seed in seeds:
        for text, expected in _walk(env, seed, 12):
            got = parse_objects(text)
            assert got == expected, f"{env_id} seed {seed}:\n{text}"
            rows, r, c = map_of(text)
            for desc, sym, dr, dc in got[0]:  # the text agrees with itself: the symbol is on the map there
                assert rows[r + dr][c + dc] == sym, (desc, sym, dr, dc)
            checked += 1
    env.close()
    return checked


@pytest.mark.parametrize("env_id", OFFSET_IDS)
def test_objects_offsets_match_the_glyph_array_and_blstats(env_id):
    assert _check_offsets(env_id, range(5)) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("env_id", OFFSET_IDS)
def test_objects_offsets_match_on_fifty_seeds(env_id):
    assert _check_offsets(env_id, range(50)) >= 50


def test_keyroom_lists_the_key_the_door_and_the_staircase_once_seen():
    env = gym.make("crl/MiniHack-KeyRoom-S5-v0")
    seen = set()
    for seed in range(3):
        for text, _ in _walk(env, seed, 60):
            seen |= {desc.split(" named ")[0] for desc, *_ in parse_objects(text)[0]}
    assert {"a key", "closed door", "staircase down"} <= seen, seen


# --------------------------------------------------------- reading only the Objects line
def _follow_the_staircase(env: gym.Env, seed: int) -> bool:
    """Play one episode reading nothing but the staircase's offset in the Objects line."""
    obs, info = env.reset(seed=seed)
    while True:
        stairs = [e for e in parse_objects(obs)[0] if e[0] == "staircase down"]
        assert len(stairs) == 1, obs
        _, _, dr, dc = stairs[0]
        obs, reward, term, trunc, info = env.step(STEP_OF[(int(np.sign(dr)), int(np.sign(dc)))])
        if term or trunc:
            return bool(info["success"] and reward == 1.0)


@pytest.mark.parametrize(("env_id", "n"), [("crl/MiniHack-Room-Random-5x5-Short-v0", 20),
                                           ("crl/MiniHack-Room-Random-15x15-v0", 8)])
def test_an_agent_reading_only_the_objects_line_wins_every_room_random_seed(env_id, n):
    env = gym.make(env_id)
    assert all(_follow_the_staircase(env, s) for s in range(n))


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["crl/MiniHack-Room-Random-5x5-v0", "crl/MiniHack-Room-Random-15x15-v0",
                                    "crl/MiniHack-Room-Random-5x5-Short-v0"])
def test_following_the_objects_line_wins_fifty_room_random_seeds(env_id):
    env = gym.make(env_id)
    assert all(_follow_the_staircase(env, s) for s in range(50))


# ----------------------------------------------------------------- dark rooms do not leak
@pytest.mark.parametrize(("env_id", "n"), [("crl/MiniHack-Room-Dark-15x15-v0", 6), ("crl/MiniHack-KeyRoom-Dark-S5-v0", 3)])
def test_dark_rooms_list_only_what_nethack_has_shown(env_id, n):
    env = gym.make(env_id)
    hidden_then_found = 0
    for seed in range(n):
        walk = list(_walk(env, seed, env.spec.max_episode_steps, random_moves=False))
        texts = [text for text, _ in walk]
        for text, expected in walk:
            rows, r, c = map_of(text)
            entries, _ = parse_objects(text)
            assert (entries, _) == expected
            for desc, sym, dr, dc in entries:  # every listed thing is drawn on the map where it is said to be
                assert rows[r + dr][c + dc] == sym, (desc, sym, dr, dc, text)
            listed_stairs = any(e[0] == "staircase down" for e in entries)
            assert listed_stairs == any(">" in row for row in rows), text
        first = parse_objects(texts[0])[0]
        if not any(e[0] == "staircase down" for e in first):
            hidden_then_found += any(any(e[0] == "staircase down" for e in parse_objects(t)[0]) for t in texts)
    assert hidden_then_found >= 1  # the staircase existed all along, unlisted until NetHack showed it


# ----------------------------------------------------------------- format, order and cap
def test_offset_words_name_rows_then_columns_and_mark_adjacent_cells():
    assert offset_words(3, 2) == "3 south, 2 east"
    assert offset_words(-1, 0) == "1 north (adjacent)"
    assert offset_words(-1, -1) == "1 north, 1 west (adjacent)"
    assert offset_words(0, -5) == "5 west"
    assert offset_words(2, 1) == "2 south, 1 east"


def _synthetic(cells: dict[tuple[int, int], tuple[int, str, str]], me: tuple[int, int]) -> dict:
    """A map of lit floor with ``cells[(r, c)] = (glyph, symbol, description)`` and the agent at ``me``."""
    floor = nethack.GLYPH_CMAP_OFF + 19
    glyphs = np.full((21, 79), floor, np.int16)
    chars = np.full((21, 79), ord("."), np.uint8)
    sd = np.zeros((21, 79, 80), np.uint8)
    sd[:, :, :15] = np.frombuffer(b"floor of a room", np.uint8)
    agent = (nethack.GLYPH_MON_OFF, "@", "human rogue called Agent")  # a monster glyph; its kind does not matter
    for (r, c), (g, sym, desc) in {**cells, me: agent}.items():
        glyphs[r, c], chars[r, c] = g, ord(sym)
        sd[r, c] = 0
        sd[r, c, :len(desc)] = np.frombuffer(desc.encode(), np.uint8)
    blstats = np.zeros(27, np.int64)
    blstats[0], blstats[1], blstats[10], blstats[11] = me[1], me[0], 10, 12
    tty = np.full((24, 80), ord(" "), np.uint8)
    return {"glyphs": glyphs, "chars": chars, "screen_descriptions": sd, "blstats": blstats, "tty_chars": tty,
            "inv_strs": np.zeros((55, 80), np.uint8), "inv_letters": np.zeros(55, np.uint8)}


def test_more_than_the_cap_lists_the_nearest_and_counts_the_rest():
    boulder = nethack.GLYPH_OBJ_OFF + 1  # any object glyph will do
    me = (10, 40)
    cells = {(10, 40 + k): (boulder, "0", "boulder") for k in range(1, 21)}  # 1..20 east
    cells[(5, 40)] = (nethack.GLYPH_CMAP_OFF + 24, ">", "staircase down")  # 5 north: as near as 5 east
    obs = _synthetic(cells, me)
    finder = ObjectFinder()
    listed = finder.cells(obs["glyphs"], *me)
    text = finder.describe(obs, obs["chars"].tobytes(), listed, *me)
    parts = text.split("; ")
    assert len(parts) == MAX_OBJECTS + 1 and parts[-1] == f"and {21 - MAX_OBJECTS} more farther away"
    assert parts[0] == "boulder (0): 1 east (adjacent)" and parts[3] == "boulder (0): 4 east"
    assert parts[4:6] == ["staircase down (>): 5 north", "boulder (0): 5 east"]  # a tie goes in reading order
    assert parts[MAX_OBJECTS - 1] == f"boulder (0): {MAX_OBJECTS - 1} east"
    with pytest.raises(ValueError, match="max_objects"):
        ObjectFinder(0)


def test_the_legend_leaves_out_what_the_objects_part_describes():
    me = (3, 3)
    open_door = nethack.GLYPH_CMAP_OFF + 13  # S_vodoor: "-", like a wall
    wall = nethack.GLYPH_CMAP_OFF + 2
    cells = {(1, c): (wall, "-", "wall") for c in range(1, 8)}
    cells[(1, 4)] = (open_door, "-", "open door")
    cells[(5, 5)] = (nethack.GLYPH_CMAP_OFF + 24, ">", "staircase down")
    obs = _synthetic(cells, me)
    text = Renderer("Reach it.", show_inventory=False).render(obs, "", "", ["north"])
    assert "Objects: open door (-): 2 north, 1 east; staircase down (>): 2 south, 2 east" in text
    assert "Legend: - wall; . floor of a room; @ human rogue called Agent" in text
    plain = Renderer("Reach it.", show_inventory=False, show_objects=False).render(obs, "", "", ["north"])
    assert "Objects:" not in plain and "Legend: - wall; . floor of a room; > staircase down; @ human" in plain


# ------------------------------------------------------- contract and hostile input, every id
MINIHACK_IDS = sorted(i for i in gym.registry if i.startswith("crl/MiniHack-"))


def test_conformance_kit_without_the_objects_part():
    from crl_envs.testing import check_text_env

    check_text_env("crl/MiniHack-Room-Random-5x5-Short-v0", seeds=(0, 1), n_steps=8, make_kwargs={"objects": False})


def _hostile_battery(env_id: str) -> None:
    from tests.test_hostile_actions import COMMON, MINIHACK_KEYS, _battery, _make, _twin_agrees_and_oracle_finishes

    seed = _a_seed_the_oracle_wins(env_id)
    env, twin = _make(env_id), _make(env_id)
    env.reset(seed=seed), twin.reset(seed=seed)
    _battery(env, [*COMMON.values(), *MINIHACK_KEYS, "i", "S", "Q", "y", "S\nyes"])
    _twin_agrees_and_oracle_finishes(env, twin, max_steps=2000)
    env.close(), twin.close()


def _a_seed_the_oracle_wins(env_id: str) -> int:
    """Monsters can kill the planner: the battery needs an episode the oracle finishes."""
    env = gym.make(env_id, max_episode_steps=10_000)
    for seed in range(10):
        env.reset(seed=seed)
        for _ in range(2000):
            *_, term, trunc, info = env.step(env.unwrapped.oracle_action())
            if term or trunc:
                break
        if info["success"]:
            env.close()
            return seed
    raise AssertionError(f"the oracle lost seeds 0-9 of {env_id}")


def test_the_hostile_battery_passes_on_the_learning_ready_id():
    _hostile_battery("crl/MiniHack-Room-Random-5x5-Short-v0")


@pytest.mark.slow
@pytest.mark.parametrize("env_id", MINIHACK_IDS)
def test_the_hostile_battery_passes_on_every_minihack_id(env_id):
    _hostile_battery(env_id)
