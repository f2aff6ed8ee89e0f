"""Persistent worlds: the seed encoding and the fact conventions of the experience track.

A *world* keeps a hidden fact fixed across episodes (which corridor goes through, where the
household keeps its things); an *episode* of that world varies what the agent starts from.
Plain ``reset(seed=s)`` plays episode ``s % EPISODES_PER_WORLD`` of world ``s // EPISODES_PER_WORLD``,
so pools, the harness and the conformance kit need nothing new; :func:`episode_seed` builds a seed.

Worlds ``0 .. HELD_OUT_FIRST_WORLD - 1`` are for training; worlds from ``HELD_OUT_FIRST_WORLD`` on are
held out for evaluation (the experience track's leaderboard plays worlds 1000, 1001, ...).

Every persistent-world env puts these keys in ``info`` (at reset and every step):

* ``world``: the world id (an ``int``); agents key their memory by ``(env id, world)``;
* ``facts``: the hidden facts this episode has revealed so far, as a JSON-able ``dict`` (privileged:
  the oracle's memory reads it; text agents read the same facts from the observation, where the env
  states each discovery in a sentence starting ``Note:``).

and its solver takes what an agent remembers: ``oracle_action(memory=None)``, where ``memory`` is a
``facts`` dict from earlier episodes of the same world (``None``: explore as if the world were new).
"""

from __future__ import annotations

EPISODES_PER_WORLD = 1000
HELD_OUT_FIRST_WORLD = 1000


def world_of(seed: int) -> int:
    """The world a reset seed plays."""
    return int(seed) // EPISODES_PER_WORLD


def episode_of(seed: int) -> int:
    """The episode (within its world) a reset seed plays."""
    return int(seed) % EPISODES_PER_WORLD


def episode_seed(world: int, episode: int) -> int:
    """The reset seed of ``episode`` in ``world``.

    Raises:
        ValueError: for a negative world or an episode outside ``0 .. EPISODES_PER_WORLD - 1``.
    """
    if world < 0 or not 0 <= episode < EPISODES_PER_WORLD:
        raise ValueError(f"world must be >= 0 and episode in 0..{EPISODES_PER_WORLD - 1}, got {world}, {episode}")
    return int(world) * EPISODES_PER_WORLD + int(episode)


def merge_facts(old: dict | None, new: dict | None) -> dict:
    """``old`` updated with ``new``: list values are unioned (order kept), others replaced."""
    out = dict(old or {})
    for k, v in (new or {}).items():
        if isinstance(v, list) and isinstance(out.get(k), list):
            out[k] = out[k] + [x for x in v if x not in out[k]]
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out
