"""Public conformance kit for crl-bench text environments.

Third parties run it on their own envs::

    from crl_envs.testing import check_text_env
    check_text_env("myorg/MyEnv-v0")          # an id registered with Gymnasium
    check_text_env(lambda: MyEnv())           # or a factory (needed for the multi-env checks)

It raises :class:`ConformanceError` naming the first broken rule, and returns a
:class:`ConformanceReport` listing the checks that ran.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from crl_envs.core import is_unicode

REQUIRED_RESET_KEYS = ("task", "admissible_actions")
REQUIRED_STEP_KEYS = ("task", "admissible_actions", "valid_action", "success", "progress")
HOSTILE_INVALID = ("", "   ", "\n\t\n", "a" * 1_000_000)
HOSTILE_ANY = (
    "\ud800 north",  # a lone surrogate: valid or not, the observation must stay valid Unicode
    "xq!! zz[[[",
    "北京 🚀 \u202e\x00 émoji",
    "click[" * 50,
    "search[",
    "]]]",
    "' OR 1=1; --",
    "\x1b[2J\x07",
)


# Free text an agent may send or read: spaces, punctuation, non-ASCII.
FREE_TEXT = "go to desk 1, then put the café mug in/on drawer 2!"
SPACE_HINT = "use crl_envs.UnicodeText(max_length) (gymnasium's Text(n) accepts only letters and digits by default)"


class ConformanceError(AssertionError):
    """An env broke the crl-bench text-env contract."""


@dataclass
class ConformanceReport:
    """What :func:`check_text_env` checked."""

    env_id: str | None
    checks: list[str] = field(default_factory=list)


def _fail(name: str, msg: str) -> None:
    raise ConformanceError(f"[{name}] {msg}")


def _factory(env_or_id: Any, make_kwargs: dict[str, Any]) -> tuple[Callable[[], gym.Env] | None, gym.Env, str | None]:
    if isinstance(env_or_id, str):
        from crl_envs.registry import check_env_id

        check_env_id(env_or_id)
        fac = lambda: gym.make(env_or_id, **make_kwargs)  # noqa: E731
        return fac, fac(), env_or_id
    if isinstance(env_or_id, gym.Env):
        spec = env_or_id.spec
        fac = (lambda: gym.make(spec, **make_kwargs)) if spec is not None else None
        return fac, env_or_id, spec.id if spec is not None else None
    if callable(env_or_id):
        env = env_or_id()
        spec = env.spec
        return env_or_id, env, spec.id if spec is not None else None
    raise TypeError(f"check_text_env takes an env, an env id or a factory, not {type(env_or_id).__name__}")


def _check_reset(env: gym.Env, seed: int | None) -> tuple[str, dict]:
    out = env.reset(seed=seed)
    if not (isinstance(out, tuple) and len(out) == 2):
        _fail("reset", f"reset() must return (obs, info), got {type(out).__name__}")
    obs, info = out
    if not isinstance(obs, str):
        _fail("reset", f"observation must be str, got {type(obs).__name__}")
    if not env.observation_space.contains(obs):
        _fail("reset", f"observation {obs[:60]!r} (len {len(obs)}) is not in the observation space "
              f"{env.observation_space}: {SPACE_HINT}")
    if not isinstance(info, dict):
        _fail("reset", "info must be a dict")
    for k in REQUIRED_RESET_KEYS:
        if k not in info:
            _fail("reset", f"info lacks the key {k!r}")
    if not isinstance(info["task"], str) or not info["task"]:
        _fail("reset", "info['task'] must be the non-empty goal text")
    _check_admissible(info, "reset")
    return obs, info


def _check_admissible(info: dict, where: str) -> None:
    adm = info["admissible_actions"]
    if adm is not None and not (isinstance(adm, list) and all(isinstance(a, str) for a in adm)):
        _fail(where, "info['admissible_actions'] must be a list[str] or None")


def _short(action: object) -> str:
    text = repr(action[:40] if isinstance(action, str) else action)
    return text + ("..." if isinstance(action, str) and len(action) > 40 else "")


def _check_step(env: gym.Env, action: object) -> tuple:
    try:
        out = env.step(action)
    except Exception as e:  # noqa: BLE001 - the contract says step never raises
        _fail("step", f"step({_short(action)}) raised {type(e).__name__}: {e}")
    if not (isinstance(out, tuple) and len(out) == 5):
        _fail("step", "step() must return (obs, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, info = out
    if not isinstance(obs, str):
        _fail("step", f"observation must be str, got {type(obs).__name__}")
    if not is_unicode(obs):
        _fail("step", f"after action {_short(action)}: the observation is not valid Unicode (a lone surrogate?); "
              "agents, tokenizers and JSON logs cannot take it")
    if not env.observation_space.contains(obs):
        _fail("step", f"after action {_short(action)}: observation {obs[:60]!r} (len {len(obs)}) is not in the "
              f"observation space {env.observation_space}: {SPACE_HINT}")
    if not isinstance(reward, (int, float, np.floating)) or isinstance(reward, bool):
        _fail("step", f"reward must be a number, got {type(reward).__name__}")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        _fail("step", "terminated and truncated must be bool")
    for k in REQUIRED_STEP_KEYS:
        if k not in info:
            _fail("step", f"info lacks the key {k!r}")
    if not isinstance(info["valid_action"], bool) or not isinstance(info["success"], bool):
        _fail("step", "info['valid_action'] and info['success'] must be bool")
    p = info["progress"]
    if not isinstance(p, (int, float, np.integer, np.floating)) or not 0.0 <= float(p) <= 1.0:
        _fail("step", f"info['progress'] must be a number in [0, 1], got {p!r} ({type(p).__name__})")
    _check_admissible(info, "step")
    return out


def _policy_actions(info: dict, rng: np.random.Generator, env: gym.Env) -> str:
    adm = info.get("admissible_actions")
    if adm:
        return adm[int(rng.integers(len(adm)))]
    return env.action_space.sample() if rng.random() < 0.5 else "look"


def _transcript(env: gym.Env, seed: int, n_steps: int) -> list:
    """Reset with ``seed`` and play a fixed-seed policy over admissible actions.

    The policy's seed does not depend on ``seed``, so differing transcripts mean differing instances.
    """
    rng = np.random.default_rng(12345)
    env.action_space.seed(12345)
    obs, info = _check_reset(env, seed)
    rows: list[Any] = [("reset", obs, info["task"], info["admissible_actions"])]
    for _ in range(n_steps):
        action = _policy_actions(info, rng, env)
        obs, reward, term, trunc, info = _check_step(env, action)
        rows.append((action, obs, float(reward), term, trunc, info["valid_action"], info["success"], float(info["progress"])))
        if term or trunc:
            break
    return rows


def _first_diff(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"step {i}: {str(x)[:300]!r} != {str(y)[:300]!r}"
    return f"lengths {len(a)} != {len(b)}"


def check_text_env(
    env_or_id: Any,
    *,
    seeds: tuple[int, ...] = (0, 1, 2),
    n_steps: int = 15,
    single_instance: bool = False,
    check_truncation: bool = True,
    run_gymnasium_checker: bool = True,
    make_kwargs: dict[str, Any] | None = None,
) -> ConformanceReport:
    """Check that an env follows the crl-bench text-env contract.

    Args:
        env_or_id: a registered id, an env instance, or a zero-argument factory.
            Ids and factories enable the checks that need fresh envs.
        seeds: seeds for the determinism and reuse checks.
        n_steps: steps per transcript (keep small for slow envs).
        single_instance: set for envs with a single task, skipping the
            "different seeds give different instances" check.
        check_truncation: play invalid moves until ``max_episode_steps`` and
            expect ``truncated``.
        run_gymnasium_checker: also run ``gymnasium.utils.env_checker.check_env``.
        make_kwargs: extra kwargs for ``gymnasium.make``.

    Returns:
        A report of the checks that ran.

    Raises:
        ConformanceError: naming the broken rule.
    """
    make_kwargs = dict(make_kwargs or {})
    factory, env, env_id = _factory(env_or_id, make_kwargs)
    report = ConformanceReport(env_id)
    try:
        # -- spaces
        for name in ("observation_space", "action_space"):
            space = getattr(env, name)
            if not space.contains(FREE_TEXT):
                _fail("spaces", f"{name} {space} must accept free text such as {FREE_TEXT!r}: {SPACE_HINT}")
        if "ansi" not in env.metadata.get("render_modes", []):
            _fail("spaces", "metadata['render_modes'] must include 'ansi'")
        report.checks.append("spaces")

        # -- determinism on one env, and reset clears all episode state
        base = [_transcript(env, s, n_steps) for s in seeds]
        again = _transcript(env, seeds[0], n_steps)
        if again != base[0]:
            _fail("reuse", f"replaying seed {seeds[0]} on a reused env differs: {_first_diff(base[0], again)}")
        report.checks.append("reset clears episode state")
        if factory is not None:
            for s, rows in zip(seeds, base, strict=True):
                fresh_env = factory()
                try:
                    fresh = _transcript(fresh_env, s, n_steps)
                finally:
                    fresh_env.close()
                if fresh != rows:
                    _fail("determinism", f"seed {s}: a fresh env differs from a reused one: {_first_diff(rows, fresh)}")
            report.checks.append("seeded determinism across fresh envs")
        if not single_instance and len(seeds) > 1:
            firsts = {repr(rows) for rows in base}
            if len(firsts) == 1:
                _fail("seeds", f"seeds {seeds} all give identical transcripts")
            report.checks.append("different seeds give different instances")

        # -- hostile actions
        env.reset(seed=seeds[0])
        for action in HOSTILE_INVALID:
            obs, reward, term, trunc, info = _check_step(env, action)
            if info["valid_action"] or reward != 0:
                _fail("invalid", f"action {_short(action)[:30]} (len {len(action)}) must be an invalid move with reward 0")
            if not obs.strip():
                _fail("invalid", "an invalid move must give feedback in the observation")
            if term or trunc:
                env.reset(seed=seeds[0])
        for action in HOSTILE_ANY:
            obs, reward, term, trunc, info = _check_step(env, action)
            if not info["valid_action"] and (reward != 0 or not obs.strip()):
                _fail("invalid", f"invalid move {action!r} must have reward 0 and feedback")
            if term or trunc:
                env.reset(seed=seeds[0])
        report.checks.append("hostile actions are invalid moves with feedback")

        # -- truncation
        spec = env.spec
        if check_truncation and spec is not None and not spec.max_episode_steps:
            _fail("truncation", f"{spec.id} is registered without max_episode_steps: episodes must be bounded; "
                  "pass max_episode_steps=N to gymnasium.register (or check_truncation=False if the env "
                  "truncates on its own)")
        if check_truncation and spec is not None and spec.max_episode_steps:
            env.reset(seed=seeds[0])
            for i in range(spec.max_episode_steps):
                _, _, term, trunc, _ = _check_step(env, "")
                if term:
                    _fail("truncation", "invalid moves must not end the episode")
                if trunc != (i == spec.max_episode_steps - 1):
                    _fail("truncation", f"truncated={trunc} at step {i + 1} of max_episode_steps={spec.max_episode_steps}")
            report.checks.append("truncation at max_episode_steps")

        # -- spec, render, close
        if spec is not None:
            if pickle.loads(pickle.dumps(spec)) != spec:
                _fail("spec", "the env spec does not survive pickling")
            try:
                spec.to_json()
            except Exception as e:  # noqa: BLE001
                _fail("spec", f"spec.to_json() failed: {e} (use string entry points and JSON kwargs)")
            report.checks.append("spec pickles and serialises")
        if factory is not None:
            r_env = factory() if env_id is None else gym.make(env_id, render_mode="ansi", **make_kwargs)
            try:
                r_env.reset(seed=seeds[0])
                if r_env.unwrapped.render_mode == "ansi" and not isinstance(r_env.render(), str):
                    _fail("render", "render() with render_mode='ansi' must return str")
            finally:
                r_env.close()
            report.checks.append("ansi render")
        if run_gymnasium_checker:
            from gymnasium.utils.env_checker import check_env

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check_env(env.unwrapped, skip_render_check=True)
            report.checks.append("gymnasium check_env")
    finally:
        env.close()
    try:
        env.close()
    except Exception as e:  # noqa: BLE001
        _fail("close", f"close() twice raised {type(e).__name__}: {e}")
    report.checks.append("close twice")
    return report
