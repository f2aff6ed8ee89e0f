"""The extractor's side of the dual loop, as issue 46 found it wrong (each test fails on the code before):

- a call is trained again only with new outcomes: the training buffer is FIFO, and an update's reward for a
  call is the meta-reward of what it guided since its last update (the official ``MemoryTrainingBuffer``);
- tokens the model did not choose (one token allowed by the schema, a closer picked by rule) are out of the
  CISPO loss;
- held-out searches leave the bank's usage stats and the retriever's dropout RNG as they were.

(Search-and-ask while the extractor trains: tests/test_experience_manager.py's paused-extractor test.)
"""

from __future__ import annotations

import asyncio
import json

import pytest

from crl_agent.experience.calllog import CallLog, fold_samples, training_buffer
from crl_agent.rl.batches import extractor_samples


def call(cid: str, n: int = 3, chosen: list[bool] | None = None) -> dict:
    rec = {"type": "call", "call_id": cid, "kind": "distil", "messages": [], "text": "{}",
           "token_ids": list(range(10, 10 + n)), "logprobs": [-0.5] * n, "prompt_token_ids": [1, 2, 3],
           "entries": [], "policy_version": 0}
    if chosen is not None:
        rec["model_chosen"] = chosen
    return rec


def outcome(episode: str, success: bool, *cids: str) -> dict:
    return {"type": "outcome", "episode": episode, "outcome": 1.0 if success else -1.0, "call_ids": list(cids)}


class LogManager:
    """What :func:`extractor_samples` and the trainer need of an ExperienceManager, over an in-memory log."""

    def __init__(self, records: list[dict]):
        self.calls = CallLog(None)
        for r in records:
            self.calls.write(r)

    def training_samples(self, step: int, cooldown: int = 1):
        return fold_samples(self.calls.records(), None, step, cooldown)

    def mark_trained(self, samples, step: int) -> None:
        self.calls.write({"type": "trained", "call_ids": [s.call_id for s in samples], "step": step, "entries": []})


def test_a_trained_call_returns_to_the_buffer_only_with_new_outcomes_and_their_reward_alone():
    m = LogManager([call("a"), call("b"), outcome("e1", True, "a"), outcome("e2", False, "b"),
                    outcome("e3", True, "a")])
    samples, used, *_ = extractor_samples(m, step=5, cooldown=1, batch=2)
    assert [s.call_id for s in used] == ["a", "b"]  # FIFO: a was credited first
    assert [s.new_reward for s in used] == [1.0, -1.0] and [s.advantage for s in samples] == [1.0, -1.0]
    m.mark_trained(used, step=5)
    # no new evidence: the old code took the same two calls again (every other step, past the cooldown)
    assert extractor_samples(m, step=9, cooldown=1, batch=1)[:3] == ([], [], [])
    assert training_buffer(m.training_samples(9)) == []
    m.calls.write(outcome("e4", False, "a"))
    (queued,) = training_buffer(m.training_samples(9))
    # its reward is the new episode's alone; its meta-reward over everything it guided stays reported
    assert (queued.call_id, queued.new_reward, queued.new_episodes, queued.reward) == ("a", -1.0, 1, pytest.approx(1 / 3))
    m.calls.write(outcome("e5", True, "b"))
    assert [s.call_id for s in training_buffer(m.training_samples(9))] == ["a", "b"]  # in the order they came back


def test_the_buffer_keeps_a_call_cooling_down_for_a_later_update():
    m = LogManager([call("a"), call("b"), call("c"), call("d"), outcome("e1", True, "a"), outcome("e2", False, "c")])
    _, used, *_ = extractor_samples(m, step=3, cooldown=1, batch=2)
    assert [s.call_id for s in used] == ["a", "c"]
    m.mark_trained(used, step=3)
    for record in (outcome("e3", False, "a"), outcome("e4", True, "b"), outcome("e5", False, "c"),
                   outcome("e6", False, "d"), outcome("e7", True, "c")):
        m.calls.write(record)
    _, used, *_ = extractor_samples(m, step=4, cooldown=1, batch=2)  # a and c are cooling down (trained at 3)
    assert [s.call_id for s in used] == ["b", "d"]
    m.mark_trained(used, step=4)
    _, used, *_ = extractor_samples(m, step=5, cooldown=1, batch=2)  # a and c waited in the buffer, and go now
    assert [(s.call_id, s.new_reward) for s in used] == [("a", -1.0), ("c", 0.0)]


