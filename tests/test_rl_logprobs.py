"""Chunked, differentiable log-probs equal a naive full forward, for sequences and candidate actions."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.rl import (  # noqa: E402
    add_lora,
    batch_candidate_logprobs,
    batch_sequence_logprobs,
    candidate_logprobs,
    sequence_logprobs,
)
from crl_agent.rl import logprobs as logprobs_module  # noqa: E402


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, tmp_path_factory):
    return build_tiny_chat_model(tmp_path_factory.mktemp(request.param), arch=request.param)


def load(path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path).eval()


def naive(model, prompt, response):
    """Sum of per-token log-probs from one full forward and a full-vocabulary log-softmax."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return torch.stack([logp[len(prompt) - 1 + j, t] for j, t in enumerate(response)])


def ids(gen, n):
    return torch.randint(3, 259, (n,), generator=gen).tolist()


def test_sequence_logprobs_match_a_full_forward_in_a_padded_batch(model_dir):
    model = load(model_dir)
    gen = torch.Generator().manual_seed(1)
    prompts = [ids(gen, 9), ids(gen, 3), ids(gen, 14)]
    responses = [ids(gen, 5), ids(gen, 11), []]
    logp, mask = batch_sequence_logprobs(model, prompts, responses)
    assert logp.shape == (3, 11) and mask.sum(1).tolist() == [5, 11, 0]
    for i in range(2):
        torch.testing.assert_close(logp[i, : len(responses[i])], naive(model, prompts[i], responses[i]), atol=1e-4, rtol=0)
    assert (logp[~mask] == 0).all()
    single = sequence_logprobs(model, prompts[0], responses[0])
    torch.testing.assert_close(single, logp[0, :5], atol=1e-5, rtol=0)


def test_sequence_logprobs_at_each_responses_own_temperature(model_dir):
    model = load(model_dir)
    gen = torch.Generator().manual_seed(3)
    prompts, responses, temps = [ids(gen, 6), ids(gen, 4)], [ids(gen, 5), ids(gen, 7)], [0.5, 2.0]
    logp, _ = batch_sequence_logprobs(model, prompts, responses, temps)
    for i, (p, r, t) in enumerate(zip(prompts, responses, temps, strict=True)):
        logits = model(input_ids=torch.tensor([p + r])).logits[0].float() / t
        expected = torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(p) - 1 + len(r)), torch.tensor(r)]
        torch.testing.assert_close(logp[i, : len(r)], expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(sequence_logprobs(model, prompts[0], responses[0], 0.5), logp[0, :5], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        batch_sequence_logprobs(model, prompts, responses, [1.0, 0.0])
    with pytest.raises(ValueError, match="one per response"):
        batch_sequence_logprobs(model, prompts, responses, [1.0])


def test_sequence_logprobs_gradients_match_a_full_forward(model_dir):
    model = load(model_dir)
    gen = torch.Generator().manual_seed(2)
    prompt, response = ids(gen, 12), ids(gen, 6)
    sequence_logprobs(model, prompt, response).sum().backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    naive(model, prompt, response).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(ours[n], p.grad, atol=1e-5, rtol=1e-3, msg=n)
    assert any(g.abs().sum() > 0 for g in ours.values())


@pytest.mark.parametrize("method", ["packed", "cache"])
@pytest.mark.parametrize("norm", ["sum", "mean"])
def test_candidate_logprobs_match_one_forward_per_candidate(model_dir, method, norm):
    model = load(model_dir)
    gen = torch.Generator().manual_seed(3)
    prompts = [ids(gen, 20), ids(gen, 7)]
    candidates = [[ids(gen, n) for n in (3, 1, 6, 2)], [ids(gen, n) for n in (4, 4)]]
    got = batch_candidate_logprobs(model, prompts, candidates, norm=norm, method=method)
    for prompt, cands, scores in zip(prompts, candidates, got, strict=True):
        per_token = [naive(model, prompt, c) for c in cands]
        want = torch.stack([x.sum() if norm == "sum" else x.mean() for x in per_token])
        torch.testing.assert_close(scores, want, atol=1e-4, rtol=0)
    alone = candidate_logprobs(model, prompts[1], candidates[1], norm=norm, method=method)
    torch.testing.assert_close(alone, got[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["packed", "cache"])
def test_candidate_logprobs_gradients_match_a_full_forward(model_dir, method):
    model = load(model_dir)
    gen = torch.Generator().manual_seed(4)
    prompt, cands = ids(gen, 15), [ids(gen, n) for n in (2, 5, 3)]
    weights = torch.tensor([0.5, -1.0, 2.0])
    (candidate_logprobs(model, prompt, cands, method=method) * weights).sum().backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (torch.stack([naive(model, prompt, c).sum() for c in cands]) * weights).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(ours[n], p.grad, atol=1e-5, rtol=1e-3, msg=n)


def test_chunked_output_layer_gives_the_same_values_and_gradients(model_dir, monkeypatch):
    model = load(model_dir)
    gen = torch.Generator().manual_seed(5)
    prompt, response = ids(gen, 10), ids(gen, 9)
    whole = sequence_logprobs(model, prompt, response)
    whole.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    monkeypatch.setattr(logprobs_module, "_CHUNK_ELEMENTS", 2 * model.config.vocab_size)  # 2 rows a chunk
    chunked = sequence_logprobs(model, prompt, response)
    chunked.sum().backward()
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=0)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], atol=1e-6, rtol=1e-4, msg=n)


