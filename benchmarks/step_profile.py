"""A training step's account: every part's seconds, tokens and FLOPs against this host's bf16 matmul limit.

Runs a few real steps of ``benchmarks/train_cpu.py``'s settings (``SETTINGS``, and ``CRL_SETTINGS`` for
``crl``) through ``crl_agent.train``'s own loop, each mode in a fresh process (so its resident memory is its
own), with the trainer's parts wrapped in timers, and prints for each part:

- ``rollout prefill+scoring``: the actor engine's forwards during the rollouts (prompt suffixes the prefix
  cache did not hold, and every candidate);
- ``rollout other``: the rest of the rollouts' wall time (env steps, the batcher's gaps, the agents'
  Python); ``env steps`` beside it sums the env calls' latencies (they overlap the forwards of other
  episodes, so it is not a share of the wall time);
- ``old-log-prob pass``: a no-gradient forward for PPO's old log-probs. With one PPO epoch on the weights
  that sampled, :class:`crl_agent.rl.PolicyLearner` takes them from the update's own forward (detached),
  so there is none; a non-zero line means a separate pass ran;
- ``update forward`` / ``update backward``: :meth:`PolicyLearner._forward` and ``_backward`` of the actor
  (under ``--grad-checkpointing`` the backward reruns the decoder's forward: its ``recomputed_tokens``);
- ``diagnostics``: :meth:`PolicyLearner.divergence` (two no-gradient forwards, every ``--diagnose-every``);
- ``distillation``: the extractor engine's forwards and decoding (crl);
- ``extractor update``: the extractor learner's forward and backward (crl);
- ``eval episode``: one held-out episode (the evaluation's wall seconds over its episodes).

FLOPs are the model's matmul work on the tokens each part needed: ``2 * N * tokens`` forward, ``N`` the
parameters a token passes through (the decoder's, embeddings excluded, adapters included), plus the output
layer's ``2 * hidden * vocab`` at each position whose next token is scored; a backward pass is the input
gradients of every layer (``2 * N * tokens`` again) plus the weight gradients of the trainable ones
(``2 * trainable * tokens``; LoRA trains ~1% of them) -- the minimum the algorithm needs, so padding,
recomputation and unneeded work count against the part. Attention's score matmuls are left out (~15% of a
500-token forward). ``limit_s`` is those FLOPs at the host's bf16 matmul rate measured in the same run
(``benchmarks/host.py``'s :func:`matmul_gflops` at the model's shapes) and ``x_limit`` the part's seconds
over it. Decoding is memory-bound by nature, so its ratio is large by design.

Per step: wall seconds, RSS after the step and the peak so far (the trainer's ``rss_mb``,
``peak_rss_mb``). The machine may be shared: the load average at the start and the end is recorded.

Run: ``python benchmarks/step_profile.py [--modes grpo,crl] [--steps 2] [--seed 13] [--eval-episodes 8]``
(writes ``benchmarks/results/step_profile/<host-slug>.json``; ``--no-save`` prints only).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from host import STEP_PROFILES as RESULTS  # noqa: E402
from host import host_slug, machine_record  # noqa: E402
from train_cpu import CRL_SETTINGS, SETTINGS, flags  # noqa: E402

SCHEMA_VERSION = "1.0"


# ---------------------------------------------------------------------------------------- counting
class Account:
    """Seconds, tokens and FLOPs per part (summed over the run's steps, evaluations apart)."""

    def __init__(self):
        self.parts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.phase = "setup"  # "rollout", "update" or "eval": which part an engine forward belongs to

    def add(self, part: str, seconds: float = 0.0, **counts: float) -> None:
        row = self.parts[part]
        row["seconds"] += seconds
        row["calls"] += 1
        for k, v in counts.items():
            row[k] += v


def model_sizes(model) -> dict[str, int]:
    """Parameters a token passes through (decoder, embeddings excluded), trainable ones, hidden and vocab."""
    head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    skip = {id(embed.weight), id(head.weight)}
    params = [p for p in model.parameters() if id(p) not in skip]
    return {"decoder": sum(p.numel() for p in params), "trainable": sum(p.numel() for p in params if p.requires_grad),
            "hidden": int(head.weight.shape[1]), "vocab": int(head.weight.shape[0])}


def forward_flops(sizes: dict[str, int], tokens: float, logit_rows: float) -> float:
    return 2.0 * sizes["decoder"] * tokens + 2.0 * sizes["hidden"] * sizes["vocab"] * logit_rows


def backward_flops(sizes: dict[str, int], tokens: float, logit_rows: float) -> float:
    # input gradients everywhere (as much as the forward) and weight gradients of the trainable parameters
    return forward_flops(sizes, tokens, logit_rows) + 2.0 * sizes["trainable"] * tokens


def instrument(account: Account) -> None:
    """Wrap the engine, the learner, env steps and the evaluation so that ``account`` records them."""
    import crl_agent.train as T
    from crl_agent.llm.hf_engine import ForwardEngine, ScoreRequest
    from crl_agent.rl.learner import PolicyLearner
    from crl_agent.rollout import PoolSlot

    run_group, decode, join = ForwardEngine._run_group, ForwardEngine._decode, ForwardEngine._join

    def part_of(engine, kind: str) -> str:
        """The extractor engine's work is all distillation; the actor's is this phase's ``kind``."""
        return "distillation" if getattr(engine, "_profile_role", "actor") == "extractor" else \
            f"{account.phase} {kind}"

    def timed_run_group(self, rows, cache_version, window=None, deliver=None):
        t0 = time.perf_counter()
        self._profile_decode_s = 0.0
        out = run_group(self, rows, cache_version, window, deliver)
        spent = time.perf_counter() - t0 - self._profile_decode_s
        new = sum(len(r.new) for r in rows)
        padded = len(rows) * max(len(r.new) for r in rows)
        logit_rows = sum(sum(len(c) for c in r.req.candidates) if isinstance(r.req, ScoreRequest) else 1 for r in rows)
        account.add(part_of(self, "prefill+scoring"), spent, tokens=new, padded_tokens=padded, cached_tokens=sum(r.cached for r in rows),
                    logit_rows=logit_rows, forwards=1)
        return out

    def timed_join(self, taken, kv_cache, mask, room=0):
        # generations that joined a decoding batch: their prefill, counted as the others' (not as decoding)
        t0 = time.perf_counter()
        out = join(self, taken, kv_cache, mask, room)
        spent = time.perf_counter() - t0
        self._profile_join_s = getattr(self, "_profile_join_s", 0.0) + spent
        rows = [r for r, _ in taken]
        new = sum(len(r.prompt_ids) for r in rows)
        account.add(part_of(self, "prefill+scoring"), spent, tokens=new, padded_tokens=len(rows) * max(len(r.prompt_ids) for r in rows),
                    logit_rows=len(rows), forwards=1)
        return out

    def timed_decode(self, reqs, kv_cache, logits, mask, version, window=None, deliver=None):
        t0 = time.perf_counter()
        joined_s, before = getattr(self, "_profile_join_s", 0.0), self.decoded_tokens
        out = decode(self, reqs, kv_cache, logits, mask, version, window, deliver)
        spent = time.perf_counter() - t0
        self._profile_decode_s = getattr(self, "_profile_decode_s", 0.0) + spent
        spent -= getattr(self, "_profile_join_s", 0.0) - joined_s
        generated = self.decoded_tokens - before  # joined requests' tokens included
        account.add(part_of(self, "decoding"), spent, tokens=generated, logit_rows=generated, decode=1)
        return out

    ForwardEngine._run_group, ForwardEngine._decode, ForwardEngine._join = timed_run_group, timed_decode, timed_join

    forward, backward, divergence = PolicyLearner._forward, PolicyLearner._backward, PolicyLearner.divergence

    def learner_part(self, what: str) -> str:
        return f"extractor update {what}" if getattr(self, "_profile_role", "actor") == "extractor" \
            else f"update {what}"

    def timed_forward(self, batch):
        t0 = time.perf_counter()
        out = forward(self, batch)
        tokens = sum(s.num_tokens for s in batch)
        rows = sum(sum(len(c) for c in s.candidate_ids) if s.mode == "score" else len(s.response_ids) for s in batch)
        self._profile_last = (tokens, rows)
        account.add(learner_part(self, "forward"), time.perf_counter() - t0, tokens=tokens,
                    padded_tokens=len(batch) * max(s.num_tokens for s in batch), logit_rows=rows)
        return out

    def timed_backward(self, loss):
        t0 = time.perf_counter()
        backward(self, loss)
        tokens, rows = getattr(self, "_profile_last", (0, 0))
        # under gradient checkpointing the backward also reruns the decoder's forward: counted apart, not as
        # FLOPs the update needs (so the ratio to the limit shows what the recomputation costs)
        account.add(learner_part(self, "backward"), time.perf_counter() - t0, tokens=tokens, logit_rows=rows,
                    recomputed_tokens=tokens if getattr(self, "gradient_checkpointing", False) else 0)

    def timed_divergence(self, samples):
        t0 = time.perf_counter()
        out = divergence(self, samples)
        scored = [s for s in samples if s.mode == "score"]
        account.add("diagnostics", time.perf_counter() - t0, tokens=2 * sum(s.num_tokens for s in scored),
                    logit_rows=2 * sum(sum(len(c) for c in s.candidate_ids) for s in scored))
        return out

    PolicyLearner._forward, PolicyLearner._backward = timed_forward, timed_backward
    PolicyLearner.divergence = timed_divergence

    step = PoolSlot.step

    async def timed_step(self, action):
        t0 = time.perf_counter()
        try:
            return await step(self, action)
        finally:
            account.add("env steps", time.perf_counter() - t0, steps=1)

    PoolSlot.step = timed_step

    build_run, rollout, actor_update = T.build_run, T.rollout, T.actor_update
    held_out_evaluation, evaluate = T.held_out_evaluation, T.evaluate

    def tagged_build_run(cfg, home, dist):
        setup = build_run(cfg, home, dist)
        setup.llm._engine._profile_role = "actor"
        if setup.extractor is not None:
            setup.extractor._engine._profile_role = "extractor"
        if setup.extractor_learner is not None:
            setup.extractor_learner._profile_role = "extractor"
        account.sizes = {"actor": model_sizes(setup.actor_model)}
        if setup.extractor_learner is not None:
            account.sizes["extractor"] = model_sizes(setup.extractor_learner.model)
        elif setup.extractor is not None:
            account.sizes["extractor"] = model_sizes(setup.extractor.model)
        return setup

    async def tagged_rollout(*a, **k):
        account.phase = "rollout"
        t0 = time.perf_counter()
        try:
            return await rollout(*a, **k)
        finally:
            account.add("rollout wall", time.perf_counter() - t0)
            account.phase = "other"

    async def tagged_actor_update(*a, **k):
        account.phase = "update"
        try:
            return await actor_update(*a, **k)
        finally:
            account.phase = "other"

    async def tagged_evaluate(cfg, pool, agent, step, *a, **k):
        account.phase = "eval"
        t0 = time.perf_counter()
        try:
            row = await evaluate(cfg, pool, agent, step, *a, **k)
        finally:
            account.phase = "other"
        halves = 2 if cfg.experience else 1
        account.add("eval episode", time.perf_counter() - t0, episodes=halves * cfg.eval_episodes * len(cfg.task_ids))
        return row

    T.build_run, T.rollout, T.actor_update = tagged_build_run, tagged_rollout, tagged_actor_update
    T.evaluate = tagged_evaluate
    del held_out_evaluation


# ---------------------------------------------------------------------------------------- one mode
def run_mode(mode: str, steps: int, seed: int, eval_episodes: int, gflops: float, out: Path,
             overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """Train ``steps`` steps of the benchmark settings (``overrides``: ``--set`` values) in this process,
    instrumented; the mode's account."""
    import dataclasses

    from crl_agent.agents import parse_agent_args
    from crl_agent.train import TrainConfig, build_parser, train

    account = Account()
    instrument(account)
    settings = {**SETTINGS, "steps": steps, "eval-every": 0, "eval-episodes": eval_episodes,
                **(CRL_SETTINGS if mode in ("crl", "static") else {}), **(overrides or {})}
    argv = ["--out", str(out), "--quiet", "--mode", mode, "--seed", str(seed), *flags(settings)]
    args = build_parser().parse_args(argv)
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if f.name != "agent_args"},
                      agent_args=parse_agent_args(args.agent_arg))
    t0 = time.perf_counter()
    asyncio.run(train(cfg, out, quiet=True))
    wall = time.perf_counter() - t0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [json.loads(x) for x in (out / "evals.jsonl").read_text().splitlines() if x.strip()]
    return {"mode": mode, "settings": settings, "wall_s": wall, "sizes": account.sizes,
            "parts": table(account, gflops, len(metrics)),
            "steps": [{k: m.get(k) for k in ("step", "time_s", "rollout_s", "actor_update_s", "diagnose_s", "bank_s",
                                              "extractor_wait_s", "rollout_tokens", "episodes", "extra_groups",
                                              "rss_mb", "peak_rss_mb")} for m in metrics],
            "evals": [{k: e.get(k) for k in ("step", "rss_mb", "peak_rss_mb", "success", "with_experience")}
                      for e in evals]}


