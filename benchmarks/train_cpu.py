"""CPU learning run: does Complementary RL (or plain GRPO) raise held-out success within a time budget?

For each mode (``grpo``, ``crl``) and training seed, it trains the embedded SmolLM2-135M (score mode,
LoRA, bf16 where the CPU has it) on a task whose layout varies by seed, with ``python -m crl_agent.train``'s
loop and a wall-clock budget, and evaluates the pure policy (temperature 1, no exploration) on held-out
seeds never trained on, before and after. It writes ``benchmarks/results/train_cpu.json`` (every
evaluation, the per-step diagnostics, the settings and the verdict per mode: every seed's held-out gain at
least +10 points and their median at least +20) and ``benchmarks/results/train_cpu.png`` (the curves side by
side, and per step the action entropy, the share of groups with signal and the KL to the untrained policy).
``--steps N`` trains every run for exactly N steps instead (equal steps; the time each took is reported).

Runs go in parallel as subprocesses (one torch thread each), so on 2 cores ``--jobs 2`` trains two at once.

Run: ``python benchmarks/train_cpu.py [--modes grpo,crl[,static]] [--seeds 0,1] [--minutes 30] [--jobs 2]``;
a variant: ``--tag NAME --set lr=2e-3 --set ppo-epochs=2`` (runs in ``runs/train_cpu/NAME``, results in
``train_cpu_NAME.{json,png}``; ``--set device=cuda`` trains on a GPU); ``--report`` rebuilds the results
from finished run folders, ``--plot`` only redraws the PNG from the results JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

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
    "steps": 1000,
    # the robustness tools of the trainer, off as in the paper (e.g. --set dynamic-sampling=4 --tag robust)
    "dynamic-sampling": 0,
    "kl-coef": 0.0,
    "entropy-coef": 0.0,
    # where each run trains and scores: --set device=cuda runs the same comparison on a GPU (equal steps:
    # the same algorithm and budget in steps, so its results answer the same question, faster)
    "device": "cpu",
}
# crl mode on this CPU: 2 episodes of each group distilled (one from each half; distilling all 16 a step
# made a step 2.6x slower than grpo's, so crl got 13-14 steps in 30 minutes against grpo's 32), batched
# 8 at a time, merges once a step between rollouts, the extractor trained once 16 of its calls have a
# meta-reward (64 needs more steps than 30 minutes give), and no search-and-ask (each ask is a serial
# 160-token generation that the actor waits for, and the 135M extractor's answers were noise: "The
# Miracle King is a character from a fictional work").
CRL_SETTINGS = {"distil-per-group": 2, "distil-workers": 8, "merge-every": 1, "extractor-batch": 16,
                "agent-arg": ["max_tool_calls=0"]}


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
    if metrics and mode in ("crl", "static"):
        last = metrics[-1]
        valid, bad = last.get("extractor/valid_ops", 0), last.get("extractor/malformed", 0)
        row["extractor"] = {
            "distillations": last.get("extractor/distillations"), "valid_ops": valid, "malformed": bad,
            "valid_operation_rate": valid / (valid + bad) if valid + bad else None,
            "bank_entries": last.get("bank_entries"),
            "updates": sum(1 for m in metrics if m.get("extractor/updated")),
        }
        row["extractor_reward"] = [(m["step"], m["extractor/reward"]) for m in metrics if "extractor/reward" in m]
        # the mean meta-reward over every call rewarded so far, after each step (whether or not it trained)
        row["extractor_meta_reward"] = [(m["step"], m["extractor/meta_reward"], m["extractor/rewarded_calls"])
                                        for m in metrics if "extractor/meta_reward" in m]
        # the valid-operation rate so far, after each step (the counters are cumulative)
        row["extractor_valid_rate"] = [
            (m["step"], m.get("extractor/valid_ops", 0) / total)
            for m in metrics if (total := m.get("extractor/valid_ops", 0) + m.get("extractor/malformed", 0))]
    return row


def read_results(path: Path) -> dict:
    """A results file, its settings named as now (files written before the trainer's --env became --tasks
    have ``env``; those written before ``device`` was a setting ran on the CPU)."""
    saved = json.loads(path.read_text())
    saved["settings"] = {("tasks" if k == "env" else k): v for k, v in saved.get("settings", {}).items()}
    saved["settings"].setdefault("device", "cpu")
    return saved


def keep_earlier(rows: list[dict], path: Path, settings: dict, minutes: float, jobs: int) -> list[dict]:
    """The runs of an earlier results file under this name that this invocation did not (re)make, e.g. the
    grpo runs when ``--modes crl`` follows ``--modes grpo`` with the same tag; none if its settings differ."""
    if not path.exists():
        return []
    earlier = read_results(path)
    if (earlier.get("settings"), earlier.get("minutes"), earlier.get("jobs")) != (settings, minutes, jobs):
        print(f"{path.name}: earlier runs made with other settings are replaced")
        return []
    made = {(r["mode"], r["seed"]) for r in rows}
    return [r for r in earlier["runs"] if (r["mode"], r["seed"]) not in made]


def plot(rows: list[dict], path: Path, settings: dict, jobs: int = 2) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    for r in rows:
        pts = [(e.get("train_time_s", 0.0) / 60, 100 * e["success"]) for e in r["evals"]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"{r['mode']} seed {r['seed']} (w/o exp.)")
        exp = [(e.get("train_time_s", 0.0) / 60, 100 * e["with_experience"]) for e in r["evals"] if "with_experience" in e]
        if exp:
            ax.plot(*zip(*exp, strict=True), marker="x", linestyle="--", label=f"{r['mode']} seed {r['seed']} (with exp.)")
    device = settings.get("device", "cpu")
    if device == "cpu":
        share = "2 cores shared by 2 runs" if jobs > 1 else "2 cores, one run at a time"
    else:
        share = f"{jobs} runs at once on one GPU ({device})" if jobs > 1 else f"one run at a time on {device}"
    ax.set_xlabel(f"training minutes ({share}; evaluations not counted)")
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="grpo,crl")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--minutes", type=float, default=30.0, help="training budget per run (evaluations excluded)")
    p.add_argument("--steps", type=int, default=0,
                   help="equal steps instead of equal time: every run trains exactly this many steps (its time is "
                        "reported); --minutes is then ignored")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "train_cpu", help="run folders (resumed if present)")
    p.add_argument("--report", action="store_true", help="only rebuild the results from the run folders in --work")
    p.add_argument("--plot", action="store_true", help="only redraw the PNG from the results JSON (no run folders needed)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting, e.g. --set lr=2e-3 --set ppo-epochs=2 (use with --tag)")
    p.add_argument("--tag", default="", help="a name for this variant: runs in <work>/<tag>/, results in train_cpu_<tag>.*")
    args = p.parse_args()
    settings = dict(SETTINGS)
    if args.steps:
        settings["steps"], args.minutes = args.steps, 0.0
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in SETTINGS:
            p.error(f"--set {item!r}: expected KEY=VALUE with KEY one of {sorted(SETTINGS)}")
        settings[key] = value
    work = args.work / args.tag if args.tag else args.work
    name = f"train_cpu_{args.tag}" if args.tag else "train_cpu"
    # seed-major, so with --jobs 2 each mode's runs share the machine with the other mode's
    jobs = [(m, int(s)) for s in args.seeds.split(",") for m in args.modes.split(",")]
    if args.plot:
        saved = read_results(RESULTS / f"{name}.json")
        plot(saved["runs"], RESULTS / f"{name}.png", saved["settings"], saved["jobs"])
        print(f"wrote {RESULTS / (name + '.png')}")
        return
    if args.report:
        rows = [summarise(m, s, work / f"{m}-seed{s}") for m, s in jobs if (work / f"{m}-seed{s}").exists()]
    else:
        with ThreadPoolExecutor(args.jobs) as pool:
            threads = max(1, (os.cpu_count() or 2) // args.jobs)
            rows = list(pool.map(lambda j: run_one(j[0], j[1], args.minutes, work / f"{j[0]}-seed{j[1]}",
                                                   settings, threads), jobs))
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = keep_earlier(rows, RESULTS / f"{name}.json", settings, args.minutes, args.jobs) + rows
    verdict = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        gains = sorted(r.get("gain_points", float("nan")) for r in rows if r["mode"] == mode)
        median = gains[len(gains) // 2] if len(gains) % 2 else (gains[len(gains) // 2 - 1] + gains[len(gains) // 2]) / 2
        verdict[mode] = {"gains": gains, "median": median, "every seed >= +10": all(g >= 10 for g in gains),
                         "median >= +20": median >= 20}
    out = {"schema_version": "1.0", "tag": args.tag, "settings": settings, "crl_settings": CRL_SETTINGS,
           "minutes": args.minutes, "jobs": args.jobs,
           "runs": rows, "verdict (held-out gain in points)": verdict}
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    plot(rows, RESULTS / f"{name}.png", settings, args.jobs)
    print(f"{'mode':6s} {'seed':>4s} {'steps':>5s} {'minutes':>7s} {'before':>7s} {'after':>7s} {'gain':>13s} "
          f"{'with experience':>16s}")
    nan = float("nan")
    for r in rows:
        wexp = (f"{100 * r['before_with_experience']:5.1f}% -> {100 * r['after_with_experience']:5.1f}%"
                if "after_with_experience" in r else "")
        print(f"{r['mode']:6s} {r['seed']:4d} {r['train_steps']:5d} {r['train_minutes']:7.1f} "
              f"{100 * r.get('before', nan):6.1f}% {100 * r.get('after', nan):6.1f}% "
              f"{r.get('gain_points', nan):+6.1f} +- {r.get('gain_se_points', nan):4.1f} {wexp:>16s}")
        if r.get("extractor"):
            print(f"       extractor: {r['extractor']}, reward by step {r['extractor_reward']}")
    for mode, v in verdict.items():
        print(f"{mode}: gains {', '.join(f'{g:+.1f}' for g in v['gains'])}; median {v['median']:+.1f}; "
              f"every seed >= +10: {v['every seed >= +10']}; median >= +20: {v['median >= +20']}")
    print(f"wrote {RESULTS / (name + '.json')} and {RESULTS / (name + '.png')}")


if __name__ == "__main__":
    main()
