"""``crl``: the reference Complementary RL agent at evaluation time.

It is the ``llm`` agent (:mod:`crl_agent.agents.llm`) plus an experience bank:

- **Episode start**: the policy retrieves ``k`` diversified entries for the task (query: the goal
  text, restricted to the episode's env id) and appends them to the system prompt.
- **Search-and-ask**: mid-episode the model may write ``<search>question</search>`` instead of an
  action, at most ``max_tool_calls`` (2) times per episode. The manager retrieves entries and the
  extractor answers from them; the answer comes back as the next user message, the env is not
  stepped, and the model then acts in the same turn. In score mode ``<search>`` is one more scored
  candidate; a decision that picks it is recorded as a :class:`~crl_agent.episode.ScoredTurn` on
  ``Step.tool_choices``, so the trainer learns when searching pays (the question the model then writes
  is generated, and not trained).
- **Episode end**: the trajectory is queued for distillation (the actor never waits) and the
  outcome (±1) is credited to the extractor calls whose entries or answers guided it.

Options (``python -m eval.run --agent crl --experience off --bank runs/bank --extractor-model DIR``):

- ``experience``: ``"on"`` (default) or ``"off"``: evaluate without experience, as in the paper's
  "w/o experience" column (no bank is opened, no tool is offered, nothing is distilled).
- ``bank``: the bank folder to persist and reuse across runs (default: ``<run_dir>/experience_bank``,
  or a temporary folder removed at the end when there is no run directory).
- ``extractor_model``: a separate extractor model (default: the actor's own loaded model).
- ``embedder``: ``"minilm"`` (default), ``"hash"`` or any sentence-transformers model path/name.
- ``sync_experience``: wait for queued distillations before each episode's retrieval (reproducible
  runs; default off, as in training where the actor never waits).

Each episode's record gets ``extra`` fields ``search_time_s``, ``searches``, ``experience_shown``
and ``bank_entries``; ``summary.json`` averages them per task.
"""

from __future__ import annotations

import math
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from crl_agent.agents.llm import LLMAgent, LLMPolicy, ParsedReply
from crl_agent.episode import Episode, EpisodeContext
from crl_agent.experience import ExperienceBank, ExperienceEntry, ExperienceManager, ManagerConfig, Trajectory
from crl_agent.experience.retrieval import DiversityConfig
from crl_agent.llm import LLM, Message, SamplingParams, make_llm
from crl_agent.llm.base import ScoringUnsupported

_POLICY_OPTIONS = ("temperature", "top_p", "max_tokens", "history", "history_tokens", "history_style", "action_mode",
                   "score_norm", "explore")
_SEARCH_RE = re.compile(r"<search>(.*?)(?:</search>|\Z)", re.DOTALL | re.IGNORECASE)
_ACTION_OPEN_RE = re.compile(r"<action>", re.IGNORECASE)

EXPERIENCE_HEADER = "Lessons from past episodes of this task (apply them when they fit the situation):"
SEARCH_CANDIDATE = "<search>"
CRITIQUE_PROMPT = (
    "Task: {goal}\n\nA lesson from past episodes:\n{lesson}\n\n"
    "Will this lesson help with this task? Answer yes or no."
)
SEARCH_QUESTION = "Write your question for the experience bank in one short sentence, and nothing else."
SEARCH_HELP = (
    "If you are unsure what to do, you may ask the experience bank instead of acting, at most {n} times per "
    "episode: write <search>your question</search> and nothing else. The answer comes back before you act."
)