def table(account: Account, gflops: float, steps: int) -> dict[str, dict[str, float]]:
    """Per part, per step: seconds, tokens, FLOPs, seconds at the matmul limit and the ratio to it."""
    p, sizes = account.parts, account.sizes
    actor, extractor = sizes["actor"], sizes.get("extractor", sizes["actor"])
    rows: dict[str, dict[str, float]] = {}

    def put(name: str, seconds: float, tokens: float = 0.0, flops: float = 0.0, per: float | None = None, **extra):
        n = per if per is not None else max(1, steps)
        rows[name] = {"seconds": seconds / n, "tokens": tokens / n, "tflop": flops / n / 1e12,
                      **{k: v / n for k, v in extra.items()}}
        if flops:
            rows[name]["limit_s"] = flops / n / (gflops * 1e9)
            rows[name]["x_limit"] = seconds / (flops / (gflops * 1e9))

    pre = p.get("rollout prefill+scoring", {})
    put("rollout prefill+scoring", pre.get("seconds", 0.0), pre.get("tokens", 0.0),
        forward_flops(actor, pre.get("tokens", 0.0), pre.get("logit_rows", 0.0)),
        padded_tokens=pre.get("padded_tokens", 0.0), cached_tokens=pre.get("cached_tokens", 0.0),
        forwards=pre.get("forwards", 0.0))
    busy = pre.get("seconds", 0.0) + p.get("rollout decoding", {}).get("seconds", 0.0)
    put("rollout other", p.get("rollout wall", {}).get("seconds", 0.0) - busy)
    env = p.get("env steps", {})
    put("env steps", env.get("seconds", 0.0), steps_played=env.get("steps", 0.0))
    put("old-log-prob pass", 0.0)  # none: see the module docstring (a separate pass would be timed here)
    for name, key, sz in (("update forward", "update forward", actor), ("update backward", "update backward", actor),
                          ("extractor update forward", "extractor update forward", extractor),
                          ("extractor update backward", "extractor update backward", extractor)):
        q = p.get(key, {})
        fn = backward_flops if "backward" in name else forward_flops
        extra = {"recomputed_tokens": q.get("recomputed_tokens", 0.0)} if "backward" in name else {}
        put(name, q.get("seconds", 0.0), q.get("tokens", 0.0), fn(sz, q.get("tokens", 0.0), q.get("logit_rows", 0.0)),
            padded_tokens=q.get("padded_tokens", 0.0), **extra)
    d = p.get("diagnostics", {})
    put("diagnostics", d.get("seconds", 0.0), d.get("tokens", 0.0), forward_flops(actor, d.get("tokens", 0.0),
                                                                                   d.get("logit_rows", 0.0)))
    dist = p.get("distillation", {})
    put("distillation", dist.get("seconds", 0.0), dist.get("tokens", 0.0),
        forward_flops(extractor, dist.get("tokens", 0.0), dist.get("logit_rows", 0.0)))
    ev = p.get("eval episode", {})
    episodes = ev.get("episodes", 0.0)
    if episodes:
        evt = p.get("eval prefill+scoring", {})
        put("eval episode", ev.get("seconds", 0.0), evt.get("tokens", 0.0),
            forward_flops(actor, evt.get("tokens", 0.0), evt.get("logit_rows", 0.0)), per=episodes)
    return rows


