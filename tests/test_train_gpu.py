"""The trainer's GPU path: vLLM rollouts, a LoRA learner on the GPU, weight sync by adapter (marked gpu)."""

from __future__ import annotations

import asyncio
import json

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402

pytestmark = pytest.mark.gpu

DOORS = "test/Doors-v0"
if DOORS not in gym.registry:
    gym.register(DOORS, entry_point="tests.test_rl_bandit:DoorEnv", max_episode_steps=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from crl_agent.llm.vllm_backend import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"the vllm backend cannot run here: {why}")
    return str(build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "tiny", seed=0))


def test_vllm_serves_each_trained_adapter_and_stamps_its_version(tiny, tmp_path):
    from crl_agent.llm import make_llm
    from crl_agent.train import main

    args = ["--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "grpo", "--model", tiny, "--backend", "vllm",
            "--device", "cuda", "--dtype", "float32", "--vllm-memory", "0.3", "--groups", "2", "--group-size", "8",
            "--lora-rank", "4", "--lr", "0.05", "--score-norm", "mean", "--eval-every", "0", "--eval-episodes", "8"]
    assert main([*args, "--steps", "3"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["rollout_tokens_per_s"] > 0 for r in rows)
    updates = int(rows[-1]["actor/version"])
    assert updates >= 1, rows
    # the exported adapter, served by vLLM, scores as the learner's weights do (rebuilt by transformers)
    messages = [{"role": "user", "content": "Which door? red, blue, green or yellow"}]
    doors = ["red", "blue", "green", "yellow"]
    served = make_llm("vllm", tiny, adapter=str(tmp_path / "adapters" / "actor"), gpu_memory_utilization=0.3,
                      enforce_eager=True)
    ref = make_llm("transformers", tiny, dtype="float32", adapter=str(tmp_path / "adapters" / "actor"))

    async def both():
        return await served.score_full(messages, doors), await ref.score_full(messages, doors)

    got, want = asyncio.run(both())
    assert got.logprobs == pytest.approx(want.logprobs, abs=0.05)
    assert main([*args, "--steps", "4", "--resume"]) == 0  # the restored adapter is served again


def test_two_gpus_under_torchrun_each_run_a_vllm_replica_and_average_gradients(tiny, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.net_support import free_port

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "tests.dist_train",
           "--out", str(tmp_path), "--quiet", "--tasks", DOORS, "--mode", "grpo", "--model", tiny, "--backend", "vllm",
           "--device", "cuda", "--dtype", "float32", "--vllm-memory", "0.3", "--groups", "2", "--group-size", "8",
           "--lora-rank", "4", "--lr", "0.05", "--score-norm", "mean", "--eval-every", "0", "--eval-episodes", "8",
           "--steps", "3"]
    done = subprocess.run(cmd, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["episodes"] == 16 and r["processes"] == 2 for r in rows)
