"""CPU learning run: does Complementary RL (or plain GRPO) raise held-out success in a number of training steps?

For each mode (``grpo``, ``static``, ``crl``) and training seed, it trains the embedded SmolLM2-135M (score
mode, LoRA, bf16 where the CPU has it) on a task whose layout varies by seed, with ``python -m
crl_agent.train``'s loop, for ``--steps`` steps (default 32; ``--minutes M`` trains for a time budget
instead), and evaluates the pure policy (temperature 1, no exploration) on 64 held-out seeds never trained
on, before, every 8 steps and at the end.

**One seed per invocation, results that accumulate.** A step takes ~62 s on one 2-core machine and ~636 s on
another (``benchmarks/host.py``), so five seeds rarely fit one session: each finished run writes its own
result, ``benchmarks/results/train_cpu/<tag>/<mode>-seed<S>.json`` (the run's evaluations, per-step
diagnostics, settings, and its host: CPU model, matmul GFLOP/s, engine dtype, from ``host.py --json
--quick``; its measured step seconds are in the run) and ``.png``, which is committed. ``--report`` merges
whatever per-seed files the tag holds into ``<tag>/table.md`` (one row per run, its host beside it, and the
verdict per mode: every seed's held-out gain at least +10 points and their median at least +20, over
``ACCEPTANCE_SEEDS`` seeds; with fewer files it says what is already settled and what the missing seeds
would need) and
``<tag>/plot.png`` (the curves by training step, and per step the action entropy, the share of groups with
signal and the KL to the untrained policy). A torn per-seed file, one whose settings differ from the tag's,
or a run asked for with ``--modes``/``--seeds`` and not there is named with what to do, and left out.

Runs go in parallel as subprocesses (one torch thread each when two share the cores): ``--jobs 2`` trains
two at once on 2 cores; a lone run gets every core.

Run: ``python benchmarks/train_cpu.py --modes grpo --seeds 3 [--steps 32] [--tag NAME] [--set KEY=VALUE]``
(runs in ``runs/train_cpu/<tag>/``; ``--set device=cuda`` trains on a GPU), then
``python benchmarks/train_cpu.py --report [--tag NAME]``. ``--import-results FILE --tag NAME`` splits a
results file of the earlier layout (``benchmarks/results/train_cpu*.json``: every run of a tag in one file)
into per-seed files.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from train_compare import comparison_lines, effective_mode, extractor_updates, longest_pause  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "train_cpu"
SCHEMA_VERSION = "2.0"  # 1.0: one file per tag (benchmarks/results/train_cpu*.json); 2.0: one file per run
DEFAULT_TAG = "default"
DEFAULT_STEPS = 32
ACCEPTANCE_SEEDS = 5  # the verdict's bar is over this many training seeds a mode

# DESIGN section 9's prototype (which learned a fixed room in ~15 minutes), on a room whose layout varies
# by seed: on-policy (the untrained policy already wins ~20% here, so groups hold wins and losses),
# 2 seeds x 8 rollouts a step (crl: 4 without experience + 4 with), 2 random turns of each episode
# per update (unbiased, a fraction of the cost), each episode weighing the same.
SETTINGS = {
    "tasks": "crl/MiniHack-Room-Random-5x5-Short-v0",
    "groups": 2,
    "group-size": 8,
    "explore": 0.0,
    "lr": 5e-4,
    "lora-rank": 16,
    "history": 2,
    "turn-weight": "episode",
    "turns-per-episode": 2,
    "distil-max-tokens": 128,
    "distil-chars": 2000,
    "eval-every": 8,
    "eval-episodes": 64,
    "ppo-epochs": 1,
    "steps": DEFAULT_STEPS,
    # DAPO's dynamic sampling, up to 4 extra groups a step when groups lack signal (the trainer's default
    # since issue 37: seed 7 went 26.6% -> 73.4% held-out in 32 steps with it and collapsed without it,
    # DESIGN.md 10.6); KL and entropy terms off as in the paper
    "dynamic-sampling": 4,
    "kl-coef": 0.0,
    "entropy-coef": 0.0,
    # where each run trains and scores: --set device=cuda runs the same comparison on a GPU (equal steps:
    # the same algorithm and budget in steps, so its results answer the same question, faster)
    "device": "cpu",
}
# crl and static on this CPU: 2 episodes of each group distilled (one from each half; distilling all 16 a step
# made a step 2.6x slower than grpo's), batched 8 at a time, merges once a step between rollouts, and
# search-and-ask on (the agent's default, 2 asks an episode). The extractor's schedule (issue 46): every crl run
# before it made 0 updates (warm-up 5, then 16 rewarded calls with the same calls retrained every other step:
# never reached in 16 steps). Now a call is queued when an episode it guided ends and trained once per new
# evidence (the FIFO buffer), and a step credits the origins of what its 8 with-experience episodes retrieved
# (4 entries each) plus their answers. Measured (equal_steps crl seed 0, AMX Xeon): 5-15 calls got outcomes a
# step over steps 2-5, 26-41 a step from step 6 on. So 8 calls an update (an eighth of the paper's 64, as our 16
# rollouts a step are an eighth of its 128) after 4 warm-up steps (the bank has entries from ~2 steps and their
# outcomes from ~2 more). The buffer holds the newest 16. That run, with a buffer of 8 (the official capacity
# equals its batch), updated once in 8 steps: from step 6 every batch of the 8 newest calls had guided only
# failures (train success 0-19%), so every advantage was 0 against the batch mean and the update moved no
# weight while spending the calls' evidence. Now a batch grows past 8, oldest first, until two rewards differ,
# and waits when none do (crl_agent/rl/batches.py); 16 kept calls are about half a step's evidence, so a step
# with a single success or a mixed distillation gives an update, and an update costs at most 16 calls (~8 s
# a call here, beside the rollouts). tests/test_crl_schedule.py runs this schedule.
CRL_SETTINGS = {"distil-per-group": 2, "distil-workers": 8, "merge-every": 1, "extractor-batch": 8,
                "extractor-warmup": 4, "extractor-buffer": 16}


# the per-step diagnostics the results keep and plot: (name in the results, metrics.jsonl key)
DIAGNOSTICS = (("policy_entropy", "rollout/policy_entropy"), ("signal_groups", "signal_groups"),
               ("kl_ref", "actor/kl_ref"), ("tv_ref", "actor/tv_ref"), ("clip_fraction", "actor/clip_fraction"),
               ("repeat_rate", "rollout/repeat_rate"), ("extra_groups", "extra_groups"))


def flags(settings: dict) -> list[str]:
    """``--key value`` for each setting (a list value repeats its flag)."""
    out = []
    for k, v in settings.items():
        for x in v if isinstance(v, list) else [v]:
            out += [f"--{k}", str(x)]
    return out


def run_one(mode: str, seed: int, minutes: float, out: Path, settings: dict, threads: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "crl_agent.train", "--out", str(out), "--quiet", "--mode", mode, "--seed", str(seed),
           "--time-budget-min", str(minutes), "--threads", str(threads),  # 0: no budget, --steps decides
           *flags({**settings, **(CRL_SETTINGS if mode in ("crl", "static") else {})})]
    if (out / "checkpoint.pt").exists():
        cmd.append("--resume")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    with (out / "log.txt").open("a") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    return {**summarise(mode, seed, out), "returncode": proc.returncode, "wall_s": time.perf_counter() - t0}


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def summarise(mode: str, seed: int, out: Path) -> dict:
    """One run's result from its folder: held-out evaluations, training time, extractor statistics."""
    evals, metrics = _rows(out / "evals.jsonl"), _rows(out / "metrics.jsonl")
    row = {"mode": mode, "seed": seed, "run": str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out),
           "train_steps": len(metrics), "train_minutes": sum(m["time_s"] for m in metrics) / 60,
           "step_s_median": sorted(m["time_s"] for m in metrics)[len(metrics) // 2] if metrics else None,
           "train_success": [m["train_success"] for m in metrics], "evals": evals,
           # per step: (step, value) of what the issue "learning that holds on every seed" diagnoses
           "diagnostics": {key: [(m["step"], m[name]) for m in metrics if name in m] for key, name in DIAGNOSTICS}}
    if evals:
        row["before"], row["after"] = evals[0]["success"], evals[-1]["success"]
        row["gain_points"] = 100 * (row["after"] - row["before"])
        # two independent binomial estimates: the gain's standard error
        row["gain_se_points"] = 100 * (evals[0]["success_se"] ** 2 + evals[-1]["success_se"] ** 2) ** 0.5
        if "with_experience" in evals[-1]:
            row["before_with_experience"] = evals[0]["with_experience"]
            row["after_with_experience"] = evals[-1]["with_experience"]
        # with and without experience at step 0 differ only by the numerics of another prompt batch (the
        # bank is empty then): the gap a later difference must exceed
        if "with_experience" in evals[0]:
            row["step0_gap_points"] = 100 * (evals[0]["with_experience"] - evals[0]["success"])
            row["step0_gap_se_points"] = 100 * (evals[0]["with_experience_se"] ** 2 + evals[0]["success_se"] ** 2) ** 0.5
    # per step: every episode played (dynamic sampling's extra groups too), the informative ones kept for the
    # update and the share of those played with experience (not logged before issue 46)
    row["episodes_played"] = [(m["step"], m["episodes_played"]) for m in metrics if "episodes_played" in m]
    row["episodes_kept"] = [(m["step"], m["episodes_kept"], m["kept_with_experience"])
                            for m in metrics if "episodes_kept" in m]
    row["tool_choice_rate"] = [(m["step"], m["rollout/tool_choice_rate"]) for m in metrics
                               if "rollout/tool_choice_rate" in m]
    if metrics and mode in ("crl", "static"):
        last = metrics[-1]
        valid, bad = last.get("extractor/valid_ops", 0), last.get("extractor/malformed", 0)
        row["extractor"] = {
            "distillations": last.get("extractor/distillations"), "valid_ops": valid, "malformed": bad,
            "valid_operation_rate": valid / (valid + bad) if valid + bad else None,
            "bank_entries": last.get("bank_entries"),
            # the learner's count where the trainer logs it (issue 46), else the steps that updated
            "updates": last.get("extractor/updates", sum(1 for m in metrics if m.get("extractor/updated"))),
            "answer_calls": last.get("extractor/answer_calls"), "answer_meta_reward": last.get("extractor/answer_meta_reward"),
            # steps whose ready calls had all earned the same reward, so no update was launched
            "alike_waits": sum(1 for m in metrics if m.get("extractor/alike")),
        }
        # per step: (step, updates so far, calls in the training buffer, calls rewarded so far, loss, reward)
        row["extractor_schedule"] = [(m["step"], m.get("extractor/updates"), m.get("extractor/buffer"),
                                      m.get("extractor/rewarded_calls"), m.get("extractor/loss"),
                                      m.get("extractor/reward")) for m in metrics]
        row["extractor_reward"] = [(m["step"], m["extractor/reward"]) for m in metrics if "extractor/reward" in m]
        # the mean meta-reward over every call rewarded so far, after each step (whether or not it trained)
        row["extractor_meta_reward"] = [(m["step"], m["extractor/meta_reward"], m["extractor/rewarded_calls"])
                                        for m in metrics if "extractor/meta_reward" in m]
        # the valid-operation rate so far, after each step (the counters are cumulative)
        row["extractor_valid_rate"] = [
            (m["step"], m.get("extractor/valid_ops", 0) / total)
            for m in metrics if (total := m.get("extractor/valid_ops", 0) + m.get("extractor/malformed", 0))]
    return row


