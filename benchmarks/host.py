"""Know the machine: how fast this CPU runs the embedded model, and which committed benchmarks fit a session here.

Machines of the same size differ several-fold (DESIGN.md 10.6: a GRPO step of ``benchmarks/train_cpu.py``
took ~62 s on an AMX Xeon, ~170 s on an AVX512-BF16 EPYC and ~636 s on an AVX2 EPYC, all 2 cores), so a
budget in minutes does not transfer and a session should know its machine before it starts a long run.
This script prints:

1. the best fp32 and bf16 matmul GFLOP/s at the model's shapes (SmolLM2-135M: 512 tokens x hidden 576 x
   MLP 1536) and the dtype the engine picks here (:func:`crl_agent.llm.cpu_dtype.pick_cpu_dtype`);
2. a short timed probe of the real engine (unless ``--quick``): the embedded SmolLM2-135M with the
   trainer's LoRA adapter (r = 16) scores the admissible actions of 8 concurrent episodes of
   ``crl/MiniHack-Room-Random-5x5-Short-v0`` (the ``llm`` agent in score mode, history 2, temperature 1:
   the trainer's rollouts) for a few rounds, then takes one LoRA forward+backward+AdamW step
   (:class:`~crl_agent.rl.PolicyLearner`) and the trainer's diagnostic forward passes
   (``PolicyLearner.divergence``) on those turns; about a minute, less on a fast machine. Each unit is
   timed twice: wall seconds (what it took now) and this process's CPU seconds over its threads (what it
   takes with the cores to itself: other work sharing the CPU slows the first, hardly the second). The
   estimate uses the CPU units, so the verdict describes the machine, not the moment;
3. what it extrapolates from that probe (:func:`estimate`), per unit ``decision_s`` (one scoring decision),
   ``update_s`` and ``diagnostics_s`` (per trained sample)::

       step_s = C_STEP * (16 episodes * 13.5 decisions * decision_s + 32 samples * (update_s + diagnostics_s / 4))
       eval_s = C_EVAL * 64 episodes * 13.5 decisions * decision_s

   (16 episodes and 32 samples: 2 groups x 8 rollouts, 2 trained turns each; 13.5: the untrained actor's
   mean episode length on held-out seeds, benchmarks/results/train_cpu/; / 4: the trainer's diagnostics
   run every ``--diagnose-every 4`` steps). ``C_STEP`` and ``C_EVAL`` cover
   what the probe leaves out (env steps, the batcher's gaps, dynamic sampling's extra groups, the
   trainer's bookkeeping, and the shorter episodes of a policy that learns); they are fitted so that the
   probe's units measured on the 2-core AVX512-BF16 EPYC (:data:`CALIBRATION`) give that machine's
   measured default run (``--steps 32 --set dynamic-sampling=4``, seed 7): a median step of 171 s and
   held-out evaluations of 2-4 minutes (180 s taken). Not yet checked on another kind of machine;
4. a verdict (:func:`verdict`): which committed benchmarks fit a ``--session-hours`` session (2.5 h) here,
   and whether the machine is *fast*: the acceptance run (one ``grpo`` seed, 32 steps, 5 evaluations) fits.

Benchmarks other than ``train_cpu.py`` are costed from their committed results, scaled by this machine's
held-out evaluation time (see :data:`OTHER_BENCHMARKS`). ``--json`` prints the record as JSON (what
``benchmarks/train_cpu.py`` embeds in each per-seed result, with ``--quick``).

Run: ``python benchmarks/host.py [--json] [--quick] [--threads N] [--session-hours 2.5]`` (``make hostcheck``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STEP_PROFILES = ROOT / "benchmarks" / "results" / "step_profile"
TASK = "crl/MiniHack-Room-Random-5x5-Short-v0"
MODEL_SHAPE = (512, 576, 1536)  # tokens x hidden x MLP width of SmolLM2-135M: its largest matmuls
SESSION_HOURS = 2.5
PROBE_EPISODES = 8  # concurrent episodes: one batch of the backend (max_batch_size 8)
PROBE_SEED = 2_000_000  # far from training (0+) and held-out (1,000,000+) seeds

# the trainer's step as train_cpu.py runs it: 2 groups x 8 rollouts, 2 trained turns per episode
EPISODES_PER_STEP = 16
SAMPLES_PER_STEP = 32
# the trainer's --diagnose-every default: its divergence diagnostics (two forward passes over the step's
# trained turns) run every 4th step (the calibration run had them every step)
DIAGNOSE_EVERY = 4
DECISIONS_PER_EPISODE = 13.5  # untrained actor, held-out (train_cpu evaluations at step 0: 13.4-13.8)
EVAL_EPISODES = 64
EVALS_PER_RUN = 5  # --steps 32 --eval-every 8: before, 8, 16, 24, 32
# with and without experience (2 evaluations) whose prompts are ~1.45x longer with the bank shown
# (gold_experience.json: 1,449 s against 998 s)
EXPERIENCE_EVAL_FACTOR = 2.45
# a crl step over a grpo step, over a whole run: the first steps have no bank to search and no extractor update
# (a step profile's 2 steps of each: 179 s against 133 s, 1.35x), the later ones distil, ask and train the
# extractor. equal_steps crl seed 0 on the 2-core AMX Xeon: steps 1-12 288-847 s (mean 534 s), steps 13-15,
# after the extractor engine's speed-ups (kv_room, joined answers, --extractor-max-batch 32), 387-416 s; that
# host's grpo step 133 s (its step profile, 2026-12-07): ~3x. A profile's early-step factor is used only where
# it is larger (it never is at these settings).
EXPERIENCE_STEP_FACTOR = 3.0

# Calibration (see the module docstring): the probe's CPU units on the 2-core AVX512-BF16 EPYC (AMD EPYC
# family 25 model 17, bf16), mean of four probes on 2026-12-06 at load averages 11-17 from other work
# (decision 0.299-0.311 s; update 0.868-0.925 s and diagnostics 0.633-0.700 s a sample, batches of 2 and 8),
# give a raw step of 16 * 13.5 * 0.307 + 32 * (0.889 + 0.665) = 116 s (diagnosed every step, as that run
# was) and a raw evaluation of 64 * 13.5 * 0.307 = 265 s; that machine's measured step was 171 s (median
# of 32, dynamic sampling's extra groups included) and its evaluations 2-4 minutes (fewer decisions as the
# policy learns: 13.5 -> ~9.5 an episode; 32 episodes at once).
CALIBRATION = {"cpu": "AMD EPYC (AVX512-BF16), 2 cores", "decision_s": 0.307, "update_s": 0.889,
               "diagnostics_s": 0.665, "measured_step_s": 171.0, "measured_eval_s": 180.0}

# Benchmarks costed from their committed results: (command, seconds recorded, that machine's seconds for
# a 64-episode held-out evaluation, where the record comes from). The cost here is recorded * eval_here /
# eval_there.
OTHER_BENCHMARKS = (
    # 32 episodes off + 32 with the gold bank: 998 s + 1,449 s; its off arm *is* a held-out evaluation
    # (temperature 1, history 2, seeds from 1,000,000) at 31.2 s an episode, so eval_there = 64 * 31.2 s
    ("benchmarks/gold_experience.py", 998.0 + 1449.0, 64 * 998.0 / 32,
     "gold_experience.json: 32 episodes each arm, its off arm timing the evaluation"),
    # 3 episodes a task: off 2,130 s + on 3,240 s, x20/3; recorded on "2 AMD EPYC cores" without the kind:
    # taken as the faster (AVX512-BF16, 180 s an evaluation), so the estimate errs long
    ("benchmarks/crl_overhead.py --episodes 20", (2129.5 + 3240.0) * 20 / 3, 180.0,
     "crl_overhead.json at 3 episodes a task x 20/3; machine kind not recorded, assumed the faster EPYC"),
)


# ---------------------------------------------------------------------------------------- the machine
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def host_slug(model: str | None = None) -> str:
    """A file name for this CPU: its model name, lower-case, runs of other characters as one dash."""
    return re.sub(r"[^a-z0-9]+", "-", (model or cpu_model()).lower()).strip("-") or "unknown"


def profiled_times(model: str | None = None) -> dict[str, Any] | None:
    """This CPU's measured step and evaluation seconds from its committed step profile
    (``benchmarks/results/step_profile/<host-slug>.json``, :mod:`benchmarks.step_profile`): the mean grpo
    step, the crl step's factor over it, and a 64-episode held-out evaluation; ``None`` without a profile."""
    path = STEP_PROFILES / f"{host_slug(model)}.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    runs = {r["mode"]: r for r in record.get("runs", [])}
    if "grpo" not in runs or not runs["grpo"]["steps"]:
        return None

    def step_s(run):
        return sum(s["time_s"] for s in run["steps"]) / len(run["steps"])

    episode = runs["grpo"]["parts"].get("eval episode", {}).get("seconds")
    out = {"source": str(path.relative_to(ROOT)), "step_s": step_s(runs["grpo"]), "date": record.get("date"),
           "load_average": [record.get("load_average_start"), record.get("load_average_end")]}
    if episode:
        out["eval_s"] = EVAL_EPISODES * episode
    if "crl" in runs and runs["crl"]["steps"]:
        # its few first steps understate a whole run's (see EXPERIENCE_STEP_FACTOR)
        out["crl_step_factor"] = max(step_s(runs["crl"]) / out["step_s"], EXPERIENCE_STEP_FACTOR)
    return out


