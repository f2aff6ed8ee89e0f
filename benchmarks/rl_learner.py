"""Learner step costs on a real small model: candidate scoring methods and LoRA update steps.

Measured in one run on the same model and inputs (SmolLM2-135M by default, bf16, LoRA r=16 on
q/k/v/o as in DESIGN section 9), medians over alternating rounds so that load from other
processes hits every variant:

- scoring ``--batch`` decisions of ``--candidates`` candidates after a ~``--prompt-tokens`` prompt
  without gradient: the baseline is one full forward per candidate (prompt + candidate, no shared
  prefix); ``cache`` (prompt prefill, candidates continue its key-value cache) and ``packed`` (one
  sequence per decision with a 4D mask, all decisions in one forward) report their speed-up;
- one :class:`PolicyLearner` update (forward, backward, AdamW) on ``--batch`` score-mode decisions,
  and on ``--batch`` generate-mode samples of ``--response-tokens`` tokens after the same prompt.

Threads default to 1 (see benchmarks/llm_batching.py: two OpenMP threads spin against each other on a
shared machine); pass ``--threads 2`` on an idle one.

Run: ``python benchmarks/rl_learner.py [--model DIR] [--dtype bf16|fp32] [--full] [--threads N] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from crl_agent.rl import PolicyLearner, TurnSample, add_lora, batch_candidate_logprobs, candidate_logprobs

MOVES = ["north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest"]


def build_inputs(tok, prompt_tokens: int, n_candidates: int, batch: int):
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    rows = "\n".join(f"Row {i}: |  .  .  .  #  .  .  @  .  >  |" for i in range(200))
    prompts = []
    for b in range(batch):
        text = f"Episode {b}. You are in a dungeon room; find the staircase down (>).\n{rows}"
        ids = tok.apply_chat_template(
            [{"role": "system", "content": "You play MiniHack."}, {"role": "user", "content": text}],
            add_generation_prompt=True, tokenize=True, return_dict=False,
        )
        prompts.append(list(ids)[-prompt_tokens:])
    cands = [tok.encode(m, add_special_tokens=False) + [eot] for m in (MOVES * 4)[:n_candidates]]
    return prompts, cands


def timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: the packaged SmolLM2-135M)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--candidates", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--response-tokens", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from crl_agent.llm.models import ensure_smollm2

    path = args.model or ensure_smollm2()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    if not args.full:
        model = add_lora(model, r=16)
    prompts, cands = build_inputs(tok, args.prompt_tokens, args.candidates, args.batch)
    print(f"model {path} ({args.dtype}, {'full' if args.full else 'LoRA r=16'}), {args.threads} thread(s); "
          f"{args.batch} decisions x {args.candidates} candidates after {len(prompts[0])} prompt tokens")

    def naive():
        with torch.no_grad():
            for p in prompts:
                for c in cands:
                    model(input_ids=torch.tensor([p + c]), use_cache=False)

    def method(name):
        def run():
            with torch.no_grad():
                if name == "cache":
                    for p in prompts:
                        candidate_logprobs(model, p, cands, method="cache")
                else:
                    batch_candidate_logprobs(model, prompts, [cands] * len(prompts), method="packed")
        return run

    score = {"naive": [], "cache": [], "packed": []}
    for _ in range(args.rounds):  # alternate, so background load hits every variant alike
        score["naive"].append(timed(naive, 1))
        score["cache"].append(timed(method("cache"), 1))
        score["packed"].append(timed(method("packed"), 1))
    base = statistics.median(score["naive"])
    print("scoring without gradient, per decision:")
    for name, ts in score.items():
        t = statistics.median(ts)
        print(f"  {name:7s} {1000 * t / args.batch:8.1f} ms   x{base / t:5.2f} vs one forward per candidate")

    learner = PolicyLearner(model, lr=1e-4, token_budget=1 << 20)
    with torch.no_grad():
        scores = batch_candidate_logprobs(model, prompts, [cands] * len(prompts))
    score_samples = [
        TurnSample(p, (1.0 if i % 2 else -1.0), [torch.log_softmax(s.float(), -1)[0].item()], candidate_ids=cands, chosen=0)
        for i, (p, s) in enumerate(zip(prompts, scores, strict=True))
    ]
    gen = torch.Generator().manual_seed(0)
    responses = [torch.randint(100, 20000, (args.response_tokens,), generator=gen).tolist() for _ in prompts]
    gen_samples = [
        TurnSample(p, (1.0 if i % 2 else -1.0), [-5.0] * len(r), response_ids=r)
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True))
    ]
    learner.update(score_samples)  # warm-up: allocates gradients and optimiser state
    steps = {"score": [], "generate": []}
    for _ in range(args.rounds):
        for kind, samples in (("score", score_samples), ("generate", gen_samples)):
            for s in samples:
                s.policy_version = learner.version
            steps[kind].append(learner.update(samples)["time_s"])
    print("one update (forward + backward + AdamW):")
    for kind, ts in steps.items():
        t = statistics.median(ts)
        print(f"  {kind:8s} {t:7.2f} s for {args.batch} samples ({t / args.batch:.2f} s each)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")


if __name__ == "__main__":
    main()
