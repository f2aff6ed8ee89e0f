"""Pick the CPU dtype by measuring it: bf16 where the CPU multiplies bf16 clearly faster than fp32.

CPUs with AMX or AVX512-BF16 multiply bf16 matrices several times faster than fp32 (DESIGN
section 9: about 7x on the development machine); CPUs without them emulate bf16 and are slower.
Rather than parse CPU flags, :func:`pick_cpu_dtype` times one square matmul in each dtype (best of
a few runs, about 30 ms in all) and picks bf16 only when it is at least ``min_speedup`` times as
fast. The answer is computed once per process.

The threshold sits far from both kinds of CPU: native bf16 measured 2.2x (AVX512-BF16 EPYC) to 7x (AMX
Xeon) fp32's speed, emulated bf16 about 0.06x (AVX2 EPYC). At the old threshold of 2.0 the EPYC's 2.2x
fell below it in 2 of ~7 picks on a busy machine, so a run's dtype depended on the load when it started;
1.25 keeps a wide margin on both sides.

bf16 costs precision: on the tiny test model and SmolLM2-135M, candidate log-probs move by the
amount ``tests/test_llm_score.py`` and ``benchmarks/llm_score.py`` print (documented in the
README); pass ``dtype="float32"`` where that matters more than speed.
"""

from __future__ import annotations

import functools
import time


def _best_time(fn, reps: int) -> float:
    fn()  # warm-up: first calls pay for allocation and kernel selection
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_speedup(size: int = 768, reps: int = 5) -> float:
    """How many times faster a ``size`` x ``size`` bf16 matmul runs than an fp32 one on this CPU."""
    import torch

    a = torch.randn(size, size)
    b = torch.randn(size, size)
    fp32 = _best_time(lambda: a @ b, reps)
    a16, b16 = a.bfloat16(), b.bfloat16()
    bf16 = _best_time(lambda: a16 @ b16, reps)
    return fp32 / max(bf16, 1e-9)


@functools.lru_cache(maxsize=1)
def pick_cpu_dtype(min_speedup: float = 1.25) -> str:
    """``"bfloat16"`` when a bf16 matmul is at least ``min_speedup`` x faster than fp32 here, else ``"float32"``."""
    try:
        return "bfloat16" if matmul_speedup() >= min_speedup else "float32"
    except RuntimeError:  # a torch build without CPU bf16 matmul
        return "float32"
