"""Any crl-bench text env as a verifiers ``MultiTurnEnv``: seeds are the dataset, our ``step`` the env's turn.

verifiers (0.3.1, its classic ``vf.MultiTurnEnv`` API; 0.4.0 removed it) runs a rollout as: the dataset
row's ``prompt`` goes to the model, then ``env_response`` answers each reply until a stop condition
holds, and a ``Rubric`` scores the finished state. :class:`TextGymEnv` maps that onto a crl-bench env:

- **dataset**: one row per seed (``info["seed"]``); the row's user message is a placeholder that
  ``setup_state`` replaces with the env's first observation, since only ``reset`` knows it;
- **env response**: the action parsed from the reply (by default the last ``<action>...</action>``
  tag, else the whole reply) goes to ``step``; the observation comes back as the user's message,
  and when the episode ends (terminated or truncated) it is the rollout's final env response;
- **rubric**: the reward is the episode's return (the sum of ``step``'s rewards); ``success``,
  ``progress``, ``steps``, ``invalid_actions`` and ``cut_short`` are metrics (weight 0);
- **cut short**: where a served env's server ends the episode early (a restart, ``CAPACITY_REACHED``, a
  timeout: a :class:`~crl_envs.remote.RemoteEnvError` that ends the session), the rollout stops with a
  ``vf.InfraError`` (the row's ``error``, verifiers' mark of an infrastructure failure) and its
  ``cut_short`` metric is 1: leave such rows out of an update.

Each rollout makes its own env (``gymnasium.make``) and closes it when the rollout ends; ``reset``
and ``step`` run in a worker thread so concurrent rollouts do not block verifiers' event loop::

    from crl_envs.integrations.verifiers import load_environment

    env = load_environment("crl/Sokoban-6x6-1-v0", num_eval_examples=8)
    results = env.evaluate_sync(client, model="...", num_examples=8, rollouts_per_example=2)

``client`` may be verifiers' own client or a plain ``openai.AsyncOpenAI`` (wrapped in verifiers'
``OpenAIChatCompletionsClient``; :func:`openai_client` builds one for a base URL).

verifiers pins ``mcp<2``, which the ``openenv`` extra cannot live beside: install it in a venv of its
own (``make test-verifiers`` builds ``.venv-verifiers``).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from crl_envs.registry import check_env_id
from crl_envs.remote import RemoteEnvError

try:
    import verifiers as vf
    from datasets import Dataset
    from verifiers.clients import OpenAIChatCompletionsClient
except ImportError as e:
    raise gym.error.DependencyNotInstalled(
        'the verifiers integration needs verifiers: pip install -e ".[verifiers]" in a venv without the openenv '
        "extra (verifiers pins mcp<2), e.g. `make test-verifiers`"
    ) from e

DEFAULT_SYSTEM_PROMPT = (
    "You play a text game. Each turn, read the observation and reply with exactly one of the actions it "
    "lists, inside <action></action> tags, e.g. <action>up</action>."
)
_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
# The state key holding the rollout's env and its episode record (popped when the rollout ends).
ENV_KEY, EPISODE_KEY = "crl_env", "crl_episode"


def tagged_action(reply: str, admissible: list[str] | None = None) -> str:
    """The default parser: the last ``<action>...</action>`` tag's text, else the whole reply (stripped).

    An unparsable reply still reaches the env, which answers it as an invalid move with feedback.
    """
    tags = [t.strip() for t in _ACTION_TAG.findall(reply or "")]
    tags = [t for t in tags if t]
    return tags[-1] if tags else (reply or "").strip()


def verifiers_client(client: Any) -> Any:
    """``client`` as verifiers' ``evaluate``/``generate`` take it: a plain ``openai.AsyncOpenAI`` is wrapped in
    ``OpenAIChatCompletionsClient``; verifiers' clients and ``ClientConfig`` pass through."""
    try:
        from openai import AsyncOpenAI, OpenAI
    except ImportError:  # no openai: nothing to wrap
        return client
    if isinstance(client, AsyncOpenAI):
        return OpenAIChatCompletionsClient(client)
    if isinstance(client, OpenAI):
        raise TypeError("verifiers runs rollouts concurrently and needs openai.AsyncOpenAI, not openai.OpenAI: "
                        "use AsyncOpenAI(base_url=..., api_key=...) or openai_client(base_url)")
    return client