def _as_bool(name: str, value: Any) -> bool:
    """A flag from Python or from ``--agent-arg name=VALUE`` (where ``False`` arrives as a string)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return text in ("true", "1", "yes", "on")
    return bool(value)


def experience_block(entries: list[ExperienceEntry]) -> str:
    """Entries as the actor sees them in its system prompt."""
    return "\n".join([EXPERIENCE_HEADER, *(f"- {e.title}: {e.content}" for e in entries)])


class CRLPolicy(LLMPolicy):
    """One episode of the ``crl`` agent: retrieval at the start, the search tool, a trajectory to distil."""

    agent: CRLAgent

    def __init__(self, agent: CRLAgent, ctx: EpisodeContext):
        super().__init__(agent, ctx)
        self.goal = ""
        self.shown: list[ExperienceEntry] = []
        self.searched: list[ExperienceEntry] = []
        self.ask_calls: list[str] = []
        self.search_s = 0.0
        self.search_log: list[dict[str, str]] = []  # this turn's searches, for its trace
        self.critique_log: list[dict[str, Any]] = []  # the actor's verdict on each retrieved entry

    @property
    def recording(self) -> bool:
        """Whether this episode's searches count as the bank's usage (not a held-out episode: its searches
        and answers leave retrieval counts, recency, the dropout RNG and the call log as they were)."""
        return self.agent.learning and self.ctx.learning

    async def system_prompt(self, obs: str, info: dict[str, Any]) -> str:
        base = await super().system_prompt(obs, info)
        self.goal = str(info.get("task") or "")
        manager = self.agent.manager
        if manager is None or not self.ctx.with_experience:
            return base
        if self.agent.sync_experience and not manager.extractor_paused:  # paused: the trainer's update runs
            await manager.flush()
        t0 = time.perf_counter()
        self.shown = await manager.search(self.goal or obs[:500], k=self.agent.k, task=self.ctx.env_id,
                                          record=self.recording)
        self.search_s += time.perf_counter() - t0
        if self.agent.critique and self.shown:
            self.shown = await self.critique(self.shown, self.goal or obs[:500])
        parts = [base]
        if self.shown:
            parts.append(experience_block(self.shown))
        if self.agent.max_tool_calls > 0 and self.agent.bank is not None and self.agent.bank.ids(self.ctx.env_id):
            parts.append(SEARCH_HELP.format(n=self.agent.max_tool_calls))
        return "\n\n".join(parts)

    async def critique(self, entries: list[ExperienceEntry], goal: str) -> list[ExperienceEntry]:
        """The actor accepts or rejects each retrieved entry before the episode (the official code's
        actor-side critique): it scores ``yes``/``no`` to "will this lesson help?" where the backend can
        score, else answers in a few tokens. Rejected entries are neither shown nor credited."""
        kept = []
        for e in entries:
            messages = [{"role": "user", "content": CRITIQUE_PROMPT.format(goal=goal, lesson=f"{e.title}: {e.content}")}]
            try:
                res = await self.agent.llm.score_full(messages, ["yes", "no"])
                p_yes = 1.0 / (1.0 + math.exp(res.logprobs[1] - res.logprobs[0]))
            except ScoringUnsupported:
                reply = await self.agent.llm.chat(messages, SamplingParams(max_tokens=4, temperature=0.0))
                p_yes = 1.0 if reply.text.strip().lower().startswith("yes") else 0.0
            self.critique_log.append({"id": e.id, "title": e.title, "p_yes": round(p_yes, 4), "kept": p_yes >= 0.5})
            if p_yes >= 0.5:
                kept.append(e)
        return kept

    def stop_strings(self) -> tuple[str, ...]:
        base = super().stop_strings()
        return (*base, "</search>") if self.agent.manager is not None and self.ctx.with_experience else base

    def parse_reply(self, text: str, info: dict[str, Any]) -> ParsedReply:
        parsed = super().parse_reply(text, info)
        if self.agent.manager is None or not self.ctx.with_experience:
            return parsed
        m = _SEARCH_RE.search(text)
        action_tag = _ACTION_OPEN_RE.search(text)
        if m and (action_tag is None or action_tag.start() > m.start()):
            return ParsedReply(None, "none", tool="search", argument=m.group(1).strip())
        return parsed

    async def on_tool(self, reply: ParsedReply, info: dict[str, Any]) -> str:
        if reply.tool != "search" or self.agent.manager is None:
            return await super().on_tool(reply, info)
        question = reply.argument[:500] or self.goal
        res = await self.agent.manager.ask(question, task=self.ctx.env_id, record=self.recording)
        self.search_s += res.seconds
        self.searched.extend(e for e in res.entries if e.id not in {s.id for s in self.searched})
        if res.call_id:
            self.ask_calls.append(res.call_id)
        self.search_log.append({"question": question, "answer": res.answer})
        return (
            f"Search result (advice from past experience; the environment has not changed): {res.answer}\n"
            "Now answer with your next action inside <action>...</action>."
        )

    def score_tools(self, info: dict[str, Any]) -> list[str]:
        """In score mode, searching is one more candidate while searches are left and the bank knows the task."""
        if (self.agent.manager is None or self.agent.bank is None or not self.ctx.with_experience
                or self.tool_calls >= self.agent.max_tool_calls or not self.agent.bank.ids(self.ctx.env_id)):
            return []
        return [SEARCH_CANDIDATE]

    async def on_score_tool(self, candidate: str, messages: list[Message], info: dict[str, Any]) -> list[Message]:
        """The model chose to search: it writes its question, the bank answers, and it scores again."""
        params = replace(self._params(), max_tokens=48, stop=("\n",))
        completion = await self._complete([*messages, {"role": "user", "content": SEARCH_QUESTION}], params)
        question = completion.text.strip()[:500] or self.goal
        answer = await self.on_tool(ParsedReply(None, "none", tool="search", argument=question), info)
        return [{"role": "assistant", "content": f"<search>{question}</search>"}, {"role": "user", "content": answer}]

    def turn_trace(self) -> dict[str, Any] | None:
        trace = super().turn_trace()
        if trace is None:
            return None
        if len(self.turns) == 1 and self.shown:
            trace["experience_shown"] = [{"id": e.id, "title": e.title, "content": e.content} for e in self.shown]
        if len(self.turns) == 1 and self.critique_log:
            trace["critique"] = self.critique_log
        if self.search_log:
            trace["searches"], self.search_log = self.search_log, []
        return trace

    def guided_by(self) -> list[ExperienceEntry]:
        """Every entry this episode saw (at the start or through search), once."""
        seen: dict[int, ExperienceEntry] = {}
        for e in [*self.shown, *self.searched]:
            seen.setdefault(e.id, e)
        return list(seen.values())


@dataclass
class EpisodeCredit:
    """What a finished training episode gives the experience side: the outcome credited to the entries
    (and search answers) that guided it, and the trajectory to distil (``None``: not distilled)."""

    key: str
    guided: list[ExperienceEntry]
    success: bool
    ask_calls: list[str]
    trajectory: Trajectory | None


@dataclass
class CRLOptions:
    """The ``crl`` agent's own options (the ``llm`` agent's go to :class:`~crl_agent.agents.llm.LLMAgent`).

    Attributes:
        experience: ``"on"`` or ``"off"`` (see the module docstring).
        bank: bank folder to persist and reuse.
        extractor_model: extractor model (default: share the actor's loaded model).
        extractor_backend: its backend (default: the actor's ``backend``).
        extractor_adapter: a LoRA adapter folder for the extractor (e.g. ``<train run>/adapters/extractor``);
            the extractor then loads its own copy of ``extractor_model`` (default: the actor's model)
            with it, instead of sharing the actor's weights (and the actor's ``adapter``).
        embedder: bank embedder spec (``"minilm"``, ``"hash"``, a sentence-transformers model).
        k: entries shown at the start of an episode.
        max_tool_calls: searches allowed per episode.
        sync_experience: flush pending distillations before each episode's retrieval.
        critique: before each episode the actor accepts or rejects each retrieved entry (the official
            code's actor-side critique); rejected entries are not shown (off by default).
        learning: distil finished episodes and credit the entries that guided them (default); an
            episode whose ``EpisodeContext.learning`` is False (a trainer's held-out seeds) is never
            learned from either.
        manager_config: extra :class:`~crl_agent.experience.ManagerConfig` fields, e.g. ``{"merge_every": 10}``.
    """

    experience: str = "on"
    bank: str | None = None
    extractor_model: str | None = None
    extractor_backend: str | None = None
    extractor_adapter: str | None = None
    embedder: str = "minilm"
    k: int = 4
    max_tool_calls: int = 2
    sync_experience: bool = False
    critique: bool = False
    learning: bool = True
    manager_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.experience not in ("on", "off"):
            raise ValueError(f"experience must be 'on' or 'off', got {self.experience!r}")
        self.k = int(self.k)
        self.sync_experience = _as_bool("sync_experience", self.sync_experience)
        self.learning, self.critique = _as_bool("learning", self.learning), _as_bool("critique", self.critique)


class CRLAgent(LLMAgent):
    """The ``llm`` agent with an experience bank, search-and-ask, and background distillation.

    Args:
        seed, model, backend, temperature, top_p, max_tokens, history, history_tokens, llm,
            **backend_kwargs: as for :class:`~crl_agent.agents.llm.LLMAgent`.
        options: the crl agent's own options (:class:`CRLOptions`); each of its fields may also be passed
            as a keyword (``experience="off"``, ``bank=...``: what ``eval.run``'s flags and ``--agent-arg``
            do), which overrides it.
        extractor: an already built extractor backend (not closed here); overrides ``extractor_model``.
        run_dir: the eval run directory (the harness passes it): default bank and call-log location.
    """

    name = "crl"
    policy_class = CRLPolicy
    options_class = CRLOptions  # eval.run: its fields are constructor options too

    def __init__(
        self,
        seed: int = 0,
        model: str | None = None,
        backend: str = "transformers",
        options: CRLOptions | None = None,
        *,
        extractor: LLM | None = None,
        run_dir: str | None = None,
        llm: LLM | None = None,
        **kwargs: Any,
    ):
        own = {f.name for f in fields(CRLOptions)}
        opts = replace(options or CRLOptions(), **{k: kwargs.pop(k) for k in list(kwargs) if k in own})
        self.options = opts
        self.experience, self.k = opts.experience, opts.k
        self.sync_experience, self.learning, self.critique = opts.sync_experience, opts.learning, opts.critique
        self.extractor_model, self.embedder_spec = opts.extractor_model, opts.embedder
        self.extractor_adapter = opts.extractor_adapter
        self.bank: ExperienceBank | None = None
        self.manager: ExperienceManager | None = None
        self.extractor: LLM | None = None
        self._owns_extractor = False
        self._temp_bank: str | None = None
        self._policies: dict[int, tuple[EpisodeContext, CRLPolicy]] = {}
        self._final: dict[str, Any] = {}
        self.bank_path: Path | None = None
        # a trainer's ranks other than 0 set a list here: finished episodes' credit and trajectories go
        # to it, and rank 0's agent takes them (`credit(..., remote=True)`), instead of this manager
        self.outbox: list[EpisodeCredit] | None = None
        if opts.experience == "on":
            if opts.bank is not None:
                self.bank_path = Path(opts.bank)
            elif run_dir is not None:
                self.bank_path = Path(run_dir) / "experience_bank"
            else:
                self._temp_bank = tempfile.mkdtemp(prefix="crl-bank-")
                self.bank_path = Path(self._temp_bank)
            # Opened before any model loads: a bank that is locked by another run or corrupt fails in seconds.
            self.bank = ExperienceBank(self.bank_path, embedder=opts.embedder)
        try:
            super().__init__(seed=seed, model=model, backend=backend, max_tool_calls=opts.max_tool_calls, llm=llm,
                             **kwargs)
            if self.bank is not None:
                extractor_model = opts.extractor_model
                if extractor is None and opts.extractor_adapter is not None and extractor_model is None:
                    extractor_model = model if model is not None else self.llm.config().get("model_path")
                self._start_experience(extractor, extractor_model, opts.extractor_backend, backend, kwargs,
                                       opts.manager_config, seed, run_dir)
        except BaseException:
            self._release_bank()
            raise

    def _start_experience(
        self,
        extractor: LLM | None,
        extractor_model: str | None,
        extractor_backend: str | None,
        backend: str,
        kwargs: dict[str, Any],
        manager_config: dict[str, Any] | None,
        seed: int,
        run_dir: str | None,
    ) -> None:
        assert self.bank is not None and self.bank_path is not None
        if extractor is not None:
            self.extractor = extractor
        elif extractor_model is not None:
            ext_backend = extractor_backend or backend
            same = {k: v for k, v in kwargs.items() if k not in (*_POLICY_OPTIONS, "adapter")} \
                if ext_backend == backend else {}
            if self.extractor_adapter is not None:
                same["adapter"] = self.extractor_adapter
            self.extractor = make_llm(ext_backend, extractor_model, **same)  # e.g. the same base_url
            self._owns_extractor = True
        else:
            self.extractor = self.llm  # one loaded model plays both roles
        cfg = dict(manager_config or {})
        if isinstance(cfg.get("diversity"), dict):
            cfg["diversity"] = DiversityConfig(**cfg["diversity"])
        for key in ("distil_params", "merge_params", "answer_params"):  # e.g. from --agent-arg manager_config={...}
            if isinstance(cfg.get(key), dict):
                cfg[key] = SamplingParams(**cfg[key])
        log_dir = Path(run_dir) if run_dir is not None else self.bank_path
        self.manager = ExperienceManager(
            self.bank, self.extractor, ManagerConfig(k=self.k, seed=seed, **cfg), log_path=log_dir / "extractor_calls.jsonl"
        )

    def _release_bank(self) -> None:
        if self.bank is not None and not self.bank.closed:
            self.bank.close()
        if self._temp_bank is not None:
            shutil.rmtree(self._temp_bank, ignore_errors=True)

    def make_policy(self, ctx: EpisodeContext) -> CRLPolicy:
        policy = super().make_policy(ctx)
        assert isinstance(policy, CRLPolicy)
        self._policies[id(ctx)] = (ctx, policy)
        return policy

    def on_episode_end(self, ctx: EpisodeContext, episode: Episode) -> None:
        _, policy = self._policies.pop(id(ctx), (None, None))
        if policy is None:
            return
        episode.extra.update(search_time_s=policy.search_s, searches=policy.tool_calls,
                             experience_shown=len(policy.shown))
        if self.manager is None or self.bank is None:
            return
        episode.extra["bank_entries"] = len(self.bank)
        if episode.error is not None or not (self.learning and ctx.learning):
            # an env crash or timeout says nothing about the experience; a frozen bank (or a held-out
            # episode) teaches nothing
            return
        key = episode.key
        guided = policy.guided_by()
        traj = Trajectory(id=f"{key}@{self.manager.run_tag}", task=ctx.env_id, goal=policy.goal or episode.task,
                          steps=[(s.observation, s.action) for s in episode.steps], success=episode.success,
                          progress=episode.progress, retrieved=guided, final_observation=episode.final_observation)
        credit = EpisodeCredit(key, guided, episode.success, list(policy.ask_calls), traj if ctx.distil else None)
        if self.outbox is not None:
            self.outbox.append(credit)  # another process's manager credits and distils it (see `credit`)
        else:
            self.credit(credit)

    def credit(self, credit: EpisodeCredit, remote: bool = False) -> None:
        """Credit an episode's outcome to the calls that guided it and queue its trajectory for distillation.

        ``remote``: the episode was played by another process from a copy of this bank (a trainer's
        other ranks), so the retrievals it made are recorded here too; entries gone since are skipped.
        """
        if self.manager is None or self.bank is None:
            raise RuntimeError("credit: this agent has no experience manager (experience is off)")
        if remote:
            self.bank.record_retrieval([e.id for e in credit.guided if e.id in self.bank])
        self.manager.record_outcome(credit.key, credit.guided, credit.success, credit.ask_calls)
        if credit.trajectory is not None:
            self.manager.submit(credit.trajectory)

    async def load_bank_snapshot(self, source: str | Path) -> None:
        """Search a fresh copy of the bank folder ``source`` from now on (a trainer's ranks other than 0,
        before each rollout: rank 0 owns the bank, and has flushed and saved it). This agent's own bank
        folder is replaced by the copy; its embedder and the manager's settings and RNG are kept."""
        if self.manager is None or self.bank is None or self.bank_path is None:
            raise RuntimeError("load_bank_snapshot: this agent has no experience bank (experience is off)")
        source = Path(source)
        if source.resolve() == self.bank_path.resolve():
            raise ValueError(f"load_bank_snapshot: {source} is this agent's own bank")
        old = self.bank
        old.close()
        shutil.rmtree(self.bank_path, ignore_errors=True)
        shutil.copytree(source, self.bank_path, ignore=shutil.ignore_patterns(".lock"))
        self.bank = ExperienceBank(self.bank_path, embedder=old.embedder)
        await self.manager.replace_bank(self.bank)

    def config(self) -> dict[str, Any]:
        out = {
            **super().config(),
            "experience": self.experience,
            "bank": str(self.bank_path) if self.bank_path is not None and self._temp_bank is None else None,
            "extractor_model": self.extractor_model,
            "extractor_adapter": self.extractor_adapter,
            "extractor": "actor" if self.extractor is self.llm else (self.extractor.config() if self.extractor else None),
            "embedder": self.embedder_spec if self.experience == "on" else None,
            "k": self.k,
            "max_tool_calls": self.max_tool_calls,
            "sync_experience": self.sync_experience,
            "learning": self.learning,
            "critique": self.critique,
        }
        if self.manager is not None:
            out["manager"] = {k: v for k, v in self.manager.config_dict().items() if k not in ("bank", "extractor")}
            out["experience_stats"] = {**self.manager.stats, **self._final}
        return out

    async def aclose(self) -> None:
        """Finish queued distillations, save and close the bank, release the models."""
        try:
            if self.manager is not None:
                pending = self.manager.pending
                if pending:  # can take minutes with a small CPU model: say so, not look hung
                    print(f"crl: finishing {pending} queued distillation(s) into the experience bank ...",
                          file=sys.stderr, flush=True)
                await self.manager.aclose()
            if self.bank is not None and not self.bank.closed:
                self._final = {"bank_entries": len(self.bank), "bank_tasks": self.bank.tasks()}
            if self._owns_extractor and self.extractor is not None:
                await self.extractor.aclose()
        finally:
            self._release_bank()  # saved and unlocked even if a distillation or the extractor failed
            await super().aclose()