def cpu_flags() -> dict[str, bool]:
    """Which of the instruction sets that decide bf16 speed the CPU reports (Linux only; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return {name: name in flags for name in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")}


def matmul_gflops(dtype: str, shape: tuple[int, int, int] = MODEL_SHAPE, min_s: float = 1.0) -> float | None:
    """Best GFLOP/s of an ``m x k`` by ``k x n`` matmul in ``dtype`` (after a warm-up), timed for at least
    ``min_s`` seconds; ``None`` where torch cannot multiply that dtype on this CPU. The best of many short
    products: on a CPU that other work shares, a few of them still run alone."""
    import torch

    m, k, n = shape
    a, b = torch.randn(m, k).to(getattr(torch, dtype)), torch.randn(k, n).to(getattr(torch, dtype))
    try:
        a @ b
    except RuntimeError:
        return None
    best, spent = float("inf"), 0.0
    while spent < min_s or best == float("inf"):
        t0 = time.perf_counter()
        a @ b
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return 2 * m * k * n / best / 1e9


def machine_record(threads: int = 0) -> dict[str, Any]:
    """The cheap part of the record: CPU, cores, threads, load, matmul GFLOP/s and the engine's dtype."""
    import torch

    from crl_agent.llm.cpu_dtype import pick_cpu_dtype

    if threads:
        torch.set_num_threads(threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    fp32, bf16 = matmul_gflops("float32"), matmul_gflops("bfloat16")
    return {
        "cpu_model": cpu_model(), "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "load_average_1min": load,
        "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
        "matmul_gflops": {"shape": list(MODEL_SHAPE), "float32": fp32, "bfloat16": bf16},
        # the engine's rule (bf16 where it multiplies at least 2x as fast) on this longer measurement, and
        # what the engine's own 30 ms probe answers now: on a busy CPU the two can disagree
        "engine_dtype": "bfloat16" if bf16 and fp32 and bf16 >= 2 * fp32 else "float32",
        "engine_dtype_quick_probe": pick_cpu_dtype(),
    }


# ---------------------------------------------------------------------------------------- the probe
async def _score_rounds(agent, envs: list, budget_s: float, min_rounds: int = 2, max_rounds: int = 4):
    """Rounds of one scoring decision per concurrent episode (a finished episode restarts on a fresh seed);
    returns (decisions, seconds, their ScoredTurns). Stops after ``max_rounds``, or after ``min_rounds``
    once ``budget_s`` is spent."""
    from crl_agent.episode import EpisodeContext

    seeds = iter(range(PROBE_SEED, PROBE_SEED + 10_000))

    def start(env) -> list:
        seed = next(seeds)
        obs, info = env.reset(seed=seed)
        return [env, agent.make_policy(EpisodeContext(env_id=TASK, seed=seed)), obs, info]

    live = [start(env) for env in envs]
    turns, decisions, rounds, t0, c0 = [], 0, 0, time.perf_counter(), time.process_time()
    while rounds < max_rounds and (rounds < min_rounds or time.perf_counter() - t0 < budget_s):
        actions = await asyncio.gather(*(policy.act(obs, info) for _, policy, obs, info in live))
        for slot, action in zip(live, actions, strict=True):
            turns.append(slot[1].scored_turn())
            obs, _, terminated, truncated, info = slot[0].step(action)
            slot[:] = start(slot[0]) if terminated or truncated else [slot[0], slot[1], obs, info]
        decisions, rounds = decisions + len(live), rounds + 1
    return decisions, time.perf_counter() - t0, time.process_time() - c0, turns


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads) of ``fn()``."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def probe_engine(dtype: str, threads: int = 0, budget_s: float = 20.0) -> dict[str, Any]:
    """Time the real engine in ``dtype``: scoring decisions, one LoRA update and the trainer's diagnostics."""
    import gymnasium as gym
    import torch

    import crl_envs  # noqa: F401 - registers the crl/ ids
    from crl_agent.agents.llm import LLMAgent
    from crl_agent.llm import make_llm
    from crl_agent.rl import PolicyLearner, TurnSample, add_lora

    t0 = time.perf_counter()
    llm = make_llm("transformers", None, dtype=dtype, **({"num_threads": threads} if threads else {}))
    actor = add_lora(llm.model, r=16)  # in place, as the trainer does: rollouts score through the adapter
    learner = PolicyLearner(actor, lr=5e-4, loss="ppo", token_budget=2048)
    agent = LLMAgent(llm=llm, temperature=1.0, history=2, action_mode="score")
    envs = [gym.make(TASK) for _ in range(PROBE_EPISODES)]
    load_s = time.perf_counter() - t0
    try:
        decisions, decide_s, decide_cpu_s, turns = asyncio.run(_score_rounds(agent, envs, budget_s))
    finally:
        for env in envs:
            env.close()
    samples = [TurnSample(prompt_ids=t.prompt_token_ids, candidate_ids=t.candidate_token_ids, chosen=t.chosen,
                          old_logprobs=[t.action_logprob], temperature=t.temperature, norm=t.score_norm,
                          advantage=1.0 if i % 2 else -1.0) for i, t in enumerate(turns) if t is not None]
    threads = torch.get_num_threads()
    # 4 samples (batches of 2 and 8 gave the same seconds a sample within 5%); 2 where the update alone would
    # take a minute (CPU seconds decide, so a busy machine times the same batch as an idle one of its kind)
    n = 2 if _timed(lambda: learner.update(samples[:2]))[1] / threads > 4.0 else min(4, len(samples))
    diagnostics = _timed(lambda: learner.divergence(samples[:n]))
    update = _timed(lambda: learner.update(samples[:n]))
    return {"load_s": load_s, "episodes": PROBE_EPISODES, "decisions": decisions, "update_samples": n,
            "prompt_tokens_mean": sum(len(s.prompt_ids) for s in samples) / max(1, len(samples)),
            # wall seconds per unit, as this machine ran them now (slow while other work shares the CPU)
            "wall": {"decision_s": decide_s / decisions, "update_s": update[0] / n, "diagnostics_s": diagnostics[0] / n},
            # CPU seconds per unit over the threads: what they take with the cores to themselves
            "cpu": {"decision_s": decide_cpu_s / decisions / threads, "update_s": update[1] / n / threads,
                    "diagnostics_s": diagnostics[1] / n / threads},
            "wall_s": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------- extrapolation
def raw_times(units: dict[str, float], diagnose_every: int = DIAGNOSE_EVERY) -> tuple[float, float]:
    """The formula's step and evaluation seconds before calibration, from per-unit seconds."""
    rollout = EPISODES_PER_STEP * DECISIONS_PER_EPISODE * units["decision_s"]
    update = SAMPLES_PER_STEP * (units["update_s"] + units["diagnostics_s"] / max(1, diagnose_every))
    return rollout + update, EVAL_EPISODES * DECISIONS_PER_EPISODE * units["decision_s"]


def estimate(units: dict[str, float], diagnose_every: int = DIAGNOSE_EVERY) -> dict[str, float]:
    """Seconds per GRPO step and per 64-episode held-out evaluation from the probe's per-unit seconds
    (``decision_s``; ``update_s`` and ``diagnostics_s`` per sample), by the formula of the module docstring,
    with ``C_STEP`` and ``C_EVAL`` fitted on :data:`CALIBRATION` (whose run diagnosed every step)."""
    if not all(units.get(k, 0) > 0 for k in ("decision_s", "update_s", "diagnostics_s")):
        raise ValueError(f"the probe's units must all be positive seconds, got {units}")
    step, evaluation = raw_times(units, diagnose_every)
    ref_step, ref_eval = raw_times(CALIBRATION, diagnose_every=1)
    c_step, c_eval = CALIBRATION["measured_step_s"] / ref_step, CALIBRATION["measured_eval_s"] / ref_eval
    return {"step_s": c_step * step, "eval_s": c_eval * evaluation, "c_step": c_step, "c_eval": c_eval}


def benchmark_costs(step_s: float, eval_s: float, steps: int = 32,
                    experience_step_factor: float = EXPERIENCE_STEP_FACTOR) -> list[dict[str, Any]]:
    """Estimated hours of each committed benchmark whose cost decides what a session here can run."""
    grpo = steps * step_s + EVALS_PER_RUN * eval_s
    with_experience = steps * experience_step_factor * step_s + EVALS_PER_RUN * EXPERIENCE_EVAL_FACTOR * eval_s
    rows = [
        {"command": f"benchmarks/train_cpu.py --modes grpo --seeds S --steps {steps}", "seconds": grpo,
         "acceptance": True},
        {"command": f"benchmarks/train_cpu.py --modes crl --seeds S --steps {steps} (or static)",
         "seconds": with_experience},
        {"command": f"benchmarks/train_cpu.py --modes grpo,static,crl --seeds 0,1,2 --steps {steps}",
         "seconds": 3 * (grpo + 2 * with_experience)},
    ]
    for command, recorded_s, eval_there_s, source in OTHER_BENCHMARKS:
        rows.append({"command": command, "seconds": recorded_s * eval_s / eval_there_s, "source": source})
    for row in rows:
        row["hours"] = row["seconds"] / 3600
    return rows


def verdict(step_s: float, eval_s: float, session_hours: float = SESSION_HOURS,
            experience_step_factor: float = EXPERIENCE_STEP_FACTOR) -> dict[str, Any]:
    """Which benchmarks fit a session of ``session_hours``; the machine is *fast* when the acceptance
    run (one ``grpo`` seed, 32 steps) fits. ``line`` says it in one line."""
    if not (step_s > 0 and eval_s > 0 and session_hours > 0):
        raise ValueError(f"need positive step_s, eval_s and session_hours, got {step_s}, {eval_s}, {session_hours}")
    rows = benchmark_costs(step_s, eval_s, experience_step_factor=experience_step_factor)
    for row in rows:
        row["fits"] = row["hours"] <= session_hours
    fast = next(r for r in rows if r.get("acceptance"))["fits"]
    fitting = [r["command"].split(" (")[0] for r in rows if r["fits"]]
    line = (f"{'FAST' if fast else 'SLOW'} for learning runs: in {session_hours:g} h here "
            + (f"fit: {'; '.join(fitting)}" if fitting else "none of the committed learning benchmarks fits")
            + (" (run pending learning benchmarks here)" if fast else " (take engineering items here)"))
    return {"session_hours": session_hours, "fast": fast, "benchmarks": rows, "line": line}


# ---------------------------------------------------------------------------------------- output
def report(record: dict[str, Any]) -> str:
    """The record in words: what was measured, what was extrapolated, the verdict."""
    mm = record["matmul_gflops"]
    flags = ", ".join(k for k, v in record["cpu_flags"].items() if v) or "unknown"

    def gflops(x):
        return "unsupported" if x is None else f"{x:,.0f} GFLOP/s"

    out = [f"CPU: {record['cpu_model']} ({record['cores']} cores, torch threads {record['torch_threads']}; {flags})",
           f"measured  matmul {'x'.join(map(str, mm['shape']))}: fp32 {gflops(mm['float32'])}, "
           f"bf16 {gflops(mm['bfloat16'])}; the engine picks {record['engine_dtype']}"]
    if record.get("engine_dtype_quick_probe", record["engine_dtype"]) != record["engine_dtype"]:
        out.append(f"note: the engine's own 30 ms probe (crl_agent.llm.cpu_dtype) answered "
                   f"{record['engine_dtype_quick_probe']} just now: on a busy CPU a run may start in that dtype")
    load = record.get("load_average_1min")
    if load is not None and load > 0.5 * (record["cores"] or 1):
        out.append(f"note: load average {load:.1f} on {record['cores']} cores: other work shares this CPU, so "
                   "every time here reads slow")
    probe = record.get("probe")
    if probe is None:
        out.append("(--quick: no engine probe, no estimate)")
        return "\n".join(out)
    est, v, cpu, wall = record["estimate"], record["verdict"], probe["cpu"], probe["wall"]
    out += [f"measured  engine (SmolLM2-135M + LoRA r=16, {record['engine_dtype']}, prompts "
            f"{probe['prompt_tokens_mean']:.0f} tokens): {probe['decisions']} scoring decisions of {probe['episodes']} "
            f"episodes at once, {cpu['decision_s']:.3f} s each (wall {wall['decision_s']:.3f} s); LoRA update "
            f"{cpu['update_s']:.2f} s a sample (wall {wall['update_s']:.2f} s) and diagnostics "
            f"{cpu['diagnostics_s']:.2f} s a sample (wall {wall['diagnostics_s']:.2f} s), {probe['update_samples']} "
            f"samples; model load {probe['load_s']:.0f} s, probe {probe['wall_s']:.0f} s in all",
            f"estimated GRPO step {est['step_s']:.0f} s (2 groups x 8, history 2, {TASK}), 64-episode held-out "
            f"evaluation {est['eval_s'] / 60:.1f} min: "
            + (f"measured on this kind of CPU by benchmarks/step_profile.py ({est['source']}; crl step "
               f"x{est.get('experience_step_factor', EXPERIENCE_STEP_FACTOR):.2f})" if est.get("source") else
               f"the CPU units through the formula in benchmarks/host.py (x{est['c_step']:.2f} and "
               f"x{est['c_eval']:.2f}, fitted on {CALIBRATION['cpu']}: 171 s, 3 min)")]
    for row in v["benchmarks"]:
        out.append(f"  {'fits' if row['fits'] else 'no  '} {row['hours']:5.1f} h  {row['command']}")
    out.append(f"verdict: {v['line']}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("--quick", action="store_true", help="CPU, matmul and dtype only: no engine probe, no verdict")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, as the trainer)")
    p.add_argument("--session-hours", type=float, default=SESSION_HOURS)
    p.add_argument("--budget-s", type=float, default=20.0, help="seconds of scoring the probe aims at")
    args = p.parse_args(argv)
    if args.session_hours <= 0 or args.threads < 0 or args.budget_s <= 0:
        p.error("--session-hours and --budget-s must be > 0 and --threads >= 0")
    record: dict[str, Any] = {"schema_version": "1.0", **machine_record(args.threads)}
    if not args.quick:
        record["probe"] = probe_engine(record["engine_dtype"], args.threads, args.budget_s)
        record["estimate"] = estimate(record["probe"]["cpu"])
        profiled = profiled_times(record["cpu_model"])
        if profiled is not None:  # real steps measured on this kind of CPU beat the probe's extrapolation
            record["estimate"].update(step_s=profiled["step_s"], source=profiled["source"],
                                      eval_s=profiled.get("eval_s", record["estimate"]["eval_s"]),
                                      experience_step_factor=profiled.get("crl_step_factor", EXPERIENCE_STEP_FACTOR))
        record["verdict"] = verdict(record["estimate"]["step_s"], record["estimate"]["eval_s"], args.session_hours,
                                    record["estimate"].get("experience_step_factor", EXPERIENCE_STEP_FACTOR))
    print(json.dumps(record, indent=2) if args.json else report(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
