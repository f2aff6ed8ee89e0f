"""A real training run for the viewer's tests: ``crl_agent.train`` with the tiny model on MiniHack Room-Random.

Two steps of GRPO (one group of 8, half the moves uniform, lr high enough that the policy moves), held-out
evaluations at steps 0 and 2 on 4 seeds: about 40 s on 2 shared cores. Its ``evals/`` folders are what the
trainer writes (:mod:`crl_agent.train_evals`); the same held-out seed is played differently at step 0 and 2.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

TASK = "crl/MiniHack-Room-Random-5x5-Short-v0"


def train_run(out: Path, tiny: str, mode: str = "grpo", steps: int = 2, eval_every: int = 2) -> Path:
    """Train for real into ``out`` (a run folder) and return it."""
    import torch

    from crl_agent.train import TrainConfig, train

    extra = dict(embedder="hash", extractor_warmup=1, extractor_batch=1, distil_workers=2, distil_max_tokens=48,
                 agent_args={"max_tool_calls": 0}) if mode != "grpo" else {}
    cfg = TrainConfig(tasks=TASK, mode=mode, model=tiny, dtype="float32", steps=steps, groups=1, group_size=8,
                      lora_rank=4, lr=3e-2, explore=0.5, history=2, turns_per_episode=4, eval_every=eval_every,
                      eval_episodes=4, dynamic_sampling=0, seed=0, **extra)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # in a thread of its own: a browser test's Playwright keeps an event loop running in this one
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, train(cfg, out, quiet=True)).result()
    finally:
        torch.set_num_threads(threads)
    return out
