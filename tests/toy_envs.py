"""Small TextEnvs for testing the conformance kit, including deliberately broken ones."""

from __future__ import annotations

import random

from crl_envs.core import InvalidAction, StepOutcome, TextEnv


class GuessEnv(TextEnv):
    """Guess a number in [1, 9]; the env says higher or lower. A correct env."""

    family = "Guess"

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        self.target = 0
        self.history: list[str] = []

    def _reset_task(self, options):
        self.target = int(self.np_random.integers(1, 10))
        self.history = []
        return "Guess a number from 1 to 9.", {"task": "Guess the hidden number."}

    def _apply(self, action):
        if action not in {str(i) for i in range(1, 10)}:
            raise InvalidAction("say a digit from 1 to 9")
        n = int(action)
        self.history.append(action)
        if n == self.target:
            return StepOutcome("Correct!", reward=1.0, terminated=True, success=True, progress=1.0)
        hint = "higher" if n < self.target else "lower"
        return StepOutcome(f"{n} is wrong; go {hint}. Guesses so far: {' '.join(self.history)}")

    def _admissible_actions(self):
        return [str(i) for i in range(1, 10)]

    def oracle_action(self):
        return str(self.target)


class RaisingEnv(GuessEnv):
    """Broken: raises on bad input instead of an invalid move."""

    def step(self, action):
        if not action.strip():
            raise ValueError("empty action")
        return super().step(action)


class NondeterministicEnv(GuessEnv):
    """Broken: draws from the global random module instead of self.np_random."""

    def _reset_task(self, options):
        obs, info = super()._reset_task(options)
        self.target = random.randint(1, 9)
        return f"Guess a number from 1 to 9 (round {random.random():.6f}).", info


class LeakyEnv(GuessEnv):
    """Broken: the guess history survives reset()."""

    def _reset_task(self, options):
        self.target = int(self.np_random.integers(1, 10))
        return f"Guess a number from 1 to 9. Earlier guesses: {self.history}", {"task": "Guess the hidden number."}


class NoFeedbackEnv(GuessEnv):
    """Broken: an invalid move gives a reward."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        if not info["valid_action"]:
            r = 0.5
        return obs, r, term, trunc, info


class FaultyEnv(GuessEnv):
    """Misbehaves on command: ``hang`` sleeps forever, ``crash`` kills its process, ``raise`` raises."""

    def step(self, action):
        import os
        import signal
        import time

        if action == "hang":
            time.sleep(3600)
        if action == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "raise":
            raise RuntimeError("env bug")
        return super().step(action)
