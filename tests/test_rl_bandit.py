"""Evidence that the learner learns: a one-step text bandit solved by the tiny model in score mode.

The env asks "Which door leads out?" and lists four doors in a seed-dependent order; only ``green``
wins. The policy is GLAM-style action scoring: ``softmax`` over each admissible action's log-prob
(its tokens plus the end-of-turn token, mean over tokens) after the chat prompt. Training is GRPO as
in DESIGN section 7: groups of K rollouts of one seed, split-group advantages, PPO-clip, one update
per iteration. The tiny model is random, so it starts at about chance (25%). This minimal sampling
loop stands in for the trainer's rollout code.
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.rl import (  # noqa: E402
    PolicyLearner,
    TurnSample,
    batch_candidate_logprobs,
    batch_sequence_logprobs,
    split_group_advantages,
)
from crl_envs.core import InvalidAction, StepOutcome, TextEnv  # noqa: E402

WINNER = "green"


class DoorEnv(TextEnv):
    """One step: pick the door that leads out (always green; the listed order varies by seed)."""

    family = "Doors"
    DOORS = ("red", "green", "blue", "yellow")
    winner = WINNER

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        self.order: list[str] = []

    def _reset_task(self, options):
        self.order = [self.DOORS[i] for i in self.np_random.permutation(len(self.DOORS))]
        return f"Which door leads out? Actions: {', '.join(self.order)}", {"task": "Leave the room."}

    def _apply(self, action):
        if action not in self.DOORS:
            raise InvalidAction(f"choose one of {', '.join(self.order)}")
        won = action == self.winner
        return StepOutcome("You are outside." if won else "A wall.", reward=float(won), terminated=True, success=won, progress=float(won))

    def _admissible_actions(self):
        return list(self.order)


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: the tiny model gains nothing from two, and on a shared machine loses a lot."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_chat_model(tmp_path_factory.mktemp("tiny"), seed=0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


class ScorePolicy:
    """``softmax(mean candidate log-prob / temperature)`` over the admissible actions."""

    def __init__(self, model, tokenizer, temperature=1.0):
        self.model, self.tok, self.temperature = model, tokenizer, temperature
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def prompt(self, obs):
        messages = [{"role": "user", "content": obs}]
        return list(self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))

    def candidates(self, actions):
        return [self.tok.encode(a, add_special_tokens=False) + [self.eot] for a in actions]

    @torch.no_grad()
    def distributions(self, observations, action_lists):
        prompts = [self.prompt(o) for o in observations]
        cands = [self.candidates(a) for a in action_lists]
        scores = batch_candidate_logprobs(self.model, prompts, cands, norm="mean")
        return prompts, cands, [torch.softmax(s / self.temperature, -1) for s in scores], scores


def evaluate(policy, seeds, gen):
    """Held-out success: expected (under the sampling policy), greedy, and sampled (one episode per seed)."""
    envs = [DoorEnv() for _ in seeds]
    obs, actions = zip(*[(o, i["admissible_actions"]) for env, s in zip(envs, seeds, strict=True) for o, i in [env.reset(seed=s)]], strict=True)
    _, _, dists, _ = policy.distributions(obs, actions)
    expected = sum(float(p[a.index(WINNER)]) for p, a in zip(dists, actions, strict=True)) / len(seeds)
    greedy = sum(a[int(p.argmax())] == WINNER for p, a in zip(dists, actions, strict=True)) / len(seeds)
    sampled = 0
    for env, p, a in zip(envs, dists, actions, strict=True):
        _, reward, *_ = env.step(a[int(torch.multinomial(p, 1, generator=gen))])
        sampled += reward
    return {"expected": expected, "greedy": greedy, "sampled": sampled / len(seeds)}


def test_score_mode_policy_learns_the_door_bandit_with_ppo_and_split_group_advantages(tiny):
    model, tok = tiny
    policy = ScorePolicy(model, tok)
    learner = PolicyLearner(model, lr=3e-3, loss="ppo", clip_eps=0.2)
    gen = torch.Generator().manual_seed(0)
    held_out = list(range(10_000, 10_064))
    start = time.perf_counter()
    before = evaluate(policy, held_out, gen)
    curve = [(0, before)]
    groups, group_size = 2, 8
    for it in range(1, 41):
        seeds = [it * 100 + g for g in range(groups)]  # never among the held-out seeds
        envs = [DoorEnv() for _ in seeds]
        first = [env.reset(seed=s) for env, s in zip(envs, seeds, strict=True)]
        prompts, cands, dists, _ = policy.distributions([o for o, _ in first], [i["admissible_actions"] for _, i in first])
        samples, rewards, group_ids, with_exp = [], [], [], []
        for g, (env, (_, info)) in enumerate(zip(envs, first, strict=True)):
            for k in range(group_size):
                env.reset(seed=seeds[g])
                choice = int(torch.multinomial(dists[g], 1, generator=gen))
                _, reward, *_ = env.step(info["admissible_actions"][choice])
                old = torch.log(dists[g][choice]).item()
                samples.append(
                    TurnSample(prompts[g], 0.0, [old], candidate_ids=cands[g], chosen=choice, norm="mean",
                               policy_version=learner.version)
                )
                rewards.append(reward)
                group_ids.append(seeds[g])
                with_exp.append(k >= group_size // 2)  # the split halves, as in crl mode
        for s, a in zip(samples, split_group_advantages(rewards, group_ids, with_exp).tolist(), strict=True):
            s.advantage = a
        metrics = learner.update(samples)
        assert metrics["stale"] == 0
        now = evaluate(policy, held_out, gen)
        curve.append((it, now))
        if now["expected"] >= 0.95:
            break
    after = curve[-1][1]
    elapsed = time.perf_counter() - start
    print(f"door bandit: {len(curve) - 1} updates, {elapsed:.1f} s; held-out success per update:")
    for it, m in curve:
        print(f"  {it:3d}  expected {m['expected']:.3f}  greedy {m['greedy']:.3f}  sampled {m['sampled']:.3f}")
    assert 0.15 <= before["expected"] <= 0.35, before  # about chance (1 in 4)
    assert after["expected"] >= 0.9 and after["greedy"] >= 0.9 and after["sampled"] >= 0.9, curve


@torch.no_grad()
def sample_response(model, prompt, length, gen):
    """Ancestral sampling at temperature 1, recording each token's log-prob as a sampler does."""
    ids, logps = list(prompt), []
    for _ in range(length):
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
        token = int(torch.multinomial(logp.exp(), 1, generator=gen))
        ids.append(token)
        logps.append(logp[token].item())
    return ids[len(prompt):], logps


