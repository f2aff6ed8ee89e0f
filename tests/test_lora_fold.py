"""LoRA folded into the engine's weights: the same scores and tokens as peft's forward, refolded after
every weight change, and never in a forward that trains or runs without the adapter."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from crl_agent.llm import SamplingParams  # noqa: E402
from crl_agent.llm.hf_engine import ForwardEngine, GenRequest, ScoreRequest  # noqa: E402
from crl_agent.llm.lora_fold import FoldedLoRA  # noqa: E402
from crl_agent.llm.prefix_cache import PrefixCache  # noqa: E402
from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402
from crl_agent.rl import add_lora  # noqa: E402

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


@pytest.fixture
def adapted(tmp_path):
    """A tiny float32 backend whose model carries a LoRA adapter with non-zero weights (as after updates)."""
    llm = TransformersLLM(build_tiny_chat_model(tmp_path / "tiny"), max_context=512, dtype="float32")
    add_lora(llm.model, r=4)  # in place, as the trainer does: the engine's model now holds peft layers
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in llm.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return llm


def _engine(llm, fold: bool) -> ForwardEngine:
    return ForwardEngine(llm.model, device="cpu", pad_id=llm.pad_id, eos_ids=frozenset(), cache=PrefixCache(0),
                         decode_ids=llm.tokenizer.decode, model_name="tiny", policy_version=lambda: 0,
                         fold_lora=fold)


def _requests(llm):
    prompt = llm.render(CHAT)
    return [ScoreRequest(prompt, [[5], [6, 7], [8, 9, 10]]), ScoreRequest(prompt[:-3], [[11, 12]]),
            GenRequest(prompt, SamplingParams(max_tokens=10, temperature=0.0), 10, 0),
            GenRequest(prompt[:-2], SamplingParams(max_tokens=8, temperature=1.0), 8, 5)]


def _lora_calls(llm):
    """How often a peft adapter branch (lora_A) ran: 0 while the engine reads folded weights."""
    calls = []
    for name, m in llm.model.named_modules():
        if name.endswith("lora_A.default"):
            m.register_forward_hook(lambda *a: calls.append(1))
    return calls


def _assert_same(got, want):
    for g, w in zip(got, want, strict=True):
        if hasattr(w, "token_ids"):
            assert g.token_ids == w.token_ids
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
        else:
            for a, b in zip(g.token_logprobs, w.token_logprobs, strict=True):
                assert a == pytest.approx(b, abs=1e-4)


def test_folded_forwards_score_and_generate_what_peft_does_and_skip_its_branch(adapted):
    folded, plain = _engine(adapted, True), _engine(adapted, False)
    calls = _lora_calls(adapted)
    want = plain.run(_requests(adapted))
    assert calls, "the unfolded engine runs peft's adapter branch"
    calls.clear()
    got = folded.run(_requests(adapted))
    assert not calls, "the folded engine still ran peft's adapter branch"
    _assert_same(got, want)
    # the adapter matters here: without it the scores differ, so agreeing above is not trivial
    with _disabled(adapted.model):
        bare = plain.run(_requests(adapted))
    assert bare[0].token_logprobs[0] != pytest.approx(want[0].token_logprobs[0], abs=1e-3)


class _disabled:
    """peft's disable_adapter for a model whose layers were injected in place (no PeftModel wrapper)."""

    def __init__(self, model):
        from peft.tuners.lora.layer import LoraLayer

        self.layers = [m for m in model.modules() if isinstance(m, LoraLayer)]

    def __enter__(self):
        for m in self.layers:
            m.enable_adapters(False)

    def __exit__(self, *exc):
        for m in self.layers:
            m.enable_adapters(True)


def test_a_weight_update_refolds_and_a_disabled_adapter_is_not_folded(adapted):
    folded, plain = _engine(adapted, True), _engine(adapted, False)
    folded.run(_requests(adapted))
    assert folded.fold.refreshes == 1
    folded.run(_requests(adapted))
    assert folded.fold.refreshes == 1  # nothing changed: the folded weights are reused
    with torch.no_grad():  # an optimiser step changes the adapter in place
        for name, p in adapted.model.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.5)
    got = folded.run(_requests(adapted))
    assert folded.fold.refreshes == 2
    _assert_same(got, plain.run(_requests(adapted)))
    # the diagnostics' reference policy: the adapter switched off is the base model, folded or not
    with _disabled(adapted.model):
        _assert_same(folded.run(_requests(adapted)), plain.run(_requests(adapted)))


def test_the_folded_path_is_for_the_engines_thread_and_never_for_a_forward_that_trains(adapted):
    fold = FoldedLoRA(adapted.model)
    ids = torch.tensor([adapted.render(CHAT)])
    with torch.no_grad():
        want = adapted.model(input_ids=ids).logits
    seen = {}

    def other_thread():  # a learner on another thread while the engine's block is open
        calls = _lora_calls(adapted)
        with torch.no_grad():
            adapted.model(input_ids=ids)
        seen["other"] = len(calls)

    with fold.active():
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        loss = adapted.model(input_ids=ids).logits.float().logsumexp(-1).mean()
        loss.backward()  # with gradient: peft's own forward, so the adapter gets its gradient
        with torch.no_grad():
            torch.testing.assert_close(adapted.model(input_ids=ids).logits, want, atol=1e-4, rtol=1e-4)
    assert seen["other"] > 0, "another thread's forward was folded"
    grads = [p.grad for n, p in adapted.model.named_parameters() if "lora_" in n]
    assert grads and all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_a_new_policy_version_refolds_even_a_write_the_tensors_do_not_count(adapted):
    version = [0]
    folded = ForwardEngine(adapted.model, device="cpu", pad_id=adapted.pad_id, eos_ids=frozenset(),
                           cache=PrefixCache(0), decode_ids=adapted.tokenizer.decode, model_name="tiny",
                           policy_version=lambda: version[0])
    folded.run(_requests(adapted))
    for name, p in adapted.model.named_parameters():
        if "lora_B" in name:
            p.data.mul_(-1.5)  # through .data: the parameter's own version counter does not move
    folded.run(_requests(adapted))
    assert folded.fold.refreshes == 1
    version[0] += 1  # what the backend does after every update (update_weights, set_policy_version)
    got = folded.run(_requests(adapted))
    assert folded.fold.refreshes == 2
    _assert_same(got, _engine(adapted, False).run(_requests(adapted)))
