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
   (``EpisodeContext.with_experience``). Every episode of the step searches the bank flushed in 1: the
   step's distillations run meanwhile, but their writes wait until the rollouts end.
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

This module is the loop and its steps; the options and the command line are
:mod:`crl_agent.train_config`, setting a run up and resuming it :mod:`crl_agent.train_setup`, and what a
run reports (metrics rows, TensorBoard scalars, the curve) :mod:`crl_agent.train_report`.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from crl_agent.memory import memory_row, release_free_heap
from crl_agent.rl.batches import extractor_samples, turn_samples
from crl_agent.rollout import play
from crl_agent.train_config import (  # noqa: F401 - re-exported: crl_agent.train is where callers import them
    BACKENDS,
    ENV_BACKENDS,
    EXPERIENCE_MODES,
    MODES,
    RESUMABLE_CHANGES,
    TRAINER_AGENT_ARGS,
    ConfigError,
    TrainConfig,
    build_parser,
    eval_command,
    manager_settings,
)
from crl_agent.train_report import Scalars, append_jsonl, experience_metrics, plot_curve, rollout_stats, rollout_tokens
from crl_agent.train_setup import (  # noqa: F401 - build and RunSetup re-exported
    RunSetup,
    build,
    build_run,
    call_log_offset,
    check_world,
    one_bank_snapshot,
    open_env_pool,
    prepare_run_folder,
    restore_run,
    share_episodes_with_rank0,
    sync_bank,
)

log = logging.getLogger(__name__)


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
            t0, times = time.perf_counter(), StepTimes()
            with times("bank_s"):
                merged = await bank_upkeep(cfg, setup, step, out, dist)                              # 1.
            with times("extractor_wait_s"):
                extractor_update, buffer_row = await start_extractor_update(cfg, setup, step, dist)  # 2.
            with times("rollout_s"), one_bank_snapshot(setup.manager):  # writes land after the rollouts
                batch = await rollout(cfg, pool, setup.agent, step, dist)                            # 3.
            advantages = group_advantages(cfg, batch)                                                # 4.
            actor = await actor_update(cfg, setup, batch, advantages, step, dist, times)             # 5.
            with times("extractor_wait_s"):
                extractor_row = await extractor_update.join(step) if extractor_update is not None else buffer_row  # 6.
            row = step_metrics(cfg, setup, step, batch, actor, times, extractor_row, merged, dist)   # 7.
            row["time_s"] = time.perf_counter() - t0
            row.update(memory_row())  # resident memory after the step, and the run's peak so far
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


async def start_extractor_update(cfg: TrainConfig, setup: RunSetup, step: int,
                                 dist) -> tuple[ExtractorUpdate | None, dict[str, float]]:
    """2. On rank 0 in crl mode after ``--extractor-warmup`` steps, once the training buffer holds
    ``--extractor-batch`` calls ready to train (``--extractor-buffer`` bounds it: the older ones are dropped)
    with two different rewards among them (:func:`~crl_agent.rl.batches.extractor_samples`): launch one CISPO
    step on them, beside this step's rollouts. The bank is fenced meanwhile (the manager holds distillations
    and merges, which then run on the new weights). ``--extractor-async 0`` waits for it here instead.
    Returns the update (``None``: nothing to train) and what the step's row records of the buffer now:
    ``extractor/dropped``, and ``extractor/alike`` (1: enough calls were ready, but all had earned the same
    reward, so they wait for evidence that tells them apart)."""
    if setup.extractor_learner is None or not dist.main or step < cfg.extractor_warmup:  # static: frozen
        return None, {}
    samples, used, dropped, alike = extractor_samples(setup.manager, step, cfg.cooldown, cfg.extractor_batch,
                                                      cfg.extractor_buffer)
    setup.manager.drop_from_buffer(dropped, step)
    row = {"extractor/dropped": len(dropped), "extractor/alike": int(alike)}
    if not samples:
        if alike:
            log.info("step %d: the extractor's ready calls all earned the same reward; they wait for more", step)
        return None, row
    setup.manager.pause_extractor()
    job = ExtractorUpdate(asyncio.create_task(update(setup.extractor_sync, setup.extractor_learner, samples)),
                          used, setup.manager, row=row)
    if not cfg.extractor_async:
        await job.join(step)
    return job, row


