"""Request batching in the transformers backend: tokens/s at batch 1 against 8 concurrent requests.

Both are measured in the same run on the same model and prompts: the baseline sends N requests
one after another (each its own forward passes), the batched run sends the same N requests at
once, 8 at a time, through the backend's batcher. Every request generates exactly
``--max-tokens`` tokens (the end-of-turn token is disabled), so both runs do the same work.
Rounds alternate (sequential, batched, sequential, ...) so that load from other processes hits
both; the medians are compared.

Target from the issue: batched >= 3x the batch-1 rate (DESIGN: ~12 tok/s vs ~40 tok/s for
SmolLM2-135M on 2 cores).

Threads default to 1: while other processes share the cores, two OpenMP threads spin against
each other and decoding gets several times slower (measured here: 2.6 tok/s with 2 threads
against 7.5 tok/s with 1 at batch 1). Pass ``--threads 2`` on an idle machine.

Run: ``python benchmarks/llm_batching.py [--model DIR] [--threads 2] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from crl_agent.llm import SamplingParams
from crl_agent.llm.transformers_backend import TransformersLLM

PROMPTS = [
    "Describe a warehouse robot pushing boxes.",
    "List three rules of Sokoban.",
    "Write a short note about mazes.",
    "What makes a good plan in a puzzle?",
    "Explain why corners are dangerous for boxes.",
    "Give advice for exploring a dungeon.",
    "Summarise how to shop for shoes online.",
    "How do you heat an apple in a microwave?",
]


def chat(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


async def sequential(llm: TransformersLLM, n: int, max_tokens: int) -> tuple[int, float]:
    t0, tokens = time.perf_counter(), 0
    for i in range(n):
        c = await llm.chat(chat(i), SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=i))
        tokens += len(c.token_ids)
    return tokens, time.perf_counter() - t0


async def concurrent(llm: TransformersLLM, n: int, max_tokens: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    outs = await asyncio.gather(
        *(llm.chat(chat(i), SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=i)) for i in range(n))
    )
    return sum(len(c.token_ids) for c in outs), time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: the packaged SmolLM2-135M)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1; see the module docstring)")
    p.add_argument("--requests", type=int, default=8, help="requests per round (default: 8)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per request (default: 32)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: 3)")
    args = p.parse_args()

    llm = TransformersLLM(args.model, num_threads=args.threads, max_batch_size=8, batch_wait_ms=5)
    llm.eos_ids = frozenset()  # fixed-length generations: equal work in both modes
    print(f"model {llm.model_name}, torch threads {args.threads}, {args.requests} requests x {args.max_tokens} tokens")

    async def run() -> tuple[list[float], list[float]]:
        await llm.chat(chat(0), SamplingParams(max_tokens=4))  # warm-up
        seq, bat = [], []
        for r in range(args.rounds):
            tok, dt = await sequential(llm, args.requests, args.max_tokens)
            seq.append(tok / dt)
            before = llm.batch_stats.batches
            tok, dt = await concurrent(llm, args.requests, args.max_tokens)
            bat.append(tok / dt)
            calls = llm.batch_stats.batches - before
            print(f"round {r}: batch 1 {seq[-1]:6.1f} tok/s | 8 concurrent {bat[-1]:6.1f} tok/s ({calls} generate calls)")
        await llm.aclose()
        return seq, bat

    seq, bat = asyncio.run(run())
    s, b = statistics.median(seq), statistics.median(bat)
    ratio = b / s
    print(f"median: batch 1 {s:.1f} tok/s, 8 concurrent {b:.1f} tok/s, ratio {ratio:.2f}x")
    print(f"target: >= 3x: {'OK' if ratio >= 3 else 'MISSED'}")


if __name__ == "__main__":
    main()
