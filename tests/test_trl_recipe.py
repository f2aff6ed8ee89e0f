"""The SFT-then-GRPO recipe: solver demonstrations rendered as TRL's rollouts, and ``examples/trl_sft_grpo.py``.

``oracle_conversations`` must produce the very conversation GRPOTrainer builds for a rollout played well (the
first observation appended to the prompt, one ``act`` call per move, ``act``'s own text back, a closing turn
without a call); the SFT warm-start is only worth anything if the model meets the same text in GRPO.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from crl_envs.integrations.trl import TextEnvironment, oracle_conversations
from crl_envs.registry import backend_installed
from tests.docker_support import alive
from tests.test_trl import MINIHACK, REPO, SOKOBAN

PROMPT = [{"role": "system", "content": "Play with the act tool."}, {"role": "user", "content": "Play."}]


def replay(env_id: str, seed: int, actions: list[str]) -> tuple[str, list[str], bool]:
    """The first observation, each ``act`` result and the outcome of playing ``actions`` afresh."""
    env = TextEnvironment(env_id)
    try:
        first = env.reset(seed=seed)
        results = [env.act(a) for a in actions]
        return first, results, bool(env.info.get("success"))
    finally:
        env.close()


@pytest.mark.parametrize("env_id", [SOKOBAN, MINIHACK])
def test_solver_episodes_are_rendered_as_grpo_rollouts(env_id):
    if not backend_installed(env_id):
        pytest.skip(f"{env_id}'s backend is not installed")
    rows = oracle_conversations(env_id, [3, 4, 5], PROMPT, closing="Done.")
    assert [r["seed"] for r in rows] == [3, 4, 5]  # the solver finishes every one of them
    assert json.loads(rows[0]["tools"])[0]["function"]["name"] == "act"
    for row in rows:
        messages = row["messages"]
        assert messages[0] == PROMPT[0] and PROMPT[1]["content"] == "Play."  # the caller's prompt is not mutated
        assert messages[-1] == {"role": "assistant", "content": "Done."}  # a turn without a call ends the rollout
        turns = messages[2:-1]
        calls, tools = turns[0::2], turns[1::2]
        assert len(calls) == len(tools) >= 1
        assert all(m["role"] == "assistant" and len(m["tool_calls"]) == 1 for m in calls)
        assert all(m["role"] == "tool" and m["name"] == "act" for m in tools)
        actions = [m["tool_calls"][0]["function"]["arguments"]["action"] for m in calls]
        first, results, solved = replay(env_id, row["seed"], actions)
        assert solved  # the recorded moves win the episode when played again
        assert messages[1]["content"] == "Play." + first  # TRL appends reset's string to the last prompt message
        assert [m["content"] for m in tools] == results  # act's own text, "The episode is over (solved)." included
        assert results[-1].endswith("The episode is over (solved).")
    assert rows[0]["messages"] != rows[1]["messages"]


def test_an_env_without_a_solver_is_refused():
    with pytest.raises(ValueError, match="no solver"):
        oracle_conversations("crl/Remote-v0", [0], PROMPT, url="http://127.0.0.1:1")


@pytest.mark.trl
def test_the_warm_start_trains_on_the_calls_and_not_on_the_observations():
    """Under TRL's training template (assistant_only_loss) the loss covers the tool calls and the closing turn."""
    pytest.importorskip("trl", reason="pip install -e '.[trl]'")
    from transformers import AutoTokenizer
    from trl.chat_template_utils import get_training_chat_template

    from crl_agent.llm.models import ensure_smollm2
    from crl_envs.integrations.trl import tool_chat_template

    tokenizer = tool_chat_template(AutoTokenizer.from_pretrained(ensure_smollm2()))
    row = oracle_conversations(SOKOBAN, [7], PROMPT)[0]
    enc = tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]),
                                        chat_template=get_training_chat_template(tokenizer),
                                        return_assistant_tokens_mask=True, return_dict=True)
    trained = tokenizer.decode([t for t, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m])
    actions = [m["tool_calls"][0]["function"]["arguments"]["action"] for m in row["messages"] if m.get("tool_calls")]
    assert trained.count("<tool_call>") == len(actions) and trained.count('"name": "act"') == len(actions)
    assert all(f'"action": "{a}"' in trained for a in actions) and "Done." in trained
    assert "Boxes on targets" not in trained and "Push all" not in trained  # observations are context, not targets


@pytest.mark.trl
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_recipe_script_runs_sft_then_grpo(tmp_path):
    """``examples/trl_sft_grpo.py`` with the tiny tool-calling model: SFT on 4 solver episodes, 1 GRPO step."""
    pytest.importorskip("trl", reason="pip install -e '.[trl]'")
    pytest.importorskip("openenv", reason="pip install -e '.[openenv]'")
    if not backend_installed(MINIHACK):
        pytest.skip("MiniHack is not installed: pip install -e '.[minihack]'")
    from tests.test_trl import tiny_tool_caller

    tiny_tool_caller(tmp_path / "model")
    out = subprocess.run([sys.executable, os.path.join(REPO, "examples", "trl_sft_grpo.py"),
                          "--model", str(tmp_path / "model"), "--demos", "4", "--steps", "1", "--eval-every", "1",
                          "--batch", "4", "--generations", "2", "--eval-episodes", "4", "--max-tool-calls", "2",
                          "--max-completion-length", "512", "--threads", "1", "--output-dir", str(tmp_path / "run")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=1500,
                         env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    curve = json.loads((tmp_path / "run" / "curve.json").read_text())
    assert curve["schema_version"] == 1 and curve["demos"] == 4 and curve["threads"] == 1
    assert [p["stage"] for p in curve["held_out"]] == ["base", "sft", "grpo"]
    assert all(p["episodes"] == 4 and 0 <= p["success"] <= 1 for p in curve["held_out"])
    assert curve["sft"] and [r["step"] for r in curve["grpo"]] == [1]
    assert {"sft", "grpo", "eval", "total"} <= set(curve["seconds"])
    assert (tmp_path / "run" / "curve.png").stat().st_size > 10_000
    assert "| stage | GRPO step | held-out success |" in out.stdout


@pytest.mark.openenv
@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_example_leaves_no_env_server_behind(tmp_path):
    """The examples start ``python -m crl_envs.serve`` themselves; SIGKILL (or the OOM killer) on the example must
    take that server down too, or it holds its port and its envs until someone finds it."""
    pytest.importorskip("openenv", reason="pip install -e '.[openenv]'")
    import signal
    import time

    script = ("import sys, time; sys.path.insert(0, sys.argv[1]); from trl_grpo import serve; "
              "proc, url = serve(sys.argv[2], 2); print(proc.pid, flush=True); time.sleep(600)")
    example = subprocess.Popen([sys.executable, "-c", script, os.path.join(REPO, "examples"), SOKOBAN],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path)
    try:
        line = example.stdout.readline()  # the server's own banner comes first, on the same stdout
        while not line.strip().isdigit():
            assert line, "the example ended before its server started"
            line = example.stdout.readline()
        server = int(line)  # printed once the server answers /health
        assert alive(server)
        example.send_signal(signal.SIGKILL)
        example.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(server):
            os.kill(server, signal.SIGKILL)
            pytest.fail("the env server outlived the example that started it by 10 s")
    finally:
        example.kill()