def openai_client(base_url: str, api_key: str = "unused", **kwargs: Any) -> OpenAIChatCompletionsClient:
    """A verifiers client for an OpenAI-compatible server (e.g. ``python -m crl_agent.serve``, whose ``/v1``
    base URL it prints); ``kwargs`` go to ``openai.AsyncOpenAI`` (e.g. ``max_retries``, ``timeout``)."""
    from openai import AsyncOpenAI

    return OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key=api_key, **kwargs))


def _message_text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        parts = [p.get("text") if isinstance(p, dict) else getattr(p, "text", None) for p in content]
        return "".join(p for p in parts if isinstance(p, str))
    return ""


class EpisodeRubric(vf.Rubric):
    """The episode's return as the reward; success, progress, steps, invalid actions and cut short as metrics."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.add_reward_func(self.episode_return, weight=1.0)
        for metric in (self.success, self.progress, self.steps, self.invalid_actions, self.cut_short):
            self.add_metric(metric)

    async def episode_return(self, state: vf.State) -> float:
        return float(state.get(EPISODE_KEY, {}).get("return", 0.0))

    async def success(self, state: vf.State) -> float:
        return float(bool(state.get(EPISODE_KEY, {}).get("success", False)))

    async def progress(self, state: vf.State) -> float:
        return float(state.get(EPISODE_KEY, {}).get("progress", 0.0))

    async def steps(self, state: vf.State) -> float:
        return float(state.get(EPISODE_KEY, {}).get("steps", 0))

    async def invalid_actions(self, state: vf.State) -> float:
        return float(state.get(EPISODE_KEY, {}).get("invalid", 0))

    async def cut_short(self, state: vf.State) -> float:
        """1 where the server ended the episode early (the rollout's ``error`` says why), else 0."""
        return float(bool(state.get(EPISODE_KEY, {}).get("cut_short")))


class TextGymEnv(vf.MultiTurnEnv):
    """A crl-bench env id as a verifiers multi-turn environment (see the module docstring).

    Args:
        env_id: a registered id (``"crl/Remote-v0"`` with ``make_kwargs={"url": ...}`` plays a served env).
        seeds: the training dataset's seeds.
        eval_seeds: the evaluation dataset's seeds (``evaluate`` uses them).
        make_kwargs: passed to ``gymnasium.make``.
        parse_action: ``(reply, admissible_actions) -> action``; default :func:`tagged_action`.
        system_prompt: the system message of every row.
        max_turns: verifiers' turn cap. Default -1 (none): the env's own step bound (``max_episode_steps``)
            ends the episode. A cap stops the rollout before the env plays the reply of its last turn.
        **kwargs: passed to ``vf.MultiTurnEnv`` (e.g. ``timeout_seconds``).
    """

    def __init__(
        self,
        env_id: str,
        *,
        seeds: Sequence[int] = (),
        eval_seeds: Sequence[int] = (),
        make_kwargs: dict[str, Any] | None = None,
        parse_action: Callable[[str, list[str] | None], str | None] = tagged_action,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        max_turns: int = -1,
        **kwargs: Any,
    ):
        check_env_id(env_id)
        if not seeds and not eval_seeds:
            raise ValueError("give seeds (training rows) or eval_seeds (evaluation rows): both are empty")
        self.gym_env_id = env_id
        self.make_kwargs = dict(make_kwargs or {})
        self.parse_action = parse_action
        super().__init__(
            dataset=self.seed_dataset(env_id, seeds) if seeds else None,
            eval_dataset=self.seed_dataset(env_id, eval_seeds) if eval_seeds else None,
            system_prompt=system_prompt,
            rubric=EpisodeRubric(),
            max_turns=max_turns,
            env_id=env_id,
            **kwargs,
        )

    @staticmethod
    def seed_dataset(env_id: str, seeds: Sequence[int]) -> Dataset:
        """One row per seed: ``info`` carries the seed, ``question`` a placeholder for the first observation."""
        rows = []
        for seed in seeds:
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise ValueError(f"seeds must be non-negative ints, got {seed!r}")
            rows.append({"question": f"{env_id}, seed {seed}", "answer": "", "info": {"seed": seed}})
        return Dataset.from_list(rows)

    async def setup_state(self, state: vf.State, **kwargs: Any) -> vf.State:
        """Make and reset this rollout's env; its first observation becomes the prompt's user message."""
        info = state.get("info") or {}
        if "seed" not in info:
            raise ValueError(f"the dataset row has no info['seed'] (info={info!r}): build rows with seed_dataset")
        env = await asyncio.to_thread(gym.make, self.gym_env_id, **self.make_kwargs)
        state[ENV_KEY] = env
        state[EPISODE_KEY] = {"return": 0.0, "steps": 0, "invalid": 0, "success": False, "progress": 0.0,
                              "admissible": None, "cut_short": None}
        try:
            obs, env_info = await asyncio.to_thread(env.reset, seed=int(info["seed"]))
        except RemoteEnvError as e:
            raise self._cut_short(state, e) from None
        state[EPISODE_KEY]["admissible"] = env_info.get("admissible_actions")
        prompt = list(state["prompt"])
        if prompt and getattr(prompt[-1], "role", None) == "user":
            prompt.pop()  # the row's placeholder
        state["prompt"] = [*prompt, vf.UserMessage(content=str(obs))]
        return state

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        """Play the last reply's action; the observation is the answer (the final one when the episode ends)."""
        episode = state[EPISODE_KEY]
        reply = _message_text(messages[-1]) if messages else ""
        action = self.parse_action(reply, episode["admissible"])
        try:
            obs, reward, terminated, truncated, info = await asyncio.to_thread(
                state[ENV_KEY].step, "" if action is None else str(action))
        except RemoteEnvError as e:
            if not e.session_ended:
                raise  # the served env raised on this action: a bug to see, not the server cutting the episode
            raise self._cut_short(state, e) from None
        episode["return"] += float(reward)
        episode["steps"] += 1
        episode["invalid"] += 0 if info.get("valid_action", True) else 1
        episode["success"] = bool(info.get("success", False))
        episode["progress"] = float(info.get("progress", 0.0))
        episode["admissible"] = info.get("admissible_actions")
        response = [vf.UserMessage(content=str(obs))]
        if terminated or truncated:
            state["final_env_response"] = response
        return response

    @staticmethod
    def _cut_short(state: vf.State, error: RemoteEnvError) -> vf.InfraError:
        """Mark the rollout as cut short by the server; the error that stops it (the row's ``error``)."""
        state[EPISODE_KEY]["cut_short"] = error.code
        return vf.InfraError(f"episode cut short by the env server ({error.code}): {error}")

    async def generate(self, inputs: Any, client: Any, *args: Any, **kwargs: Any) -> Any:
        """verifiers' ``generate`` (``evaluate`` calls it), also taking a plain ``openai.AsyncOpenAI``."""
        return await super().generate(inputs, verifiers_client(client), *args, **kwargs)

    async def run_rollout(self, input: Any, client: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A002
        return await super().run_rollout(input, verifiers_client(client), *args, **kwargs)

    async def run_group(self, group_inputs: Any, client: Any, *args: Any, **kwargs: Any) -> Any:
        return await super().run_group(group_inputs, verifiers_client(client), *args, **kwargs)

    @vf.cleanup
    async def close_env(self, state: vf.State) -> None:
        """Close the rollout's env (also after an error or a timeout)."""
        env = state.pop(ENV_KEY, None)
        if env is not None:
            await asyncio.to_thread(env.close)


def load_environment(
    env_id: str = "crl/Sokoban-6x6-1-v0",
    num_train_examples: int = 0,
    num_eval_examples: int = 16,
    eval_seed_offset: int = 1_000_000,
    **kwargs: Any,
) -> TextGymEnv:
    """verifiers' entry point (``vf.load_environment`` / ``vf-eval`` convention).

    Training seeds are ``0..num_train_examples-1``, evaluation seeds ``eval_seed_offset`` onward, so
    the two never overlap. Other keyword arguments go to :class:`TextGymEnv`.
    """
    if num_train_examples < 0 or num_eval_examples < 0:
        raise ValueError("num_train_examples and num_eval_examples must be >= 0")
    return TextGymEnv(
        env_id,
        seeds=range(num_train_examples),
        eval_seeds=range(eval_seed_offset, eval_seed_offset + num_eval_examples),
        **kwargs,
    )
