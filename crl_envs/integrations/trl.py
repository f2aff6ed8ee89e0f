"""Any crl-bench text env as a TRL ``environment_factory``: ``GRPOTrainer`` plays it through one tool.

TRL's ``GRPOTrainer`` (1.16) builds one environment object per rollout with no arguments, calls its
``reset(**row)`` with the dataset row (the string it returns is appended to the prompt), turns its
other public methods into tools the model calls, and, where it has ``get_reward()``, scores each
rollout with it (logged as ``rewards/<class name>/mean``). :class:`TextEnvironment` is that object
for a crl-bench env: ``reset`` takes the row's ``seed`` (and ``options``), the one tool ``act``
sends the model's action to the env's ``step``, and ``get_reward`` is the episode's return::

    from crl_envs.integrations.trl import environment_factory, tool_chat_template

    factory = environment_factory("crl/Remote-v0", url="http://127.0.0.1:8000")  # python -m crl_envs.serve ...
    tokenizer = tool_chat_template(AutoTokenizer.from_pretrained(model))  # ChatML models without tool calls
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, train_dataset=rows_with_prompt_and_seed,
                          environment_factory=factory, args=GRPOConfig(...))

Every public method of the class is a tool to TRL, so the class has exactly ``reset``, ``act`` and
``get_reward``; the env is released when the object is garbage-collected.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from crl_envs.remote import RemoteEnvError

# The tool's error after the episode ends (TRL shows a tool's exception to the model).
EPISODE_OVER = "The episode is over: stop calling act."


class TextEnvironment:
    """One crl-bench env, one episode at a time, in the shape TRL's ``environment_factory`` wants.

    Args:
        env_id: a registered id; ``"crl/Remote-v0"`` (with ``url=``) plays an env served by
            ``python -m crl_envs.serve``.
        **make_kwargs: passed to ``gymnasium.make`` (e.g. ``url``).

    The env is made at the first ``reset`` (TRL builds one probe instance at start-up, and keeps
    and reuses instances across batches). After the episode ends, ``act`` raises, which TRL shows
    the model as the tool's error. ``reset`` opens a new server session where the server ended the
    last one (idle past its ``--session-timeout`` while TRL trained).
    """

    def __init__(self, env_id: str = "crl/Remote-v0", **make_kwargs: Any):
        self.env_id = env_id
        self.make_kwargs = make_kwargs
        self.env: gym.Env | None = None
        self.episode_return = 0.0
        self.done = False
        self.steps = 0
        self.info: dict[str, Any] = {}

    def reset(self, **row: Any) -> str:
        """Start an episode: the row's ``seed`` picks the task (``None``: a random one); ``options``
        goes to the env. Returns the first observation, appended to the prompt by TRL."""
        if self.env is None:
            self.env = gym.make(self.env_id, **self.make_kwargs)
        seed = None if row.get("seed") is None else int(row["seed"])
        try:
            obs, self.info = self.env.reset(seed=seed, options=row.get("options"))
        except RemoteEnvError:
            # TRL keeps instances across steps, and a step can outlast the server's --session-timeout:
            # the failed reset dropped the ended session, so one more opens a new one (a persistent
            # error, such as a server that is gone, raises again here).
            obs, self.info = self.env.reset(seed=seed, options=row.get("options"))
        self.episode_return, self.done, self.steps = 0.0, False, 0
        return f"\n\n{obs}"

    def act(self, action: str) -> str:
        """Take one action in the environment.

        Args:
            action: the action, one of those the last observation lists.

        Returns:
            What the environment shows after the action.
        """
        if self.env is None or self.done:
            raise ValueError(EPISODE_OVER)
        obs, reward, terminated, truncated, self.info = self.env.step(str(action))
        self.episode_return += float(reward)
        self.steps += 1
        self.done = bool(terminated or truncated)
        if self.done:
            outcome = "solved" if self.info.get("success") else "not solved"
            obs = f"{obs}\nThe episode is over ({outcome})."
        return obs

    def get_reward(self) -> float:
        """The episode's return: the sum of the env's rewards so far (0 before any step)."""
        return self.episode_return

    def __del__(self) -> None:
        env = getattr(self, "env", None)
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - at interpreter exit the connection may already be gone
                pass


def environment_factory(env_id: str = "crl/Remote-v0", **make_kwargs: Any) -> Callable[[], TextEnvironment]:
    """What to pass as ``GRPOTrainer(environment_factory=...)``: builds a :class:`TextEnvironment`
    of ``env_id`` (``gymnasium.make`` kwargs such as ``url=`` included) with no arguments."""
    return functools.partial(TextEnvironment, env_id, **make_kwargs)


def tool_chat_template(tokenizer: Any) -> Any:
    """Give a ChatML tokenizer whose template cannot render tool calls (SmolLM2's) TRL's Qwen2.5 template.

    TRL needs a template that renders ``tool_calls`` and ``tool`` messages and one whose tool-call
    format it can parse; Qwen2.5's is ChatML plus ``<tool_call>{json}</tool_call>``, so a ChatML
    model keeps its turn markers. Returns the same tokenizer. Raises if the tokenizer has no
    ``<|im_start|>``/``<|im_end|>`` tokens (it is not ChatML: use its own tool-calling template).
    """
    try:
        from trl.chat_template_utils import qwen2_5_chat_template
    except ImportError as e:
        raise gym.error.DependencyNotInstalled('TRL integration needs trl: pip install -e ".[trl]"') from e
    vocab = tokenizer.get_vocab()
    missing = [t for t in ("<|im_start|>", "<|im_end|>") if t not in vocab]
    if missing:
        raise ValueError(f"the tokenizer has no {', '.join(missing)} token: it is not a ChatML model, so give it a "
                         "tool-calling chat template of its own family instead")
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer
