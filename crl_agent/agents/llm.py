"""``llm``: a plain ReAct-style LLM agent over any backend.

Each turn the policy sends one chat (see :mod:`crl_agent.prompts`): a system message with the
env family's instructions and the action format, the last ``history`` turns (dropped oldest
first beyond ``history_tokens``), and the current observation with the goal, the admissible
actions when the env lists them, and feedback on the previous reply.

**Action format.** Brief reasoning, then exactly one ``<action>...</action>``; generation stops
at ``</action>``. :func:`parse_action` is lenient and tries, in order: the tag (also unclosed at
the end of the reply), the last ``Action: ...`` line, the last line that exactly matches an
admissible action, the last fenced code block, and the last line that matches an admissible
action ignoring case, quotes, markdown and a trailing period, and last the last quoted phrase
(``"north"``, ```north```) that is an admissible action, as in ``My next action is "north".``
A bare action word inside a sentence (``I'll move up now``) is never guessed. A match is
mapped onto the admissible action's exact spelling.

**Parse failures.** A reply with no action is *not* replaced by a made-up move: the stripped
reply itself is sent, so the env scores it exactly like any other bad input (an invalid move,
reward 0, feedback in its observation, counted in ``invalid_actions``), and the next prompt
tells the model that its reply had no ``<action>`` tag.

**Extending it** (the ``crl`` agent does): subclass :class:`LLMPolicy` and set
``policy_class`` on an :class:`LLMAgent` subclass. Hooks:

- ``async system_prompt(obs, info)``: the system message, built once at the first step (the
  goal is known by then); append retrieved experience to ``await super().system_prompt(...)``.
- ``parse_reply(text, info)``: return a :class:`ParsedReply`; set ``tool``/``argument`` for a
  tool call such as ``<search>query</search>``.
- ``async on_tool(reply, info)``: run a tool call and return the text the model sees next; the
  policy then asks the model again in the same turn (at most ``max_tool_calls`` per episode).
- ``stop_strings()``: add ``"</search>"`` so generation stops after a tool call.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crl_agent import prompts
from crl_agent.agents.base import Agent, Policy
from crl_agent.episode import EpisodeContext, ScoredTurn
from crl_agent.llm import LLM, Completion, Message, SamplingParams, make_llm
from crl_agent.llm.base import ScoreResult

ACTION_MODES = ("auto", "score", "generate")
_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_TAG_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_OPEN_TAG_RE = re.compile(r"<action>(.*)\Z", re.DOTALL | re.IGNORECASE)
_ACTION_LINE_RE = re.compile(r"^[\s>*#-]*\**action\**\s*[:：]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_FENCE_RE = re.compile(r"```[\w+-]*[ \t]*\n?(.*?)```", re.DOTALL)
_DECOR = " \t\"'`*_"
_QUOTED_RE = re.compile(r"\"([^\"\n]+)\"|“([^”\n]+)”|`([^`\n]+)`|(?<![A-Za-z])'([^'\n]+)'(?![A-Za-z])")


@dataclass
class ParsedReply:
    """What a reply asks for.

    Attributes:
        action: the action to send, or ``None`` when the reply holds none.
        method: which rule found it (``tag``, ``action_line``, ``exact_line``, ``fenced``,
            ``case_insensitive``, ``quoted``) or ``none``.
        tool: a tool name (subclasses, e.g. ``"search"``), else ``None``.
        argument: the tool's argument.
    """

    action: str | None
    method: str
    tool: str | None = None
    argument: str = ""


def _clean(candidate: str) -> str:
    """Strip quotes, backticks, markdown emphasis and trailing periods, repeatedly."""
    text, prev = candidate.strip(), None
    while text != prev:
        prev, text = text, text.strip(_DECOR).rstrip(".!").strip()
    return text


def _canonical(candidate: str, admissible: list[str] | None) -> str:
    """Map ``candidate`` onto an admissible action's spelling when it matches one loosely."""
    raw = candidate.strip()
    if admissible:
        lookup = {a.strip().lower(): a for a in admissible}
        for key in (raw.lower(), raw.strip(_DECOR).lower(), _clean(raw).lower()):
            if key in lookup:
                return lookup[key]
    return raw.strip(_DECOR).strip() if raw.strip(_DECOR).strip() else raw