def test_a_bounded_buffer_keeps_the_newest_calls_and_lets_the_older_evidence_go():
    m = LogManager([call("a"), call("b"), call("c"), outcome("e1", True, "a"), outcome("e2", False, "b"),
                    outcome("e3", True, "c")])
    assert extractor_samples(m, step=5, cooldown=1, batch=4, capacity=2)[:3] == ([], [], [])  # too few: none dropped
    samples, used, dropped, _ = extractor_samples(m, step=5, cooldown=1, batch=2, capacity=2)
    assert [s.call_id for s in dropped] == ["a"] and [s.call_id for s in used] == ["b", "c"]  # the 2 kept
    m.calls.write({"type": "dropped", "call_ids": ["a"], "step": 5})
    m.mark_trained(used, step=5)
    assert training_buffer(m.training_samples(6)) == []
    m.calls.write(outcome("e4", False, "a"))  # a dropped call comes back with new evidence, and only that
    a = next(s for s in m.training_samples(7) if s.call_id == "a")
    assert (a.new_reward, a.new_episodes, a.weight) == (-1.0, 1, 1.0)  # dropping is not training: full weight


def test_a_batch_of_calls_that_all_earned_the_same_reward_grows_until_one_differs_or_waits():
    # issue 46's crl seed 0: from step 6 every batch of 8 held calls whose guided episodes had all failed, so
    # every advantage was 0, no weight moved, and the calls' evidence was spent: one update in 8 steps
    m = LogManager([*(call(c) for c in "abcde"), outcome("e1", False, "a", "b", "c"), outcome("e2", True, "d")])
    samples, used, dropped, alike = extractor_samples(m, step=5, cooldown=1, batch=2)
    # a and b (the oldest) failed alike; c joins them, alike too, then d, which succeeded
    assert [s.call_id for s in used] == ["a", "b", "c", "d"] and not alike and not dropped
    assert [s.advantage for s in samples] == pytest.approx([-0.5, -0.5, -0.5, 1.5])
    m.mark_trained(used, step=5)
    m.calls.write(outcome("e3", False, "a"))
    m.calls.write(outcome("e4", False, "e"))
    # every ready call failed: none is taken, and each keeps its evidence; the older beyond the capacity go
    assert extractor_samples(m, step=7, cooldown=1, batch=2) == ([], [], [], True)
    samples, used, dropped, alike = extractor_samples(m, step=7, cooldown=1, batch=1, capacity=1)
    assert (samples, used, [s.call_id for s in dropped], alike) == ([], [], ["a"], True)
    m.calls.write({"type": "dropped", "call_ids": ["a"], "step": 7})
    assert [s.call_id for s in training_buffer(m.training_samples(7))] == ["e"]  # e waits
    m.calls.write(outcome("e5", True, "b"))  # evidence that tells them apart
    samples, used, _, _ = extractor_samples(m, step=8, cooldown=1, batch=2)
    assert [s.call_id for s in used] == ["e", "b"]  # b trained once before: weight (1 + 1) ** -0.5
    assert [s.advantage for s in samples] == pytest.approx([-1.0, 2 ** -0.5])


def test_tokens_the_model_did_not_choose_are_masked_out_of_the_extractors_loss():
    m = LogManager([call("a", 4, chosen=[True, False, True, False]), call("b", 2, chosen=[False, False]),
                    call("c", 2), outcome("e1", True, "a", "b"), outcome("e2", False, "c")])
    samples, used, *_ = extractor_samples(m, step=1, cooldown=1, batch=2)
    # b had no token of its own choosing: nothing to learn from, so it is not taken
    assert [s.call_id for s in used] == ["a", "c"]
    assert samples[0].response_mask == [True, False, True, False] and samples[1].response_mask is None