# ---------------------------------------------------------------------------------------- report
def report(record: dict[str, Any]) -> str:
    m = record["host"]
    out = [f"host: {m['cpu_model']} ({m['cores']} cores), bf16 matmul {m['matmul_gflops']['bfloat16']:,.0f} GFLOP/s, "
           f"load average {record['load_average_start']:.1f} at the start, {record['load_average_end']:.1f} at the end"
           + (" (shared: other work ran beside it, so seconds read slow)" if record["shared"] else "")]
    for run in record["runs"]:
        steps = run["steps"]
        out.append(f"\n{run['mode']}: {len(steps)} steps, "
                   f"{sum(s['time_s'] for s in steps) / max(1, len(steps)):.1f} s a step; per step:")
        out.append(f"  {'part':28s} {'seconds':>8s} {'tokens':>9s} {'TFLOP':>7s} {'limit s':>8s} {'x limit':>8s}")
        for name, r in run["parts"].items():
            lim = f"{r['limit_s']:8.2f} {r['x_limit']:8.1f}" if "limit_s" in r else f"{'':8s} {'':8s}"
            out.append(f"  {name:28s} {r['seconds']:8.2f} {r['tokens']:9.0f} {r['tflop']:7.2f} {lim}")
        out.append("  RSS after each step (MB): " + ", ".join(f"{s['rss_mb']:.0f}" for s in steps if s.get("rss_mb"))
                   + f"; peak {max((s.get('peak_rss_mb') or 0) for s in steps):.0f}; after each evaluation: "
                   + ", ".join(f"{e['rss_mb']:.0f}" for e in run["evals"] if e.get("rss_mb")))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="grpo,crl")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--eval-episodes", type=int, default=8, help="held-out episodes of each evaluation (the "
                   "benchmark plays 64; the per-episode cost is what the profile reports)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting (e.g. --set model=PATH for another model); not saved when used")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one mode in this process, print its JSON
    p.add_argument("--gflops", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.eval_episodes < 1:
        p.error("--steps and --eval-episodes must be >= 1")
    if any("=" not in kv for kv in args.set):
        p.error("--set takes KEY=VALUE")
    overrides = dict(kv.split("=", 1) for kv in args.set)
    if args.one:
        with tempfile.TemporaryDirectory() as d:
            print("STEP_PROFILE " + json.dumps(run_mode(args.one, args.steps, args.seed, args.eval_episodes,
                                                         args.gflops, Path(d) / "run", overrides)))
        return 0
    load_start = os.getloadavg()[0]
    host = machine_record()
    gflops = host["matmul_gflops"]["bfloat16"] or host["matmul_gflops"]["float32"]
    runs = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        proc = subprocess.run([sys.executable, __file__, "--one", mode, "--steps", str(args.steps), "--seed",
                               str(args.seed), "--eval-episodes", str(args.eval_episodes), "--gflops", str(gflops),
                               *(x for kv in args.set for x in ("--set", kv))],
                              cwd=ROOT, capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("STEP_PROFILE ")), None)
        if proc.returncode != 0 or line is None:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"step_profile: the {mode} run failed (exit {proc.returncode})")
        runs.append(json.loads(line.split(" ", 1)[1]))
    load_end = os.getloadavg()[0]
    record = {"schema_version": SCHEMA_VERSION, "date": datetime.date.today().isoformat(),
              "git_sha": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True).stdout.strip(),
              "host": host, "load_average_start": load_start, "load_average_end": load_end,
              "shared": max(load_start, load_end) > 0.5 * (host["cores"] or 1),
              "steps": args.steps, "seed": args.seed, "eval_episodes": args.eval_episodes, "runs": runs}
    print(report(record))
    if overrides:
        record["overrides"] = overrides
    if not args.no_save and not overrides:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"{host_slug(host['cpu_model'])}.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