def parse_action(text: str, admissible: list[str] | None = None) -> ParsedReply:
    """Find the action in a model reply (see the module docstring for the rules and their order)."""
    body = _THINK_RE.sub("", text or "")
    m = _TAG_RE.search(body) or _OPEN_TAG_RE.search(body)
    if m and m.group(1).strip():
        return ParsedReply(_canonical(m.group(1), admissible), "tag")
    lines = [ln for ln in body.splitlines() if ln.strip()]
    hits = _ACTION_LINE_RE.findall(body)
    if hits and _clean(hits[-1]):
        return ParsedReply(_canonical(hits[-1], admissible), "action_line")
    if admissible:
        exact = set(admissible)
        for ln in reversed(lines):
            if ln.strip() in exact:
                return ParsedReply(ln.strip(), "exact_line")
    fences = [f.strip() for f in _FENCE_RE.findall(body) if f.strip()]
    if fences:
        return ParsedReply(_canonical(fences[-1], admissible), "fenced")
    if admissible:
        lookup = {a.strip().lower(): a for a in admissible}
        for ln in reversed(lines):
            key = _clean(ln.strip().lstrip("-*>0123456789.) ")).lower()
            if key in lookup:
                return ParsedReply(lookup[key], "case_insensitive")
        for groups in reversed(_QUOTED_RE.findall(body)):
            key = _clean(next(g for g in groups if g)).lower()
            if key in lookup:
                return ParsedReply(lookup[key], "quoted")
    return ParsedReply(None, "none")


@dataclass
class Turn:
    """One step of an episode as the policy saw it (kept for trainers and debugging)."""

    observation: str
    reply: str
    action: str
    method: str
    messages: list[Message]
    completions: list[Completion] = field(default_factory=list)
    history_tokens: int = 0
    valid: bool | None = None  # whether the env accepted the action (known at the next step)
    trace: dict[str, Any] = field(default_factory=dict)  # subclass additions (experience shown, searches)
    scored: ScoredTurn | None = None  # score mode: the decision (its trace is part of the turn's)
    tool_choices: list[ScoredTurn] = field(default_factory=list)  # score mode: decisions before it that chose a tool