async def rollout(cfg: TrainConfig, pool, agent, step: int, dist) -> Rollouts:
    """3. Play this rank's share of the step's groups (``--groups`` seeds x ``--group-size`` rollouts; crl and
    static: the first K/2 of each group without experience); with ``--dynamic-sampling N`` (DAPO, per
    half: advantages are normalised within each (group, with/without experience) half, so a half is what
    has or lacks signal), while fewer halves than were scheduled have mixed outcomes, play fresh groups (at
    most N more) and keep for the update only the halves with mixed outcomes: an all-alike half has zero
    advantages and would only dilute the per-episode weighting. Under torchrun the other ranks' finished
    episodes then reach rank 0's experience manager."""
    tasks, half = cfg.task_ids, cfg.group_size // 2
    halves_per_group = 2 if cfg.experience else 1

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
    signal = scheduled_signal = informative_halves(ctxs, episodes)
    wanted = len(mine) * halves_per_group
    first = next_g = cfg.groups + dist.rank * cfg.dynamic_sampling
    while len(signal) < wanted and next_g < first + cfg.dynamic_sampling:
        missing_groups = -(-(wanted - len(signal)) // halves_per_group)
        more = range(next_g, min(next_g + missing_groups, first + cfg.dynamic_sampling))
        next_g = more.stop
        extra = contexts(more, distil_choice(cfg, random.Random(cfg.seed * 7_919 + step * 1_000_003 + more.start),
                                             more))
        ctxs += extra
        episodes += await play(pool, agent, extra)
        signal = informative_halves(ctxs, episodes)
    played = len(ctxs)
    if cfg.dynamic_sampling:  # DAPO's filter: a half whose outcomes are all alike has nothing to teach
        keep = [i for i, c in enumerate(ctxs) if (c.episode_index, c.with_experience) in signal]
        ctxs, episodes = [ctxs[i] for i in keep], [episodes[i] for i in keep]
    kept_halves = {(c.episode_index, c.with_experience) for c in ctxs}
    share_episodes_with_rank0(agent, dist)
    return Rollouts(ctxs, episodes, scheduled=scheduled, played=played, extra_groups=next_g - first,
                    signal_groups=len({g for g, _ in scheduled_signal}) / max(1, len(mine)),
                    signal_scheduled=len(scheduled_signal) / max(1, wanted),
                    signal_batch=len(signal & kept_halves) / max(1, len(kept_halves)))


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
                       dist, times: StepTimes) -> ActorStep:
    """5. The scored turns become :class:`~crl_agent.rl.TurnSample` s (:func:`~crl_agent.rl.turn_samples`:
    the loss weighting), the learner takes ``--ppo-epochs`` PPO-clip steps on them, and the backend serves
    the new weights (``setup.actor_sync``). Every ``--diagnose-every`` steps the divergence diagnostics
    run first (``diagnose_s``, timed apart from ``actor_update_s``)."""
    rng = random.Random(cfg.seed * 1_000_003 + step + 104_729 * dist.rank)
    actor = turn_samples([e for _, e in batch.learn], advantages, cfg.turn_weight, cfg.turns_per_episode, rng)
    diagnose = cfg.diagnose_every > 0 and (step + 1) % cfg.diagnose_every == 0
    with times("actor_update_s"):
        metrics = await update(setup.actor_sync, setup.learner, actor.samples, cfg.ppo_epochs,
                               weight=actor.loss_weight, diagnose=diagnose)
    times.move("actor_update_s", "diagnose_s", metrics.pop("diagnose_s", 0.0))
    return ActorStep(len(actor.samples), metrics)