def test_lora_model_scores_through_its_adapter_and_only_the_adapter_gets_gradients(model_dir):
    pytest.importorskip("peft")
    model = add_lora(load(model_dir), r=4)
    with torch.no_grad():  # a non-zero adapter, so the check sees it
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(6))
    gen = torch.Generator().manual_seed(7)
    prompt, cands = ids(gen, 11), [ids(gen, 3), ids(gen, 2)]
    scores = candidate_logprobs(model, prompt, cands)
    want = torch.stack([naive(model, prompt, c).sum() for c in cands])
    torch.testing.assert_close(scores, want, atol=1e-4, rtol=0)
    with model.disable_adapter():
        base = torch.stack([naive(model, prompt, c).sum() for c in cands])
    assert not torch.allclose(scores, base, atol=1e-3)
    scores.sum().backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert trained and all("lora_" in n for n in trained)


def test_bad_token_ids_and_empty_candidates_are_refused(model_dir):
    model = load(model_dir)
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match="not a token id"):
        sequence_logprobs(model, [1, 2], [vocab])
    with pytest.raises(ValueError, match="not a token id"):
        candidate_logprobs(model, [1, -1], [[2]])
    with pytest.raises(ValueError, match="empty"):
        candidate_logprobs(model, [1, 2], [[3], []])
    with pytest.raises(ValueError, match="empty"):
        sequence_logprobs(model, [], [3])
    with pytest.raises(ValueError, match="at least one candidate"):
        candidate_logprobs(model, [1, 2], [])
    with pytest.raises(ValueError, match="norm"):
        candidate_logprobs(model, [1, 2], [[3]], norm="max")


def test_a_model_whose_logits_are_not_its_output_layer_is_refused(model_dir):
    model = load(model_dir)
    # Llama ignores this setting, so decoder + head (which would apply it) no longer equals its logits
    model.config.final_logit_softcapping = 0.01
    with pytest.raises(TypeError, match="not supported|does not support"):
        sequence_logprobs(model, [1, 2, 3], [4])


def test_the_backends_scores_are_what_the_learner_recomputes(model_dir):
    """``LLM.score_full``'s ids, replayed here, give its log-probs: the first PPO ratios are 1."""
    import asyncio

    from crl_agent.llm.transformers_backend import TransformersLLM

    async def score():
        llm = TransformersLLM(model_dir, dtype="float32", seed=0)
        try:
            messages = [{"role": "user", "content": "Which door leads out? Actions: red, green, blue"}]
            return llm.model, await llm.score_full(messages, ["red", "green", "blue", "go <|im_end|> now"])
        finally:
            await llm.aclose()

    model, result = asyncio.run(score())
    ours = candidate_logprobs(model, result.prompt_token_ids, result.candidate_token_ids)
    torch.testing.assert_close(ours, torch.tensor(result.logprobs), atol=1e-4, rtol=0)