def test_cispo_update_raises_the_logprob_of_positively_advantaged_generations(tiny):
    model, tok = tiny
    model = type(model).from_pretrained(model.name_or_path).eval()  # a fresh copy, untouched by other tests
    policy = ScorePolicy(model, tok)
    prompt = policy.prompt("Describe the door that leads out.")
    gen = torch.Generator().manual_seed(1)
    responses, olds = zip(*[sample_response(model, prompt, 6, gen) for _ in range(4)], strict=True)
    advantages = [1.0, -1.0, 1.0, -1.0]
    before, _ = batch_sequence_logprobs(model, [prompt] * 4, responses)
    # the sampler's log-probs and the learner's recomputation agree, so the first ratios are 1
    torch.testing.assert_close(before, torch.tensor(olds), atol=1e-4, rtol=0)
    learner = PolicyLearner(model, lr=1e-3, loss="cispo")
    samples = [TurnSample(prompt, a, o, response_ids=r) for r, o, a in zip(responses, olds, advantages, strict=True)]
    metrics = learner.update(samples)
    assert metrics["updated"] == 1 and metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    with torch.no_grad():
        after, _ = batch_sequence_logprobs(model, [prompt] * 4, responses)
    change = (after - before).sum(-1)
    assert change[0] > 0 and change[2] > 0, change
    assert change[1] < 0 and change[3] < 0, change