# ---------------------------------------------------------------------------------------- per-seed files
def seed_path(tag_dir: Path, mode: str, seed: int) -> Path:
    return tag_dir / f"{mode}-seed{seed}.json"


def host_record(threads: int) -> dict:
    """This machine as ``benchmarks/host.py --json --quick`` describes it (CPU model, cores, matmul GFLOP/s,
    engine dtype), with the torch threads each run gets; ``{"error": ...}`` where that fails (the run's
    result is still worth keeping)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "host.py"), "--json", "--quick", "--threads", str(threads)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        text = proc.stdout
        return json.loads(text[text.index("{"):])
    except (subprocess.SubprocessError, ValueError) as e:
        return {"error": f"benchmarks/host.py --json --quick failed: {type(e).__name__}: {str(e)[:300]}"}


def git_sha() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_seed_result(tag_dir: Path, tag: str, row: dict, settings: dict, budget: dict, jobs: int,
                      host: dict, **provenance) -> Path:
    """One run's result file (written whole, then renamed into place, so a reader never sees half of it)
    and its plot. ``provenance`` replaces the default ``git_sha`` and ``written`` (the code and time now)."""
    provenance = {"git_sha": git_sha(),
                  "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **provenance}
    doc = {"schema_version": SCHEMA_VERSION, "tag": tag, "mode": row["mode"], "seed": row["seed"],
           "settings": settings, "budget": budget, "jobs": jobs, "host": host, **provenance, "run": row}
    if row["mode"] in ("crl", "static"):
        doc["crl_settings"] = CRL_SETTINGS
    path = seed_path(tag_dir, row["mode"], row["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    plot([doc], path.with_suffix(".png"))
    return path


def shown(path: Path) -> str:
    """A path as the table names it: relative to the repository when inside it (the table is committed)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def read_seed_result(path: Path) -> dict:
    """A per-seed file, checked; ``ValueError`` saying what is wrong with it (torn, or not a per-seed result)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{shown(path)}: cannot be read as JSON ({type(e).__name__}: {e}); a torn write? rerun that "
                         "seed or delete the file") from None
    missing = [k for k in ("mode", "seed", "settings", "budget", "host", "run") if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise ValueError(f"{shown(path)}: not a per-seed result of benchmarks/train_cpu.py (no {', '.join(missing)}); "
                         "rerun that seed or delete the file")
    if path.name != f"{doc['mode']}-seed{doc['seed']}.json" or not isinstance(doc["run"].get("evals"), list):
        raise ValueError(f"{shown(path)}: holds {doc['mode']} seed {doc['seed']} (or has no evaluations), not what its "
                         "name says; rerun that seed or delete the file")
    return doc


def run_command(tag: str, mode: str, seed: int, budget: dict) -> str:
    size = f"--minutes {budget['minutes']:g}" if budget.get("minutes") else f"--steps {budget['steps']}"
    tag_flag = f" --tag {tag}" if tag != DEFAULT_TAG else ""
    return f"python benchmarks/train_cpu.py{tag_flag} --modes {mode} --seeds {seed} {size} --jobs 1"


def merge(tag_dir: Path, expected: list[tuple[str, int]] | None = None) -> tuple[list[dict], list[str]]:
    """The tag's per-seed results that belong in one table, and a message for every file left out (torn,
    other settings than the tag's) and every ``expected`` (mode, seed) without a file.

    The tag's settings are those most of its runs share; a run made with others is left out, naming the
    keys that differ (a table mixes hosts, never settings)."""
    docs, problems = [], []
    for path in sorted(tag_dir.glob("*-seed*.json")):
        try:
            docs.append(read_seed_result(path))
        except ValueError as e:
            problems.append(str(e))

    def key(doc: dict) -> str:
        return json.dumps([doc["settings"], doc["budget"]], sort_keys=True)

    if docs:
        counts: dict[str, int] = {}
        for doc in docs:
            counts[key(doc)] = counts.get(key(doc), 0) + 1
        majority = max(counts, key=counts.get)
        ref = next(d for d in docs if key(d) == majority)
        kept = []
        for doc in docs:
            if key(doc) == majority:
                kept.append(doc)
                continue
            diff = sorted(k for k in {**ref["settings"], **doc["settings"], "budget": 0}
                          if (ref["budget"] if k == "budget" else ref["settings"].get(k))
                          != (doc["budget"] if k == "budget" else doc["settings"].get(k)))
            problems.append(f"{shown(seed_path(tag_dir, doc['mode'], doc['seed']))}: made with other settings than the "
                            f"tag's other runs ({', '.join(diff)} differ); left out: rerun it or give it its own --tag")
        docs = kept
    budget = docs[0]["budget"] if docs else {"steps": DEFAULT_STEPS}
    have = {(d["mode"], d["seed"]) for d in docs}
    for mode, seed in expected or []:
        if (mode, seed) not in have and not seed_path(tag_dir, mode, seed).exists():  # a torn one is named above
            problems.append(f"{mode} seed {seed}: no result in {shown(tag_dir)}; run it: "
                            f"{run_command(tag_dir.name, mode, seed, budget)}")
    order = {"grpo": 0, "static": 1, "crl": 2}
    docs.sort(key=lambda d: (order.get(d["mode"], 9), d["mode"], d["seed"]))
    return docs, problems


def verdict(rows: list[dict], planned: int = ACCEPTANCE_SEEDS) -> dict:
    """Per mode: the held-out gains (points), their median, and the issue's bar over ``planned`` seeds
    (every seed >= +10, median >= +20).

    With fewer than ``planned`` seeds in, each criterion is ``True`` (met whatever the missing seeds
    gain), ``False`` (failed whatever they gain) or ``None`` (open), and ``needed`` says how many of the
    missing seeds must gain >= +20 for the median to reach it (``None`` once that is impossible)."""
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        gains = sorted(r.get("gain_points", float("nan")) for r in rows if r["mode"] == mode)
        missing = max(0, planned - len(gains))
        every = False if any(not g >= 10 for g in gains) else (True if not missing else None)
        # the median of all seeds if k of the missing ones gain a lot and the others lose a lot
        medians = [statistics.median(gains + [float("inf")] * k + [float("-inf")] * (missing - k)) for k in range(missing + 1)]
        needed = next((k for k, m in enumerate(medians) if m >= 20), None)
        median_ok = True if needed == 0 else (False if needed is None else None)
        out[mode] = {"gains": gains, "median": statistics.median(gains), "missing": missing, "needed": needed,
                     "every seed >= +10": every, "median >= +20": median_ok}
    return out


def verdict_line(mode: str, v: dict) -> str:
    """The verdict in words: the bar's two criteria, or, seeds missing, where each stands."""
    gains = ", ".join(f"{g:+.1f}" for g in v["gains"])
    if not v["missing"]:
        return (f"- {mode}: gains {gains}; median {v['median']:+.1f}; every seed >= +10: {v['every seed >= +10']}; "
                f"median >= +20: {v['median >= +20']}")
    n, m = len(v["gains"]), v["missing"]
    every = {True: "met", False: "failed", None: f"holds so far (the {m} missing must each gain >= +10)"}[v["every seed >= +10"]]
    if v["median >= +20"] is None:
        median = f"open: needs {v['needed']} of the {m} missing seeds at >= +20"
    else:
        median = "met whatever the missing seeds gain" if v["median >= +20"] else "failed whatever the missing seeds gain"
    return (f"- {mode}: {n} of {n + m} seeds: gains {gains}; median so far {v['median']:+.1f}; "
            f"every seed >= +10: {every}; median >= +20: {median}")


