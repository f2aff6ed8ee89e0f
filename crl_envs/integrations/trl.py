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

TRL makes every public *function* of the class a tool, so the class has exactly ``reset``, ``act`` and
``get_reward``, and ``close()`` (which releases the env's server session) is a method TRL does not list.
Sessions still open when Python exits are closed by ``crl_envs.remote``'s ``atexit`` hook.

**Cut-short rollouts.** An episode that the server ends early (it restarted, refused the session at
capacity, timed out the session or a step) is not the model's doing: ``TextEnvironment`` marks it
(``cut_short`` holds the reason, ``info["cut_short"]`` too), tells the model, and ``get_reward``
returns ``None``, which TRL counts as unscorable: the rollout gets advantage 0 and is left out of the
logged reward (``score_cut_short=True`` keeps the partial return instead). Add
:func:`log_cut_short` to ``reward_funcs`` to log the fraction (``cut_short``) in TRL's metrics.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from crl_envs.remote import RemoteEnvError

logger = logging.getLogger(__name__)

# The tool's error after the episode ends (TRL shows a tool's exception to the model).
EPISODE_OVER = "The episode is over: stop calling act."
# What the model is shown where the server cut the episode short (followed by the reason).
CUT_SHORT = "The environment ended this episode early; it will not be scored. Stop calling act."
REOPEN_WAIT_S = 30.0  # how long reset keeps trying to reach a server that is gone (a restart takes seconds)


class not_a_tool:  # noqa: N801 - used as a decorator, like property
    """A method TRL does not turn into a tool: TRL lists the class's plain functions (``inspect.isfunction``),
    and on the class this descriptor is itself, not a function; on an instance it is the bound method."""

    def __init__(self, func: Callable[..., Any]):
        self.func = func
        functools.update_wrapper(self, func)

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else self.func.__get__(obj, owner)


class TextEnvironment:
    """One crl-bench env, one episode at a time, in the shape TRL's ``environment_factory`` wants.

    Args:
        env_id: a registered id; ``"crl/Remote-v0"`` (with ``url=``) plays an env served by
            ``python -m crl_envs.serve``.
        score_cut_short: score an episode the server cut short with its partial return (default: ``None``,
            which TRL leaves out of the update).
        **make_kwargs: passed to ``gymnasium.make`` (e.g. ``url``).

    The env is made at the first ``reset`` (TRL builds one probe instance at start-up, and keeps
    and reuses instances across batches). After the episode ends, ``act`` raises, which TRL shows
    the model as the tool's error. ``reset`` opens a new server session where the server ended the
    last one (idle past its ``--session-timeout`` while TRL trained).

    Attributes:
        cut_short: ``None``, or why the server ended this episode early (``"CAPACITY_REACHED: ..."``,
            ``"CONNECTION_LOST: ..."``, ``"TIMEOUT: ..."``, ``"SESSION_TIMEOUT: ..."``).
        info: the env's last ``info`` (with ``cut_short`` where the episode was cut short).
    """

    def __init__(self, env_id: str = "crl/Remote-v0", *, score_cut_short: bool = False, **make_kwargs: Any):
        self.env_id = env_id
        self.score_cut_short = score_cut_short
        self.make_kwargs = make_kwargs
        self.env: gym.Env | None = None
        self.episode_return = 0.0
        self.done = False
        self.steps = 0
        self.cut_short: str | None = None
        self.info: dict[str, Any] = {}

    def reset(self, **row: Any) -> str:
        """Start an episode: the row's ``seed`` picks the task (``None``: a random one); ``options``
        goes to the env. Returns the first observation, appended to the prompt by TRL."""
        if self.env is None:
            self.env = gym.make(self.env_id, **self.make_kwargs)
        seed = None if row.get("seed") is None else int(row["seed"])
        self.episode_return, self.done, self.steps, self.cut_short = 0.0, False, 0, None
        deadline, refused = time.monotonic() + REOPEN_WAIT_S, 0
        while True:
            try:
                obs, self.info = self.env.reset(seed=seed, options=row.get("options"))
                return f"\n\n{obs}"
            except RemoteEnvError as e:
                # TRL keeps instances across steps, and a step can outlast the server's --session-timeout: the
                # failed reset dropped the ended session, so one more opens a new one. A server that restarts
                # refuses connections for a few seconds; one that stays gone raises here (a run cannot go on).
                if not e.session_ended:
                    raise  # the server answered and kept the session: a bad request (e.g. the seed)
                if e.code == "UNREACHABLE":
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1.0)
                    continue
                refused += 1
                if refused == 2:  # e.g. CAPACITY_REACHED twice: this rollout gets no episode
                    return "\n\n" + self._cut(e)

    def act(self, action: str) -> str:
        """Take one action in the environment.

        Args:
            action: the action, one of those the last observation lists.

        Returns:
            What the environment shows after the action.
        """
        if self.env is None or self.done:
            raise ValueError(f"{CUT_SHORT} ({self.cut_short})" if self.cut_short else EPISODE_OVER)
        try:
            obs, reward, terminated, truncated, self.info = self.env.step(str(action))
        except RemoteEnvError as e:
            if not e.session_ended:
                raise  # the served env raised on this action; the session goes on (TRL shows the model the error)
            return self._cut(e)
        self.episode_return += float(reward)
        self.steps += 1
        self.done = bool(terminated or truncated)
        if self.done:
            outcome = "solved" if self.info.get("success") else "not solved"
            obs = f"{obs}\nThe episode is over ({outcome})."
        return obs

    def get_reward(self) -> float | None:
        """The episode's return: the sum of the env's rewards so far (0 before any step); ``None`` (TRL: not
        scored) where the server cut the episode short, unless ``score_cut_short``."""
        if self.cut_short is not None and not self.score_cut_short:
            return None
        return self.episode_return

    @not_a_tool
    def close(self) -> None:
        """Release the env (a served env's session). Returns at once after a server error; idempotent."""
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            env.close()

    def _cut(self, error: RemoteEnvError) -> str:
        """Mark the episode as cut short by the server; the text the model is shown."""
        self.cut_short = f"{error.code}: {error}"
        self.done = True
        self.info = {**self.info, "cut_short": self.cut_short}
        logger.warning("%s: episode cut short after %d steps (%s)", self.env_id, self.steps, self.cut_short)
        return f"{CUT_SHORT} ({error.code})"

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - at interpreter exit the connection may already be gone
            pass