class LLMPolicy(Policy):
    """One episode of the ``llm`` agent; see the module docstring for the hooks."""

    def __init__(self, agent: LLMAgent, ctx: EpisodeContext):
        self.agent, self.ctx = agent, ctx
        self.family = prompts.family_of_env_id(ctx.env_id)
        self.turns: list[Turn] = []
        self.tokens_in = self.tokens_out = 0
        self.llm_calls = self.parse_failures = self.tool_calls = 0
        self._system: str | None = None
        self._feedback = ""

    # ------------------------------------------------------------------ hooks
    async def system_prompt(self, obs: str, info: dict[str, Any]) -> str:
        """The system message for this episode (called once, at the first step)."""
        mode = self.agent.action_mode
        if mode == "auto" and self.scores_this_step(info):
            mode = "score"  # the env lists its actions: say only how to answer when it does
        return prompts.system_prompt(self.family, mode)

    def parse_reply(self, text: str, info: dict[str, Any]) -> ParsedReply:
        """Parse one model reply."""
        return parse_action(text, info.get("admissible_actions"))

    async def on_tool(self, reply: ParsedReply, info: dict[str, Any]) -> str:
        """Run a tool call and return what the model sees next (the base agent has no tools)."""
        return f"There is no tool named {reply.tool!r}. Answer with <action>...</action>."

    def stop_strings(self) -> tuple[str, ...]:
        return ("</action>",)

    # ----------------------------------------------------------------- acting
    def build_messages(self, obs: str, info: dict[str, Any], scratch: list[Message]) -> list[Message]:
        """System message, bounded history, current turn, then this turn's tool exchanges.

        With ``history_style="compact"`` a past turn is one short user line (its step number and
        whether its action was valid) and the action the model took; ``"full"`` repeats its whole
        observation and reply. Compact history only grows at the end, so a backend's prefix cache
        reuses the previous turn's prompt.
        """
        agent = self.agent
        history: list[Message] = []
        budget = agent.history_tokens
        for i in range(len(self.turns) - 1, max(-1, len(self.turns) - 1 - agent.history), -1):
            turn = self.turns[i]
            if turn.history_tokens > budget:
                break
            budget -= turn.history_tokens
            if agent.history_style == "compact":
                history[:0] = [
                    {"role": "user", "content": prompts.compact_history_message(i, turn.valid)},
                    {"role": "assistant", "content": turn.action},
                ]
            else:
                history[:0] = [
                    {"role": "user", "content": prompts.history_message(turn.observation, i)},
                    {"role": "assistant", "content": turn.reply},
                ]
        current = prompts.turn_message(
            obs,
            goal=str(info.get("task") or ""),
            actions=info.get("admissible_actions"),
            feedback=self._feedback,
            step=len(self.turns),
        )
        return [{"role": "system", "content": self._system or ""}, *history, {"role": "user", "content": current},
                *scratch]

    def _params(self) -> SamplingParams:
        key = f"{self.agent.seed}:{self.ctx.env_id}:{self.ctx.seed}:{self.llm_calls}"
        if self.ctx.sample:  # sample 0 keeps the seeds of runs recorded before samples existed
            key += f":s{self.ctx.sample}"
        key = key.encode()
        return SamplingParams(
            max_tokens=self.agent.max_tokens,
            temperature=self.agent.temperature,
            top_p=self.agent.top_p,
            stop=self.stop_strings(),
            seed=zlib.crc32(key) & 0x7FFFFFFF,
        )

    async def _complete(self, messages: list[Message], params: SamplingParams | None = None) -> Completion:
        completion = await self.agent.llm.chat(messages, params or self._params())
        self.llm_calls += 1
        self.tokens_in += completion.prompt_tokens
        self.tokens_out += completion.completion_tokens
        return completion

    def scores_this_step(self, info: dict[str, Any]) -> bool:
        """Whether this step picks by scoring the admissible actions (see ``action_mode``)."""
        mode = self.agent.action_mode
        listed = isinstance(info.get("admissible_actions"), (list, tuple)) and len(info["admissible_actions"]) > 0
        if mode == "score" and not listed:
            raise ValueError("action_mode='score' needs info['admissible_actions'], which this step does not list; "
                             "use action_mode='auto' (scores where the env lists actions, generates elsewhere)")
        return mode == "score" or (mode == "auto" and listed)

    def score_tools(self, info: dict[str, Any]) -> list[str]:
        """Extra candidates offered beside the actions in score mode (a subclass's tools); none here."""
        return []

    async def on_score_tool(self, candidate: str, messages: list[Message], info: dict[str, Any]) -> list[Message]:
        """Run the tool a scored ``candidate`` from :meth:`score_tools` stands for; return the exchange to add."""
        raise NotImplementedError(candidate)

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng(self._params().seed)

    def _sample_scored(self, candidates: list[str], result: ScoreResult) -> ScoredTurn:
        """Sample one decision from ``softmax(scores / temperature)`` over ``candidates`` (mixed with uniform when
        exploring; the argmax at temperature 0), with the log-probs a trainer replays it from."""
        agent = self.agent
        scores = np.asarray(result.normalised(agent.score_norm), dtype=np.float64)
        behaviour = None
        if agent.temperature > 0:
            z = scores / agent.temperature
            probs = np.exp(z - z.max())
            probs /= probs.sum()
            behaviour = probs
            explore = agent.explore if self.ctx.explore is None else self.ctx.explore
            if explore > 0:  # RL exploration: sample from the policy mixed with uniform
                behaviour = (1 - explore) * probs + explore / len(probs)
            chosen = int(self._rng().choice(len(candidates), p=behaviour))
        else:
            probs = (scores == scores.max()).astype(np.float64)
            probs /= probs.sum()
            chosen = int(np.argmax(scores))
        return ScoredTurn(
            candidates=list(candidates), logprobs=[float(lp) for lp in scores], probs=[float(p) for p in probs],
            chosen=chosen,
            action_logprob=float(np.log(max(probs[chosen], 1e-300))),  # the policy's own (PPO's old log-prob)
            behaviour_logprob=float(np.log(max((probs if behaviour is None else behaviour)[chosen], 1e-300))),
            temperature=agent.temperature, score_norm=agent.score_norm, policy_version=result.policy_version,
            prompt_token_ids=result.prompt_token_ids, candidate_token_ids=result.candidate_token_ids,
        )

    async def _act_by_score(self, obs: str, info: dict[str, Any]) -> str:
        """Pick an action by a softmax over the admissible actions' log-probabilities as replies (GLAM).

        A subclass's tools (:meth:`score_tools`) are candidates beside the actions: a decision that picks
        one runs it (:meth:`on_score_tool`) and the policy scores again with its exchange in the prompt.
        Every decision is a :class:`ScoredTurn`: the one that picked the action is the turn's ``scored``,
        those that picked a tool before it its ``tool_choices`` (in order), so a trainer learns when a tool
        is worth calling as it learns the actions.
        """
        agent = self.agent
        actions = list(dict.fromkeys(a for a in info["admissible_actions"] if isinstance(a, str) and a.strip()))
        if not actions:
            raise ValueError(f"no usable admissible action to score in {info['admissible_actions']!r}")
        scratch: list[Message] = []
        tool_choices: list[ScoredTurn] = []  # decisions of this turn that chose a tool, each a trained turn too
        while True:
            tools = self.score_tools(info)
            candidates = actions + [t for t in tools if t not in actions]
            messages = self.build_messages(obs, info, scratch)
            result = await agent.llm.score_full(messages, candidates)
            self.llm_calls += 1
            self.tokens_in += len(result.prompt_token_ids) + sum(result.token_counts)
            scored = self._sample_scored(candidates, result)
            if scored.chosen < len(actions):
                break
            tool_choices.append(scored)
            self.tool_calls += 1
            scratch += await self.on_score_tool(candidates[scored.chosen], messages, info)
        action = actions[scored.chosen]
        hist_tokens = agent.llm.count_tokens(action) + 16
        if agent.history_style == "full":
            hist_tokens += agent.llm.count_tokens(obs)
        self.turns.append(Turn(obs, action, action, "score", messages, [], hist_tokens, scored=scored,
                               tool_choices=tool_choices))
        self._feedback = ""
        return action

    async def act(self, obs: str, info: dict[str, Any]) -> str:
        if self._system is None:
            self._system = await self.system_prompt(obs, info)
        if self.turns:
            self.turns[-1].valid = bool(info.get("valid_action", True))
        if self.scores_this_step(info):
            return await self._act_by_score(obs, info)
        scratch: list[Message] = []
        completions: list[Completion] = []
        while True:
            messages = self.build_messages(obs, info, scratch)
            completion = await self._complete(messages)
            completions.append(completion)
            parsed = self.parse_reply(completion.text, info)
            if parsed.tool is None or parsed.action is not None:
                break
            if self.tool_calls >= self.agent.max_tool_calls:
                result = "No tool calls left in this episode. Answer with <action>...</action> now."
                if len(completions) > self.agent.max_tool_calls + 1:
                    break
            else:
                self.tool_calls += 1
                result = await self.on_tool(parsed, info)
            scratch += [{"role": "assistant", "content": completion.text}, {"role": "user", "content": result}]
        reply = completion.text
        feedback = ""
        if parsed.action is None:
            self.parse_failures += 1
            action = reply.strip()
            feedback = prompts.TRUNCATED_FEEDBACK if completion.finish_reason == "length" else prompts.NO_TAG_FEEDBACK
        else:
            action = parsed.action
            if parsed.method == "tag" and "</action>" not in reply.lower():
                reply += "</action>"  # generation stopped at the tag: show the model well-formed history
        self._feedback = feedback
        hist_tokens = self.agent.llm.count_tokens(reply if self.agent.history_style == "full" else action) + 16
        if self.agent.history_style == "full":
            hist_tokens += self.agent.llm.count_tokens(obs)
        self.turns.append(Turn(obs, reply, action, parsed.method, messages, completions, hist_tokens))
        return action

    def turn_trace(self) -> dict[str, Any] | None:
        """The last turn as the trajectory records it (see :mod:`eval.trajectories` for the fields)."""
        if not self.turns:
            return None
        turn = self.turns[-1]
        trace: dict[str, Any] = {"messages": turn.messages, "reply": turn.reply, "method": turn.method}
        if turn.completions:
            last = turn.completions[-1]
            trace["policy_version"] = getattr(last, "policy_version", 0)
            trace["prompt_token_ids"] = last.prompt_token_ids or []
            trace["token_ids"] = last.token_ids
            trace["logprobs"] = last.logprobs
            if len(turn.completions) > 1:  # tool calls: every model call of the turn, in order
                trace["calls"] = [{"text": c.text, "prompt_token_ids": c.prompt_token_ids or [],
                                   "token_ids": c.token_ids, "logprobs": c.logprobs} for c in turn.completions]
        if turn.scored is not None:
            trace.update(turn.scored.trace())
        if turn.tool_choices:
            trace["tool_choices"] = [t.choice_trace() for t in turn.tool_choices]
        trace.update(turn.trace)
        return trace

    def scored_turn(self) -> ScoredTurn | None:
        return self.turns[-1].scored if self.turns else None

    def tool_choices(self) -> list[ScoredTurn]:
        return list(self.turns[-1].tool_choices) if self.turns else []

    def usage(self) -> dict[str, int]:
        return {
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "llm_calls": self.llm_calls,
            "parse_failures": self.parse_failures,
            "tool_calls": self.tool_calls,
        }