def step_metrics(cfg: TrainConfig, setup: RunSetup, step: int, batch: Rollouts, actor: ActorStep, times: StepTimes,
                 extractor_row: dict[str, float], merged: dict[str, Any], dist) -> dict[str, Any]:
    """7. The step's ``metrics.jsonl`` row, over every rank's episodes: success over the scheduled groups (as
    sampled, before dynamic sampling adds or drops any), rollout statistics, the actor's and extractor's
    update metrics, and on rank 0 the experience side (extractor validity, bank size, meta-reward)."""
    played, played_eps = batch.scheduled
    kept = batch.learn
    local = {"rewards": [(c.env_id, c.with_experience, float(e.success))
                         for c, e in zip(played, played_eps, strict=True) if e.error is None],
             "episodes": len(played_eps), "tokens": rollout_tokens(played_eps), "samples": actor.samples,
             "played": batch.played, "kept": len(kept), "kept_with_experience": sum(c.with_experience for c, _ in kept),
             "stats": rollout_stats([e for e in played_eps if e.error is None]),
             "signal": (batch.signal_groups, batch.signal_scheduled, batch.signal_batch, batch.extra_groups)}
    parts = dist.gather(local)
    every = [x for p in parts for x in p["rewards"]]
    n_episodes = sum(p["episodes"] for p in parts)
    tokens = sum(p["tokens"] for p in parts)
    # each part of the step timed on its own (rank 0's clock; time_s is the whole step)
    row = {"step": step + 1, "time_s": 0.0, **times.row(),
           "rollout_tokens": tokens, "rollout_tokens_per_s": tokens / max(times["rollout_s"], 1e-9),
           "samples": sum(p["samples"] for p in parts), "episodes": n_episodes,
           # every episode the step played (dynamic sampling's extra groups too), the informative ones kept for
           # the update, and the share of those that played with experience
           "episodes_played": sum(p["played"] for p in parts),
           "episodes_kept": sum(p["kept"] for p in parts),
           "kept_with_experience": sum(p["kept_with_experience"] for p in parts) / max(1, sum(p["kept"] for p in parts)),
           "errored": n_episodes - len(every),
           "train_success": sum(r for *_, r in every) / max(1, len(every)),
           # the share of scheduled groups with mixed outcomes in either half, and of (group, with/without
           # experience) halves, whose advantages are not all zero: scheduled, and in the batch learned from
           "signal_groups": sum(p["signal"][0] for p in parts) / len(parts),
           "signal_halves": sum(p["signal"][1] for p in parts) / len(parts),
           "signal_halves_batch": sum(p["signal"][2] for p in parts) / len(parts),
           "extra_groups": sum(p["signal"][3] for p in parts),
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
        row.update(extractor_schedule(cfg, setup, step + 1))
    return row


def extractor_schedule(cfg: TrainConfig, setup: RunSetup, step: int) -> dict[str, Any]:
    """Where the extractor's training stands after a step (rank 0, crl and static): its updates so far
    (static: always 0), the training buffer (calls with outcomes no update has trained on) and how many of
    them the next step's update could take (their count-aware weight above 0), so a run whose extractor
    never trains shows it; and the search-and-ask answers so far with their mean meta-reward."""
    from crl_agent.experience.calllog import training_buffer
    from crl_agent.rl.batches import trainable_call

    calls = setup.manager.training_samples(step, cfg.cooldown)
    queued = training_buffer(calls)
    answers = [s.reward for s in calls if s.kind == "answer"]
    rewarded = [r for r in answers if r is not None]
    row = {"extractor/updates": setup.extractor_learner.version if setup.extractor_learner is not None else 0,
           "extractor/buffer": len(queued), "extractor/buffer_trainable": sum(map(trainable_call, queued)),
           "extractor/answer_calls": len(answers), "extractor/answer_rewarded": len(rewarded)}
    if rewarded:
        row["extractor/answer_meta_reward"] = sum(rewarded) / len(rewarded)
    return row


async def held_out_evaluation(cfg: TrainConfig, pool, setup: RunSetup, out: Path, step: int,
                              evals: list[dict[str, Any]], scalars: Scalars | None, dist,
                              clock: TrainClock | None = None) -> None:
    """8a. Play the held-out seeds with the pure policy (:func:`evaluate`) on a bank that holds every entry
    of the steps before, append the row to ``evals`` (and ``evals.jsonl``); its time is not training time."""
    t0 = time.perf_counter()
    await sync_bank(setup.agent, out, dist)
    evals.append(await evaluate(cfg, pool, setup.agent, step, dist, record=out))
    release_free_heap()  # the evaluation's freed forwards: back to the OS, so memory stays flat after it
    evals[-1].update(memory_row())
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
        played: every episode the step played on this rank (the scheduled and dynamic sampling's extra).
        extra_groups: groups dynamic sampling added.
        signal_groups: the share of the scheduled groups with mixed outcomes in either half.
        signal_scheduled, signal_batch: the share of (group, with/without experience) halves with mixed
            outcomes among the scheduled, and in the batch kept.
    """

    contexts: list[EpisodeContext]
    episodes: list[Episode]
    scheduled: tuple[list[EpisodeContext], list[Episode]]
    played: int = 0
    extra_groups: int = 0
    signal_groups: float = 0.0
    signal_scheduled: float = 0.0
    signal_batch: float = 0.0

    @property
    def learn(self) -> list[tuple[EpisodeContext, Episode]]:
        """The episodes that did not error, with their contexts (an errored one says nothing of the policy)."""
        return [(c, e) for c, e in zip(self.contexts, self.episodes, strict=True) if e.error is None]


@dataclass
class ActorStep:
    """What the actor update did: its samples and the learner's metrics."""

    samples: int
    metrics: dict[str, float]


class StepTimes(dict):
    """Seconds each part of a step took, by ``metrics.jsonl`` key: ``with times("rollout_s"): ...`` adds the
    block's wall time to its key (a part timed twice, as the extractor wait before and after the
    rollouts, adds up)."""

    KEYS = ("bank_s", "extractor_wait_s", "rollout_s", "actor_update_s", "diagnose_s")

    @contextlib.contextmanager
    def __call__(self, key: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self[key] = self.get(key, 0.0) + time.perf_counter() - t0

    def move(self, source: str, target: str, seconds: float) -> None:
        """Count ``seconds`` of ``source``'s time as ``target``'s (a part measured inside another)."""
        self[source] = self.get(source, 0.0) - seconds
        self[target] = self.get(target, 0.0) + seconds

    def row(self) -> dict[str, float]:
        return {k: self.get(k, 0.0) for k in self.KEYS}


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
        self.row = {**self.row, **{f"extractor/{k}": v for k, v in metrics.items()},
                    "extractor/reward": sum(s.new_reward for s in self.used) / len(self.used),
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


# ---------------------------------------------------------------------------------------- the step's helpers


async def update(sync, learner, samples, epochs: int = 1, weight: float | None = None,
                 diagnose: bool = False) -> dict[str, float]:
    """``epochs`` learner updates on ``samples``, run and published by ``sync`` (a
    :mod:`crl_agent.rl.weight_sync` object: the shared weights change on the backend's thread between
    batches, or the exported adapter is loaded), so the next samples carry the learner's version.

    After the first epoch the samples are older than the learner by design: their recorded log-probs are
    PPO's old policy, so the ratio moves away from 1 and the clip engages; ``stale`` reports the first
    epoch's count. ``diagnose`` adds :meth:`PolicyLearner.divergence` of the samples before the update
    (``kl_ref``...) and the seconds it took (``diagnose_s``).
    """
    if not samples and learner.reduce_gradients is None:  # a rank of several joins the collective even so
        return {}

    def learn() -> dict[str, float]:
        before = learner.version
        # how far the rollouts' policy (the weights before this update) has moved from the untrained one
        t0 = time.perf_counter()
        divergence = {**learner.divergence(samples), "diagnose_s": time.perf_counter() - t0} if diagnose else {}
        first = last = learner.update(samples, weight)
        for _ in range(epochs - 1):
            last = learner.update(samples, weight)
        return {**last, "stale": first["stale"], "stale_dropped": first["stale_dropped"], "epochs": float(epochs),
                "updated": float(learner.version - before), **divergence}

    metrics = await sync.run_update(learn)
    sync.publish(learner, updated=bool(metrics.get("updated")))
    return metrics


async def evaluate(cfg: TrainConfig, pool, agent, step: int, dist=None, record: Path | None = None) -> dict[str, Any]:
    """Held-out success with the pure policy (no exploration), with and without experience in crl and
    static modes: ``--eval-episodes`` seeds of each task, the mean over all of them (and each task's own
    under ``success/<task>`` when there are several). Held-out episodes are never distilled nor credited
    to entries (``EpisodeContext.learning``). With ``record`` (the run folder) each half's episodes and
    trajectories are kept in ``record/evals/step-NNNN/{without,with}_experience/`` (:mod:`crl_agent.train_evals`).

    Under torchrun each rank plays its share of the seeds and every rank gets the same row."""
    seeds = range(cfg.eval_seed, cfg.eval_seed + cfg.eval_episodes)
    row: dict[str, Any] = {"step": step}
    tasks = cfg.task_ids
    todo = [(task, i) for task in tasks for i in range(len(seeds))]
    mine = dist.share(len(todo)) if dist is not None else range(len(todo))
    halves = {with_exp: [EpisodeContext(todo[j][0], seeds[todo[j][1]], todo[j][1], with_experience=with_exp,
                                        explore=0.0, learning=False) for j in mine]
              for with_exp in ([False, True] if cfg.experience else [False])}
    # both halves through the pool at once: one tail of slow episodes instead of two, and the half without
    # experience plays while the other waits on search-and-ask answers (held-out episodes change nothing
    # the other half reads: they are neither distilled nor counted, see EpisodeContext.learning)
    played = await play(pool, agent, [c for ctxs in halves.values() for c in ctxs])
    start = 0
    for with_exp, ctxs in halves.items():
        _summarise_half(cfg, seeds, with_exp, ctxs, played[start : start + len(ctxs)], row, dist, record)
        start += len(ctxs)
    return row


def _summarise_half(cfg: TrainConfig, seeds: range, with_exp: bool, ctxs: list[EpisodeContext], eps: list[Episode],
                    row: dict[str, Any], dist=None, record: Path | None = None) -> None:
    from crl_agent.train_evals import episode_lines, eval_folder, write_eval

    tasks = cfg.task_ids
    results = [(c.env_id, e.success, e.error is not None, e.actions) for c, e in zip(ctxs, eps, strict=True)]
    if dist is not None:
        results = [r for part in dist.gather(results) for r in part]
    if record is not None:  # every rank gathers; rank 0 writes
        lines = episode_lines(eps)
        lines = [x for part in dist.gather(lines) for x in part] if dist is not None else lines
        if dist is None or dist.main:
            write_eval(eval_folder(record, row["step"], with_exp), lines,
                       {"step": row["step"], "with_experience": with_exp, "mode": cfg.mode, "tasks": tasks,
                        "seeds": [seeds.start, len(seeds)], "policy": "pure (no exploration)"})
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


def informative_halves(ctxs: list[EpisodeContext], episodes: list[Episode]) -> set[tuple[int, bool]]:
    """The halves ``(episode_index, with_experience)`` with mixed outcomes (errored episodes left out): the
    halves whose advantages are not all zero (grpo: each group is one half, without experience)."""
    halves: dict[tuple[int, bool], list[float]] = {}
    for c, e in zip(ctxs, episodes, strict=True):
        if e.error is None:
            halves.setdefault((c.episode_index, c.with_experience), []).append(float(e.success))
    return {h for h, rs in halves.items() if has_signal(rs)}


# ---------------------------------------------------------------------------------------- CLI
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


