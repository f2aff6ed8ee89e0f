"""benchmarks/step_profile.py: a step's parts, their tokens and FLOPs, and the ratio to the matmul limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import step_profile  # noqa: E402


def test_flops_count_the_decoder_per_token_and_the_output_layer_only_where_scored():
    sizes = {"decoder": 1000, "trainable": 10, "hidden": 4, "vocab": 50}
    assert step_profile.forward_flops(sizes, tokens=3, logit_rows=2) == 2 * 1000 * 3 + 2 * 4 * 50 * 2
    # backward: input gradients (as the forward) plus the trainable weights' gradients
    assert step_profile.backward_flops(sizes, 3, 2) == step_profile.forward_flops(sizes, 3, 2) + 2 * 10 * 3


def test_the_table_divides_each_part_by_the_steps_and_prices_it_at_the_matmul_rate():
    acc = step_profile.Account()
    acc.sizes = {"actor": {"decoder": 10**8, "trainable": 10**6, "hidden": 500, "vocab": 1000}}
    acc.add("rollout prefill+scoring", 8.0, tokens=20_000, padded_tokens=24_000, logit_rows=1_000)
    acc.add("rollout wall", 14.0)
    acc.add("update forward", 3.0, tokens=5_000, padded_tokens=6_000, logit_rows=100)
    acc.add("eval episode", 30.0, episodes=10)
    acc.add("eval prefill+scoring", 20.0, tokens=40_000, logit_rows=0)
    rows = step_profile.table(acc, gflops=1000.0, steps=2)
    pre = rows["rollout prefill+scoring"]
    flops = 2 * 10**8 * 20_000 + 2 * 500 * 1000 * 1_000
    assert pre["seconds"] == 4.0 and pre["tokens"] == 10_000 and pre["padded_tokens"] == 12_000
    assert pre["limit_s"] == pytest.approx(flops / 2 / 1e12) and pre["x_limit"] == pytest.approx(8.0 / (flops / 1e12))
    assert rows["rollout other"]["seconds"] == 3.0  # the rollouts' wall time the forwards do not explain
    assert rows["old-log-prob pass"]["seconds"] == 0.0
    assert rows["eval episode"]["seconds"] == 3.0 and rows["eval episode"]["tokens"] == 4_000  # per episode


def test_host_slug_is_a_file_name():
    assert step_profile.host_slug("Intel(R) Xeon(R) Platinum 8488C") == "intel-r-xeon-r-platinum-8488c"
    assert step_profile.host_slug("AMD EPYC 9R14 96-Core Processor") == "amd-epyc-9r14-96-core-processor"


def test_one_profiled_step_of_the_tiny_model_accounts_for_its_parts(tiny):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "step_profile.py"), "--one", "grpo", "--steps", "2",
           "--eval-episodes", "2", "--gflops", "100"]
    for kv in (f"model={tiny}", "dtype=float32", "groups=1", "group-size=2", "turns-per-episode=1",
               "dynamic-sampling=0", "max-steps=3", "lora-rank=4", "threads=1", "diagnose-every=1",
               "entropy-coef=0.01"):  # an entropy term: every turn trains, whatever the tiny model's outcomes
        cmd += ["--set", kv]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("STEP_PROFILE ")).split(" ", 1)[1])
    parts = run["parts"]
    for name in ("rollout prefill+scoring", "update forward", "update backward", "diagnostics", "eval episode"):
        assert parts[name]["seconds"] > 0 and parts[name]["tokens"] > 0 and parts[name]["x_limit"] > 0, name
    assert parts["env steps"]["steps_played"] >= 1 and parts["old-log-prob pass"]["seconds"] == 0.0
    # the update's forward covers exactly the trained turns' tokens, padding apart
    assert parts["update forward"]["padded_tokens"] >= parts["update forward"]["tokens"]
    assert [s["step"] for s in run["steps"]] == [1, 2] and all(s["rss_mb"] > 0 for s in run["steps"])


def test_hostcheck_estimates_from_this_cpus_committed_profile_where_there_is_one(tmp_path, monkeypatch):
    import host

    monkeypatch.setattr(host, "STEP_PROFILES", tmp_path)
    monkeypatch.setattr(host, "ROOT", tmp_path)
    assert host.profiled_times("Some CPU 9000") is None
    steps = [{"step": 1, "time_s": 50.0}, {"step": 2, "time_s": 70.0}]
    record = {"date": "2026-12-08", "load_average_start": 1.0, "load_average_end": 2.0,
              "runs": [{"mode": "grpo", "steps": steps, "parts": {"eval episode": {"seconds": 2.0}}},
                       {"mode": "crl", "steps": [{"step": 1, "time_s": 90.0}], "parts": {}}]}
    (tmp_path / "some-cpu-9000.json").write_text(json.dumps(record))
    got = host.profiled_times("Some CPU 9000")
    # the profile's early crl steps (1.5x) understate a whole run's: the whole-run factor stands
    assert got["step_s"] == 60.0 and got["eval_s"] == 64 * 2.0 and got["crl_step_factor"] == host.EXPERIENCE_STEP_FACTOR
    record["runs"][1]["steps"] = [{"step": 1, "time_s": 60.0 * (host.EXPERIENCE_STEP_FACTOR + 1)}]
    (tmp_path / "some-cpu-9000.json").write_text(json.dumps(record))
    got = host.profiled_times("Some CPU 9000")  # where the profile's factor is the larger, it is used
    assert got["crl_step_factor"] == host.EXPERIENCE_STEP_FACTOR + 1
    rows = host.benchmark_costs(got["step_s"], got["eval_s"], experience_step_factor=got["crl_step_factor"])
    assert rows[1]["seconds"] == (32 * (host.EXPERIENCE_STEP_FACTOR + 1) * 60.0
                                  + host.EVALS_PER_RUN * host.EXPERIENCE_EVAL_FACTOR * 128.0)


def test_the_instrumented_methods_keep_the_signatures_they_wrap(monkeypatch):
    """The profile wraps private engine and learner methods; a wrapper whose parameters drift from the method's
    (the engine's ``_join`` gained ``room``) breaks a real crl step, which no tiny grpo step reaches."""
    import inspect

    import crl_agent.train as T
    from crl_agent.llm.hf_engine import ForwardEngine
    from crl_agent.rl.learner import PolicyLearner
    from crl_agent.rollout import PoolSlot

    owners = {ForwardEngine: ("_run_group", "_decode", "_join"), PolicyLearner: ("_forward", "_backward", "divergence")}
    before = {(cls, name): getattr(cls, name) for cls, names in owners.items() for name in names}
    for cls, name in before:  # instrument() replaces them: monkeypatch puts them back afterwards
        monkeypatch.setattr(cls, name, before[cls, name])
    monkeypatch.setattr(PoolSlot, "step", PoolSlot.step)
    for name in ("build_run", "rollout", "actor_update", "evaluate", "held_out_evaluation"):
        if hasattr(T, name):
            monkeypatch.setattr(T, name, getattr(T, name))
    step_profile.instrument(step_profile.Account())
    for (cls, name), original in before.items():
        wrapped = getattr(cls, name)
        assert wrapped is not original, name
        assert list(inspect.signature(wrapped).parameters) == list(inspect.signature(original).parameters), name