class LLMAgent(Agent):
    """A ReAct-style agent: one LLM call per step, one ``<action>`` per reply.

    Args:
        seed: mixed with the env id, episode seed and call index into each request's sampling seed.
        model: a local model directory or server model name (``None``: the packaged SmolLM2-135M).
        backend: ``"transformers"``, ``"openai"`` or ``"vllm"``.
        temperature: sampling temperature (0: greedy).
        top_p: nucleus sampling mass.
        max_tokens: cap on each reply.
        history: most past turns shown.
        history_tokens: token budget for those turns (oldest dropped first).
        history_style: ``"compact"`` (a past turn is its step number, validity and action) or ``"full"``
            (its whole observation and reply).
        action_mode: ``"auto"`` (score where the env lists admissible actions, generate elsewhere),
            ``"score"`` (always score; a step without a list is an error) or ``"generate"``.
        score_norm: ``"sum"`` (a candidate's total log-prob) or ``"mean"`` (per token) in score mode;
            ``temperature`` divides the scores before the softmax (0: argmax).
        explore: score mode, for RL rollouts: sample from ``(1 - explore) * softmax + explore * uniform``.
            The trace records the policy's own ``action_logprob`` (what PPO's ratio starts from: explored
            actions are trained on as the policy's, as with epsilon-greedy) and the mixture's
            ``behaviour_logprob``.
        max_tool_calls: tool calls allowed per episode (only used by subclasses with tools).
        llm: an already built backend (shared, not closed by :meth:`aclose`); overrides ``backend``/``model``.
        **backend_kwargs: passed to :func:`crl_agent.llm.make_llm` (e.g. ``base_url=``, ``device=``).
    """

    name = "llm"
    policy_class: type[LLMPolicy] = LLMPolicy

    def __init__(
        self,
        seed: int = 0,
        model: str | None = None,
        backend: str = "transformers",
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_tokens: int = 256,
        history: int = 30,
        history_tokens: int = 1500,
        history_style: str = "compact",
        action_mode: str = "auto",
        score_norm: str = "sum",
        explore: float = 0.0,
        max_tool_calls: int = 2,
        llm: LLM | None = None,
        **backend_kwargs: Any,
    ):
        if max_tokens < 1 or history < 0 or history_tokens < 0:
            raise ValueError("need max_tokens >= 1, history >= 0 and history_tokens >= 0")
        if action_mode not in ACTION_MODES:
            raise ValueError(f"action_mode must be one of {ACTION_MODES}, got {action_mode!r}")
        if score_norm not in ("sum", "mean"):
            raise ValueError(f"score_norm must be 'sum' or 'mean', got {score_norm!r}")
        if history_style not in ("compact", "full"):
            raise ValueError(f"history_style must be 'compact' or 'full', got {history_style!r}")
        if not 0.0 <= float(explore) <= 1.0:
            raise ValueError(f"explore must be in [0, 1], got {explore!r}")
        self.action_mode, self.score_norm, self.history_style = action_mode, score_norm, history_style
        self.explore = float(explore)
        self.seed = seed
        self.temperature, self.top_p, self.max_tokens = float(temperature), float(top_p), int(max_tokens)
        self.history, self.history_tokens, self.max_tool_calls = int(history), int(history_tokens), int(max_tool_calls)
        if llm is not None and backend_kwargs:
            raise ValueError(f"{', '.join(sorted(backend_kwargs))}: not an option of this agent, and backend options "
                             "apply only when the agent loads its own model (llm=None)")
        self._owns_llm = llm is None
        self.llm: LLM = llm if llm is not None else make_llm(backend, model, **backend_kwargs)

    def make_policy(self, ctx: EpisodeContext) -> LLMPolicy:
        return self.policy_class(self, ctx)

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "seed": self.seed,
            "llm": self.llm.config(),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "history": self.history,
            "history_tokens": self.history_tokens,
            "history_style": self.history_style,
            "action_mode": self.action_mode,
            "score_norm": self.score_norm,
            "explore": self.explore,
        }

    async def aclose(self) -> None:
        if self._owns_llm:
            await self.llm.aclose()