def environment_factory(env_id: str = "crl/Remote-v0", **kwargs: Any) -> Callable[[], TextEnvironment]:
    """What to pass as ``GRPOTrainer(environment_factory=...)``: builds a :class:`TextEnvironment`
    of ``env_id`` (``score_cut_short=`` and ``gymnasium.make`` kwargs such as ``url=`` included) with no
    arguments."""
    return functools.partial(TextEnvironment, env_id, **kwargs)


def act_tool_schema() -> dict[str, Any]:
    """The JSON schema of :meth:`TextEnvironment.act`, as TRL builds it for the model (an SFT row's ``tools``)."""
    from transformers.utils import get_json_schema

    return get_json_schema(TextEnvironment().act)


def oracle_conversations(env_id: str, seeds: Any, prompt: list[dict[str, str]], *, closing: str = "Done.",
                         max_steps: int = 100, **make_kwargs: Any) -> list[dict[str, Any]]:
    """The env's solver playing ``seeds``, each episode rendered as the conversation GRPOTrainer would build.

    An SFT warm-start on these rows teaches a model the tool-call format and the task's moves before
    ``GRPOTrainer`` (with :func:`environment_factory` of the same env) takes over: each row is exactly what a
    rollout of that trainer looks like, played well. ``prompt`` is the dataset's prompt (the messages before
    the episode); the first observation is appended to its last message as TRL appends ``reset``'s string; then
    one assistant turn per move, calling ``act`` with the solver's action, and the ``tool`` message ``act``
    returns (:class:`TextEnvironment` renders both, so the text is the one the model meets in GRPO); then a last
    assistant turn ``closing`` without a tool call, which ends a TRL rollout.

    ``env_id`` must ship a solver (``crl_envs.registry.has_solver``; ``crl/Remote-v0`` has none: name the env the
    server serves). An episode the solver does not finish within ``max_steps`` moves (or fails) is left out.

    Returns:
        rows ``{"messages": [...], "tools": "<JSON list with the act schema>", "seed": seed}``, ready for
        ``datasets.Dataset.from_list`` and TRL's ``SFTTrainer`` (``SFTConfig(assistant_only_loss=True)`` trains on
        the assistant turns alone).
    """
    import json

    from crl_envs.registry import has_solver

    if not has_solver(env_id):
        raise ValueError(f"{env_id} has no solver (oracle_action) to play demonstrations: name an env that has one")
    tools = json.dumps([act_tool_schema()])
    rows = []
    for seed in seeds:
        env = TextEnvironment(env_id, **make_kwargs)
        try:
            first = env.reset(seed=int(seed))
            messages = [dict(m) for m in prompt]
            messages[-1]["content"] = messages[-1]["content"] + first
            while not env.done and env.steps < max_steps:
                action = env.env.unwrapped.oracle_action()
                call = {"type": "function", "function": {"name": "act", "arguments": {"action": action}}}
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                messages.append({"role": "tool", "name": "act", "content": env.act(action)})
            if env.done and env.info.get("success"):
                messages.append({"role": "assistant", "content": closing})
                rows.append({"messages": messages, "tools": tools, "seed": int(seed)})
        finally:
            env.close()
    return rows


def log_cut_short(environments: list[Any] | None = None, log_metric: Callable[[str, float], None] | None = None,
                  log_extra: Callable[[str, list[Any]], None] | None = None, **kwargs: Any) -> list[None]:
    """A TRL reward function that scores nothing and logs the rollouts the server cut short.

    Pass it in ``reward_funcs`` beside an ``environment_factory`` of :class:`TextEnvironment`: TRL's metrics get
    ``cut_short`` (the fraction of the batch's rollouts cut short) and its completions table a ``cut_short``
    column (the reason, or ``""``). It returns ``None`` for every rollout, so it never changes a reward (TRL
    logs its own ``rewards/log_cut_short/mean`` as NaN).
    """
    reasons = [getattr(env, "cut_short", None) or "" for env in environments or []]
    if log_metric is not None and reasons:
        log_metric("cut_short", sum(bool(r) for r in reasons) / len(reasons))
    if log_extra is not None and reasons:
        log_extra("cut_short", reasons)
    return [None] * len(reasons)


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
