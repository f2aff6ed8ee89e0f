"""The text-environment contract every crl-bench env follows.

A :class:`TextEnv` is a ``gymnasium.Env[str, str]``: observations and actions are text.
Subclasses implement three hooks and get the rest of the contract for free:

* ``_reset_task()`` builds a new task instance from ``self.np_random`` and returns
  ``(obs, info)``;
* ``_apply(action)`` applies a *normalised* action and returns a :class:`StepOutcome`,
  or raises :class:`InvalidAction` with feedback for the agent;
* ``_admissible_actions()`` lists the currently valid actions (or ``None``).

The base class guarantees the ``info`` keys (``task``, ``admissible_actions``,
``valid_action``, ``success``, ``progress``), turns every malformed or inapplicable action
into an *invalid move* (reward 0, feedback in the observation, never an exception), and
caps action length so that hostile inputs stay cheap. Non-``str`` actions, empty ones, over-long
ones and text that is not valid Unicode (lone surrogates) never reach ``_apply``. A step after
the episode ended is an invalid move that asks for ``reset()`` and repeats how the episode ended
(``terminated``, or ``truncated`` where a subclass ended it at its own step limit), so an episode
never looks live again: Gymnasium leaves such a step undefined. A step before the first
``reset()`` raises ``gymnasium.error.ResetNeeded``, as Gymnasium's ``OrderEnforcing`` does.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any, ClassVar

import gymnasium as gym

from crl_envs.spaces import UnicodeText

MAX_ACTION_CHARS = 4096
MAX_OBS_CHARS = 65536


def is_unicode(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogates, which no tokenizer or file accepts)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class InvalidAction(Exception):
    """Raised by ``TextEnv._apply`` when an action cannot be parsed or applied.

    The message is shown to the agent as feedback.
    """


@dataclass
class StepOutcome:
    """What ``TextEnv._apply`` returns for a valid action; every field after ``obs`` is keyword-only."""

    obs: str
    _: KW_ONLY
    reward: float = 0.0
    terminated: bool = False
    success: bool = False
    progress: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


class TextEnv(gym.Env[str, str]):
    """Base class for text environments; see the module docstring for the contract.

    Subclasses set ``family`` and call ``super().__init__(render_mode=...)``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    family: ClassVar[str] = "text"
    # True where every reset and step takes at most a few milliseconds: in-process pools then call the
    # env on the event loop instead of handing each call to a thread (which costs 50-100 µs a call).
    fast_steps: ClassVar[bool] = False
    # The longest one step may legitimately take, in seconds, where that can be long (SWE grades a
    # whole test run inside ``submit``); harnesses keep their hung-step timeouts above it.
    step_time_limit_s: float | None = None

    def __init__(self, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r} is not supported; use one of {self.metadata['render_modes']}"
            )
        self.render_mode = render_mode
        self.observation_space = UnicodeText(MAX_OBS_CHARS)
        self.action_space = UnicodeText(MAX_ACTION_CHARS)
        self._task = ""
        self._last_obs = ""
        self._success = False
        self._progress = 0.0
        self._done = False
        # how the episode ended: a terminating outcome, else (``_done`` set by a subclass) a truncation
        self._terminated = False
        self._reset_called = False

    # ----------------------------------------------------------------- hooks
    def _reset_task(self, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        """Build a new task instance; return the first observation and extra info.

        Extra info must contain ``"task"`` (the goal text).
        """
        raise NotImplementedError

    def _apply(self, action: str) -> StepOutcome:
        """Apply a normalised action, or raise :class:`InvalidAction`."""
        raise NotImplementedError

    def _admissible_actions(self) -> list[str] | None:
        """The currently valid actions, or ``None`` if they cannot be enumerated."""
        return None

    def oracle_action(self) -> str:
        """The family solver's next action from the current state (drives ``--agent oracle``).

        Families that ship a solver override this; it must never be shown to agents.
        """
        raise NotImplementedError(f"{type(self).__name__} has no solver")

    def normalize_action(self, action: str) -> str:
        """Canonical form of an action: stripped, whitespace collapsed."""
        return " ".join(action.split())

    # -------------------------------------------------------------- contract
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._reset_called = True
        self._success = False
        self._progress = 0.0
        self._done = self._terminated = False
        obs, extra = self._reset_task(options)
        self._task = str(extra.get("task", ""))
        self._last_obs = obs
        info = {
            **extra,
            "task": self._task,
            "admissible_actions": self._admissible_actions(),
            "valid_action": True,
            "success": False,
            "progress": 0.0,
        }
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._reset_called:
            raise gym.error.ResetNeeded(f"{type(self).__name__}: call reset() before step()")
        outcome: StepOutcome | None = None
        feedback = ""
        if self._done:
            feedback = "The episode is over; call reset() to start a new one."
        elif not isinstance(action, str):
            feedback = f"Invalid action: expected text, got {type(action).__name__}."
        elif len(action) > MAX_ACTION_CHARS:
            feedback = f"Invalid action: longer than {MAX_ACTION_CHARS} characters."
        elif not is_unicode(action):
            feedback = ("Invalid action: the text is not valid Unicode (it holds a lone surrogate such as "
                        "'\\ud800'); send plain text.")
        else:
            norm = self.normalize_action(action)
            if not norm:
                feedback = "Invalid action: the action is empty."
            else:
                try:
                    outcome = self._apply(norm)
                except InvalidAction as e:
                    feedback = f"Invalid action: {e}"
        if outcome is None:
            obs = f"{feedback}\n\n{self._last_obs}" if self._last_obs else feedback
            info = self._info(valid=False)
            if self._done:  # the episode stays over until reset(): never flip back to a live one
                return obs, 0.0, self._terminated, not self._terminated, info
            return obs, 0.0, False, False, info
        self._success = bool(outcome.success)
        self._progress = float(min(1.0, max(0.0, outcome.progress)))
        self._done = self._terminated = bool(outcome.terminated)
        self._last_obs = outcome.obs
        info = {**outcome.info, **self._info(valid=True)}
        return outcome.obs, float(outcome.reward), bool(outcome.terminated), False, info

    def _info(self, *, valid: bool) -> dict[str, Any]:
        return {
            "task": self._task,
            "admissible_actions": None if self._done else self._admissible_actions(),
            "valid_action": valid,
            "success": self._success,
            "progress": self._progress,
        }

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_obs
        return None