def host_label(host: dict) -> str:
    """A short name for the machine a run had: CPU model, dtype and the dtype's matmul GFLOP/s."""
    if not host.get("cpu_model"):
        return host.get("note", "not recorded")
    dtype = host.get("engine_dtype", "?")
    rate = (host.get("matmul_gflops") or {}).get(dtype)
    return f"{host['cpu_model']}, {host.get('cores', '?')} cores, {dtype}" + (f" {rate:,.0f} GFLOP/s" if rate else "")


def table(docs: list[dict], problems: list[str]) -> str:
    """The tag's markdown table: one row per run with its host, then the verdict and what was left out."""
    nan = float("nan")
    lines = ["| mode | seed | host | steps | median step | training | held-out before | after | gain (points) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for doc in docs:
        r = doc["run"]
        wexp = (f" ({100 * r['before_with_experience']:.1f}% -> {100 * r['after_with_experience']:.1f}% with experience)"
                if "after_with_experience" in r else "")
        if r["mode"] in ("crl", "static"):
            wexp += f"; extractor updates: {extractor_updates(r)}"
        if r["mode"] == "crl" and (pause := longest_pause(r)) is not None and r["train_steps"] >= 8:
            wexp += f", at most {pause} steps in a row without one from step 8"
        step_s = f"{r['step_s_median']:.0f} s" if r.get("step_s_median") else "-"
        lines.append(f"| {effective_mode(r)} | {r['seed']} | {host_label(doc['host'])} | {r['train_steps']} | {step_s} | "
                     f"{r['train_minutes']:.0f} min | {100 * r.get('before', nan):.1f}% | "
                     f"{100 * r.get('after', nan):.1f}%{wexp} | "
                     f"{r.get('gain_points', nan):+.1f} ± {r.get('gain_se_points', nan):.1f} |")
    lines.append("")
    # a crl run whose extractor never updated is judged as what it was (static), not as crl
    for mode, v in verdict([{**d["run"], "mode": effective_mode(d["run"])} for d in docs]).items():
        lines.append(verdict_line(mode, v))
    lines += comparison_lines([d["run"] for d in docs])
    if docs:
        budget = docs[0]["budget"]
        size = f"{budget['minutes']:g} minutes" if budget.get("minutes") else f"{budget['steps']} steps"
        lines.append(f"- settings: {size} a run; {json.dumps(docs[0]['settings'])}")
    lines += [f"- {d['mode']} seed {d['seed']}: {d['run']['note']}" for d in docs if d["run"].get("note")]
    lines += [f"- left out: {p}" for p in problems]
    return "\n".join(lines) + "\n"


def report(tag_dir: Path, expected: list[tuple[str, int]] | None = None, baseline: Path | None = None) -> int:
    """Merge the tag's per-seed files into its table and plot; prints them. Returns 1 when something was
    left out or nothing is there, else 0. ``baseline``: another tag's folder whose runs of the modes this
    tag lacks join the table and the paired comparison (they must share the tag's settings and budget)."""
    docs, problems = merge(tag_dir, [e for e in expected or [] if baseline is None or e[0] in _modes(tag_dir)] or None)
    if baseline is not None:
        extra, extra_problems = merge(baseline)
        have = {d["mode"] for d in docs}
        extra = [d for d in extra if d["mode"] not in have]
        ref = docs[0] if docs else None
        for d in extra:
            if ref is not None and (d["settings"] != ref["settings"] or d["budget"] != ref["budget"]):
                problems.append(f"{shown(seed_path(baseline, d['mode'], d['seed']))}: other settings or budget than "
                                f"{shown(tag_dir)}'s runs; left out of the comparison")
            else:
                docs.append(d)
        problems += extra_problems
        order = {"grpo": 0, "static": 1, "crl": 2}
        docs.sort(key=lambda d: (order.get(d["mode"], 9), d["mode"], d["seed"]))
    for p in problems:
        print(f"problem: {p}", file=sys.stderr)
    if not docs:
        print(f"no per-seed results in {tag_dir}; run one: "
              f"{run_command(tag_dir.name, 'grpo', 0, {'steps': DEFAULT_STEPS})}", file=sys.stderr)
        return 1
    text = table(docs, problems)
    (tag_dir / "table.md").write_text(text)
    plot(docs, tag_dir / "plot.png")
    print(text, end="")
    print(f"wrote {tag_dir / 'table.md'} and {tag_dir / 'plot.png'}")
    return 1 if problems else 0


def _modes(tag_dir: Path) -> set[str]:
    """The modes a tag's folder has a per-seed file of."""
    return {p.name.split("-seed")[0] for p in tag_dir.glob("*-seed*.json")}


def import_results(path: Path, tag: str) -> list[Path]:
    """Split a results file of the earlier layout (one per tag, ``runs`` a list) into per-seed files of
    ``tag``. Their host was not recorded then: each gets the file's own note on its machine, if any."""
    try:
        saved = json.loads(path.read_text())
        runs = saved["runs"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not a results file of benchmarks/train_cpu.py ({type(e).__name__}: {e})") from None
    # files written before the trainer's --env became --tasks have ``env``; before ``device`` existed, the CPU
    settings = {("tasks" if k == "env" else k): v for k, v in saved.get("settings", {}).items()}
    settings.setdefault("device", "cpu")
    minutes = float(saved.get("minutes") or 0)
    budget = {"minutes": minutes, "steps": settings.get("steps")} if minutes else {"steps": settings.get("steps")}
    written = []
    for row in runs:
        note = row.get("machine") or "not recorded (imported from the one-file-per-tag layout)"
        host = {"note": note, "imported_from": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)}
        written.append(write_seed_result(RESULTS / tag, tag, row, settings, budget, int(saved.get("jobs", 1)), host,
                                         git_sha=None, written=None, imported=saved.get("schema_version", "1.0")))
    return written


# ---------------------------------------------------------------------------------------- plot
def plot(docs: list[dict], path: Path) -> None:
    """The held-out curves by training step (steps, not minutes: the runs' hosts differ), the per-step
    diagnostics and, for crl/static runs, the extractor's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [d["run"] for d in docs]
    settings = docs[0]["settings"]
    crl = [r for r in rows if r.get("extractor_reward") or r.get("extractor_valid_rate") or r.get("extractor_meta_reward")]
    diag = [r for r in rows if any((r.get("diagnostics") or {}).values())]
    panels = 1 + bool(diag) + bool(crl)
    fig, axes = plt.subplots(1, panels, figsize=(6 + 5 * (panels - 1), 4.5), squeeze=False,
                             gridspec_kw={"width_ratios": [3] + [2] * (panels - 1)})
    ax, rest = axes[0][0], list(axes[0][1:])
    if diag:
        axd = rest.pop(0)
        for r in diag:
            d = r["diagnostics"]
            for key, style, label in (("policy_entropy", "-", "action entropy (nats)"),
                                      ("signal_groups", ":", "groups with signal"),
                                      ("kl_ref", "--", "KL to untrained")):
                if d.get(key):
                    axd.plot(*zip(*d[key], strict=True), linestyle=style, label=f"{r['mode']} s{r['seed']}: {label}")
        axd.set_xlabel("training step")
        axd.set_title("the policy over training (per step)", fontsize=9)
        axd.grid(alpha=0.3)
        axd.legend(fontsize=6)
    ax2 = rest.pop(0) if crl else None
    for doc, r in zip(docs, rows, strict=True):
        host = doc["host"].get("cpu_model") or "host not recorded"
        step_s = f", {r['step_s_median']:.0f} s/step" if r.get("step_s_median") else ""
        pts = [(e["step"], 100 * e["success"]) for e in r["evals"]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"{r['mode']} seed {r['seed']} ({host}{step_s})")
        exp = [(e["step"], 100 * e["with_experience"]) for e in r["evals"] if "with_experience" in e]
        if exp:
            ax.plot(*zip(*exp, strict=True), marker="x", linestyle="--", label=f"{r['mode']} seed {r['seed']} (with exp.)")
    device = settings.get("device", "cpu")
    ax.set_xlabel("training step (evaluations: 64 held-out seeds)")
    ax.set_ylabel("held-out success % (64 seeds, temperature 1)")
    ax.set_title(f"SmolLM2-135M on {settings['tasks']} ({device.upper()}, lr {settings['lr']}, {settings.get('ppo-epochs', 1)} PPO epochs)",
                 fontsize=9)
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if crl:
        for r in crl:
            if r.get("extractor_reward"):
                ax2.plot(*zip(*r["extractor_reward"], strict=True), marker="o",
                         label=f"{r['mode']} seed {r['seed']}: CISPO batch meta-reward")
            if r.get("extractor_meta_reward"):
                steps, rewards, _ = zip(*r["extractor_meta_reward"], strict=True)
                ax2.plot(steps, rewards, marker=".", label=f"{r['mode']} seed {r['seed']}: meta-reward so far (±1)")
            if r.get("extractor_valid_rate"):
                ax2.plot(*zip(*r["extractor_valid_rate"], strict=True), linestyle="--",
                         label=f"{r['mode']} seed {r['seed']}: valid-operation rate so far")
        ax2.set_xlabel("training step")
        ax2.set_title("the extractor over training (static: frozen)", fontsize=9)
        ax2.set_ylim(-1.05, 1.05)
        ax2.axhline(0, color="grey", linewidth=0.5)
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_runs(modes: str, seeds: str) -> list[tuple[str, int]]:
    """(mode, seed) pairs, seed-major (so with --jobs 2 each mode's runs share the machine with another's)."""
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds {seeds!r}: expected integers separated by commas, e.g. --seeds 3") from None
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in mode_list if m not in ("grpo", "static", "crl")]
    if bad or not mode_list or not seed_list:
        raise ValueError(f"--modes {modes!r} --seeds {seeds!r}: need modes among grpo, static, crl and at least one seed")
    return [(m, s) for s in seed_list for m in mode_list]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default=None, help="comma list of grpo, static, crl (default: grpo)")
    p.add_argument("--seeds", default=None, help="training seeds, e.g. 3 (one seed per invocation; default: 0)")
    p.add_argument("--steps", type=int, default=None, help=f"training steps per run (default {DEFAULT_STEPS}; "
                   "with --minutes: a cap, default 1000)")
    p.add_argument("--minutes", type=float, default=0.0,
                   help="train for this many minutes instead of a number of steps (evaluations excluded)")
    p.add_argument("--jobs", type=int, default=2, help="runs at once (they share the cores)")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "train_cpu", help="run folders (resumed if present)")
    p.add_argument("--report", action="store_true",
                   help="only merge the tag's per-seed result files into its table and plot")
    p.add_argument("--import-results", type=Path, metavar="FILE",
                   help="split a results file of the earlier one-file-per-tag layout into per-seed files of --tag")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting, e.g. --set lr=2e-3 --set ppo-epochs=2 (use with --tag)")
    p.add_argument("--baseline-tag", default=None, metavar="TAG",
                   help="with --report: also pair this tag's runs of the modes the tag lacks (e.g. --tag equal_steps "
                   "--baseline-tag default: crl and static against the committed grpo seeds)")
    p.add_argument("--tag", default=DEFAULT_TAG,
                   help="a name for this variant: runs in <work>/<tag>/, results in benchmarks/results/train_cpu/<tag>/")
    args = p.parse_args(argv)
    if not args.tag or "/" in args.tag or args.tag.startswith("."):
        p.error(f"--tag {args.tag!r}: a plain folder name, e.g. --tag robust")
    tag_dir = RESULTS / args.tag
    try:
        runs = parse_runs(args.modes or "grpo", args.seeds or "0")
    except ValueError as e:
        p.error(str(e))
    if args.import_results:
        for path in import_results(args.import_results, args.tag):
            print(f"wrote {path}")
        return report(tag_dir)
    if args.report:
        return report(tag_dir, runs if args.modes or args.seeds else None,
                      RESULTS / args.baseline_tag if args.baseline_tag else None)
    if args.jobs < 1 or args.minutes < 0 or (args.steps is not None and args.steps < 1):
        p.error("--jobs and --steps must be >= 1 and --minutes >= 0")
    settings = dict(SETTINGS)
    settings["steps"] = args.steps or (1000 if args.minutes else DEFAULT_STEPS)
    budget = {"minutes": args.minutes, "steps": settings["steps"]} if args.minutes else {"steps": settings["steps"]}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in SETTINGS or key == "steps":
            p.error(f"--set {item!r}: expected KEY=VALUE with KEY one of {sorted(set(SETTINGS) - {'steps'})} "
                    "(--steps sets the steps)")
        settings[key] = value
    jobs = min(args.jobs, len(runs))  # a lone run gets every core
    threads = max(1, (os.cpu_count() or 2) // jobs)
    host = host_record(threads)
    work = args.work / args.tag

    def one(run: tuple[str, int]) -> dict:
        mode, seed = run
        row = run_one(mode, seed, args.minutes, work / f"{mode}-seed{seed}", settings, threads)
        if row["evals"]:  # a run that never evaluated has nothing to merge; its log says why
            print(f"wrote {write_seed_result(tag_dir, args.tag, row, settings, budget, jobs, host)}", flush=True)
        else:
            print(f"{mode} seed {seed}: no evaluation recorded (exit {row['returncode']}); see "
                  f"{work / f'{mode}-seed{seed}' / 'log.txt'}", file=sys.stderr, flush=True)
        return row

    with ThreadPoolExecutor(jobs) as pool:
        rows = list(pool.map(one, runs))
    status = report(tag_dir)
    return status if all(r["returncode"] == 0 and r["evals"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
