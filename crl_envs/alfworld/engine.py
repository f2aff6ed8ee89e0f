"""The TextWorld side: playing a ``game.tw-pddl`` through ``textworld.gym``.

Games run in ``textworld.gym``'s ``TextworldGymEnv`` with alfworld's ``AlfredDemangler`` (object
names such as ``sinkbasin 1``) and ``AlfredInfos`` (the game file in ``extra.gamefile``), as
alfworld's own ``AlfredTWEnv`` sets them up.

What this module adds is speed. TextWorld re-translates the PDDL problem to SAS (Fast Downward's
translator, pure Python: the bulk of a reset's ~2 s) twice per ``PddlState`` and builds two
states per reset. :func:`fast_path` memoises that translation per (domain, problem),
so each game is translated once per process. It is a context manager: the patch is active
only while our env calls into TextWorld, so plain ``textworld.gym`` users in the same process
(the benchmark's baseline) are untouched.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

_LOCK = threading.RLock()
_TRANSLATIONS: OrderedDict[tuple[str, str, bool], tuple[Any, str]] = OrderedDict()
_TRANSLATIONS_SIZE = 32
_PARSES: dict[tuple[str, str], Any] = {}
_QUERIES: dict[str, Any] = {}
_LOGICS: OrderedDict[str, Any] = OrderedDict()
_ACTIVE = threading.local()


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


@contextlib.contextmanager
def fast_path() -> Iterator[None]:
    """Memoise TextWorld's pure, repeated work while the block runs (reentrant).

    * ``fast_downward.pddl2sas``: PDDL -> SAS translation, per (domain, problem, optimize);
    * the TWL2 grammar parse of a game (``GameLogic``'s action/grammar document), per text;
    * the parse of each text-generation template and conjunctive query, per string (the
      template parse returns a deep copy, because derivation writes contexts into symbols).

    Every memoised function is deterministic in its arguments and its results are only read,
    so transcripts are identical with and without it (a test checks this).
    """
    if getattr(_ACTIVE, "on", False):
        yield
        return
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    from textworld.logic import Rule

    with _LOCK:
        saved = (fast_downward.pddl2sas, pddl_logic._parse_and_convert, textgen._parse_and_convert,
                 Rule.__dict__["parse_conjunctive_query"])
        orig_sas, orig_logic, orig_textgen, orig_query = saved[0], saved[1], saved[2], Rule.parse_conjunctive_query

        def pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
            key = (_digest(domain), _digest(problem), bool(optimize))
            hit = _TRANSLATIONS.get(key)
            if hit is None:
                hit = _TRANSLATIONS[key] = orig_sas(domain, problem, verbose=verbose, optimize=optimize)
                while len(_TRANSLATIONS) > _TRANSLATIONS_SIZE:
                    _TRANSLATIONS.popitem(last=False)
            _TRANSLATIONS.move_to_end(key)
            return hit

        def logic_parse(text: str, rule_name: str = "", **kwargs):
            if kwargs or rule_name != "pddlStart":
                return orig_logic(text, rule_name=rule_name, **kwargs)
            key = _digest(text)
            hit = _LOGICS.get(key)
            if hit is None:
                hit = _LOGICS[key] = orig_logic(text, rule_name=rule_name)
                while len(_LOGICS) > _TRANSLATIONS_SIZE:
                    _LOGICS.popitem(last=False)
            return hit

        def textgen_parse(text: str, rule_name: str = "", trace: bool = False, **kwargs):
            if trace or kwargs:
                return orig_textgen(text, rule_name=rule_name, trace=trace, **kwargs)
            hit = _PARSES.get((text, rule_name))
            if hit is None:
                hit = _PARSES[(text, rule_name)] = orig_textgen(text, rule_name=rule_name)
            return copy.deepcopy(hit)

        def query(cls, expr: str):
            hit = _QUERIES.get(expr)
            if hit is None:
                hit = _QUERIES[expr] = orig_query(expr)
            return hit

        fast_downward.pddl2sas = pddl2sas
        pddl_logic._parse_and_convert = logic_parse
        textgen._parse_and_convert = textgen_parse
        Rule.parse_conjunctive_query = classmethod(query)
        _ACTIVE.on = True
        try:
            yield
        finally:
            _ACTIVE.on = False
            fast_downward.pddl2sas, pddl_logic._parse_and_convert, textgen._parse_and_convert = saved[:3]
            Rule.parse_conjunctive_query = saved[3]


def request_infos():
    """What alfworld's ``AlfredTWEnv`` asks TextWorld for (no per-step planner)."""
    import textworld

    return textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])


def make_textworld_env(game_file: str):
    """A ``textworld.gym`` env on one game with alfworld's wrappers (no step limit: Gymnasium's applies)."""
    import textworld.gym
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    env_id = textworld.gym.register_game(game_file, request_infos(), max_episode_steps=None,
                                         wrappers=[AlfredDemangler, AlfredInfos])
    env = textworld.gym.make(env_id)
    textworld.gym.registry.pop(env_id, None)  # one-off id; keep the global registry from growing
    return env


def pddl_env_of(tw_env) -> Any:
    """The ``textworld.envs.PddlEnv`` inside a ``textworld.gym`` env (after its first reset)."""
    from textworld.envs.pddl import PddlEnv

    node = tw_env.batch_env.envs[0]
    for _ in range(16):
        if isinstance(node, PddlEnv):
            return node
        node = getattr(node, "_wrapped_env", None)
        if node is None:
            break
    raise RuntimeError("no PddlEnv inside this textworld env; is the game a .tw-pddl file?")


def replan(tw_env) -> list[str]:
    """Fast Downward's plan from the current state, as commands (what ``policy_commands`` computes)."""
    pddl_env = pddl_env_of(tw_env)
    return list(pddl_env._pddl_state.replan(pddl_env._entity_infos))


def close_textworld_env(tw_env) -> None:
    """Close the env and free its Fast Downward state (TextWorld never does).

    The library copy stays mapped: ``dlclose`` on a second copy crashes the interpreter at exit.
    """
    try:
        lib = pddl_env_of(tw_env).downward_lib
    except Exception:  # noqa: BLE001 - never reset, or already closed
        lib = None
    tw_env.close()
    if lib is not None:
        lib.cleanup()


class Player:
    """One ``textworld.gym`` env, reused for game after game (one Fast Downward copy per player).

    Every call runs under :func:`fast_path`.
    """

    def __init__(self) -> None:
        self._tw = None
        self.game_file: str | None = None

    def load(self, game_file: str) -> tuple[str, dict[str, Any]]:
        """Start ``game_file`` from its initial state; return TextWorld's (obs, infos)."""
        with fast_path():
            if self._tw is None:
                self._tw = make_textworld_env(game_file)
            else:
                self._tw.gamefiles = [game_file]
                self._tw.seed(0)  # restarts textworld.gym's game cycle on the one file
            self.game_file = game_file
            return self._tw.reset()

    def step(self, command: str) -> tuple[str, float, bool, dict[str, Any]]:
        with fast_path():
            return self._tw.step(command)

    @property
    def pddl_env(self):
        """The ``PddlEnv`` playing the current game."""
        return pddl_env_of(self._tw)

    def replan(self) -> list[str]:
        """The planner's commands from the current state (~0.2-0.4 s; call on demand only)."""
        with fast_path():
            return replan(self._tw)

    def close(self) -> None:
        if self._tw is not None:
            close_textworld_env(self._tw)
            self._tw = None