def test_the_learner_gives_a_masked_token_neither_loss_nor_gradient(tiny):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from crl_agent.rl import PolicyLearner
    from crl_agent.rl.samples import TurnSample

    model = AutoModelForCausalLM.from_pretrained(tiny)
    learner = PolicyLearner(model, lr=1e-3, loss="cispo")

    def grads(old: list[float], mask: list[bool] | None):
        sample = TurnSample(prompt_ids=[5, 6, 7], response_ids=[8, 9, 10], old_logprobs=old, advantage=1.0,
                            temperature=1.0, response_mask=mask)
        model.zero_grad()
        loss, _, _ = learner._forward([sample])
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone()

    masked = grads([-1.0, -2.0, -3.0], [True, False, True])
    # the old log-prob of the masked token (its CISPO weight) no longer matters...
    assert torch.allclose(masked, grads([-1.0, -9.0, -3.0], [True, False, True]))
    # ...while it does when the token counts
    assert not torch.allclose(grads([-1.0, -2.0, -3.0], None), grads([-1.0, -9.0, -3.0], None))


def test_the_engine_marks_schema_forced_and_closing_tokens_as_not_chosen(tiny):
    pytest.importorskip("llguidance")
    from crl_agent.llm import SamplingParams
    from crl_agent.llm.constrained import close_reserve
    from crl_agent.llm.transformers_backend import TransformersLLM

    llm = TransformersLLM(tiny, dtype="float32")
    schema = {"type": "object", "properties": {"kind": {"const": "add"}, "title": {"type": "string", "maxLength": 40}},
              "required": ["kind", "title"], "additionalProperties": False}

    def chat(max_tokens: int):
        return asyncio.run(llm.chat([{"role": "user", "content": "write"}],
                                    SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1, json_schema=schema)))

    try:
        roomy, tight = chat(120), chat(40)
    finally:
        asyncio.run(llm.aclose())
    assert json.loads(roomy.text)["kind"] == "add" and len(roomy.model_chosen) == len(roomy.token_ids)
    text = [llm.tokenizer.decode([t]) for t in roomy.token_ids]
    # '{"kind": "add", "title": "' has one allowed token at each place: none of it is the model's choice...
    prefix = len('{"kind": "add", "title": "')
    assert "".join(text[:prefix]) == '{"kind": "add", "title": "' and not any(roomy.model_chosen[:prefix])
    assert any(roomy.model_chosen[prefix:])  # ...while the title is
    # in the closing phase (the last close_reserve tokens of the cap) the closer is picked by rule
    reserve = 40 - close_reserve(40)
    assert len(tight.model_chosen) > reserve and not any(tight.model_chosen[reserve:])


def test_held_out_searches_leave_usage_stats_and_the_dropout_rng_unchanged(tmp_path):
    pytest.importorskip("hnswlib")
    from crl_agent.experience import ExperienceBank, ExperienceManager, ManagerConfig

    bank = ExperienceBank(tmp_path / "bank", embedder="hash")
    for i in range(12):
        bank.add("crl/T-v0", f"Lesson {i}", f"If the door {i} is locked, then find key {i}.")

    async def main():
        m = ExperienceManager(bank, None, ManagerConfig(merge_every=0))
        await m.search("door locked", task="crl/T-v0")  # a training search: stats move, as before
        stats = {e.id: (e.retrieve_count, e.last_retrieved) for e in bank.entries()}
        rng = json.dumps(m.retriever.rng.bit_generator.state)
        for _ in range(5):
            await m.search("door locked", task="crl/T-v0", record=False)
            await m.ask("which key?", task="crl/T-v0", record=False)
        assert {e.id: (e.retrieve_count, e.last_retrieved) for e in bank.entries()} == stats
        assert json.dumps(m.retriever.rng.bit_generator.state) == rng
        first = [e.id for e in await m.search("door locked", task="crl/T-v0", record=False)]
        assert first == [e.id for e in await m.search("door locked", task="crl/T-v0", record=False)]  # reproducible
        await m.aclose()

    asyncio.run(main())
    bank.close()
