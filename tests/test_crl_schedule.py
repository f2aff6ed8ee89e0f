"""The benchmark's extractor schedule makes crl differ from static (issue 46 item 1).

Every crl run recorded before issue 46 made 0 extractor updates (warm-up 5, then 16 rewarded calls, then the
cooldown: never reached in 16 steps of 2 groups x 8), so "crl" equalled "static" step for step. Here the
trainer runs ``benchmarks/train_cpu.py``'s crl settings (its schedule, its distillations per group, its merges)
on the tiny model and a one-step bandit: the crl run must update its extractor, and after that its bank must
differ from the static run of the same seed, which is the same run with the extractor frozen. The actor
explores (half uniform) so that the episodes an entry guides do not all end alike: a batch whose calls all
earned the same meta-reward has zero advantages and changes no weight. The extractor's learning rate is
large (the schedule is under test, not the step size) so that one update visibly changes what it writes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from crl_agent.train import main  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOORS = "test/Doors-v0"
if DOORS not in gym.registry:
    gym.register(DOORS, entry_point="tests.test_rl_bandit:DoorEnv", max_episode_steps=1)

pytestmark = pytest.mark.usefixtures("one_thread")


def benchmark_settings() -> dict:
    spec = importlib.util.spec_from_file_location("bench_train_cpu_schedule", ROOT / "benchmarks" / "train_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {**module.SETTINGS, **module.CRL_SETTINGS}


def run(mode: str, tiny: str, out: Path, steps: int) -> list[dict]:
    s = benchmark_settings()
    schedule = ["--extractor-batch", str(s["extractor-batch"]), "--extractor-warmup", str(s["extractor-warmup"]),
                "--extractor-buffer", str(s["extractor-buffer"]),
                "--distil-per-group", str(s["distil-per-group"]), "--merge-every", str(s["merge-every"]),
                "--groups", str(s["groups"]), "--group-size", str(s["group-size"]),
                *[x for arg in s.get("agent-arg", []) for x in ("--agent-arg", arg)]]
    args = ["--out", str(out), "--quiet", "--tasks", DOORS, "--mode", mode, "--model", tiny, "--dtype", "float32",
            "--eval-episodes", "2", "--eval-every", "0", "--embedder", "hash", "--lora-rank", "4", "--steps", str(steps),
            "--distil-max-tokens", "64", "--seed", "3", "--explore", "0.5",
            "--extractor-lr", "0.05", *schedule]
    assert main(args) == 0
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def bank(out: Path) -> list[tuple[str, str]]:
    from crl_agent.experience import ExperienceBank

    b = ExperienceBank(out / "experience_bank", embedder="hash")
    try:
        return sorted((e.title, e.content) for e in b.entries())
    finally:
        b.close()


def test_the_benchmarks_schedule_trains_the_extractor_and_crl_then_differs_from_static(tiny, tmp_path):
    steps = benchmark_settings()["extractor-warmup"] + 2
    crl = run("crl", tiny, tmp_path / "crl", steps)
    static = run("static", tiny, tmp_path / "static", steps)
    updates = [r["extractor/updates"] for r in crl]
    assert updates[-1] >= 1, [(r["step"], r["extractor/buffer"], r["extractor/rewarded_calls"]) for r in crl]
    assert all(r["extractor/updates"] == 0 for r in static)
    first = updates.index(1)  # the step whose start launched the first update: its distillations ran on new weights
    assert crl[first]["extractor/loss"] is not None and crl[first]["extractor/buffer"] >= 0
    # until the extractor first trained, the two runs are the same run (same seed, same frozen extractor)
    assert [r["train_success"] for r in crl[:first]] == [r["train_success"] for r in static[:first]]
    assert bank(tmp_path / "crl") != bank(tmp_path / "static")
