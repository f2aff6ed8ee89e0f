"""Schema-constrained decoding: the extractor's replies parse by construction on the transformers backend,
log-probs stay the model's own, and the openai backend sends ``response_format`` or falls back."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("llguidance")

from crl_agent.experience import extractor as ex  # noqa: E402
from crl_agent.experience.bank import ExperienceEntry  # noqa: E402
from crl_agent.llm import SamplingParams  # noqa: E402
from crl_agent.llm.base import check_sampling_params  # noqa: E402
from crl_agent.llm.constrained import close_reserve  # noqa: E402
from crl_agent.llm.openai_backend import OpenAILLM  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402
from tests.test_llm_hostile import OK_BODY, HostileServer, status  # noqa: E402

SHOWN = [ExperienceEntry(3, "crl/X-v0", "Doors", "If a door is locked, then find the key.", 0, 0),
         ExperienceEntry(8, "crl/X-v0", "Keys", "If a key is visible, then pick it up.", 0, 0)]
TRAJ = ex.Trajectory("t#0", "crl/X-v0", "reach the stairs", [("You see a room.", "north"), ("A wall.", "east")],
                     success=False, retrieved=SHOWN)


@pytest.fixture(scope="module")
def llm(tiny):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    backend = TransformersLLM(tiny, dtype="float32")
    yield backend
    asyncio.run(backend.aclose())
    torch.set_num_threads(threads)


def _chat(llm, messages, **params):
    return asyncio.run(llm.chat(messages, SamplingParams(**params)))


def test_random_model_distillations_all_parse_with_the_schema_and_none_without(llm):
    messages = ex.distil_messages(TRAJ, 1000, example=False)
    schema = ex.distil_schema({3, 8})
    free, kinds = 0, set()
    for seed in range(4):
        for max_tokens, temperature in ((96, 1.0), (200, 2.0)):
            c = _chat(llm, messages, max_tokens=max_tokens, temperature=temperature, seed=seed, json_schema=schema)
            ops, errors = ex.parse_distil(c.text, {3, 8})
            assert ops and not errors, (c.text, errors)
            assert len(c.token_ids) <= max_tokens
            kinds |= {op.kind for op in ops}
            assert all(set(op.target_ids) <= {3, 8} for op in ops)
            json.loads(c.text)  # strict JSON, not just what the lenient parser accepts
        plain = _chat(llm, messages, max_tokens=96, temperature=1.0, seed=seed)
        free += not ex.parse_distil(plain.text, {3, 8})[1]
    assert free == 0  # the same model writes nothing usable unconstrained: the schema is what makes it parse
    assert kinds  # at least one kind of op was written


def test_a_reply_cut_by_the_token_cap_is_closed_not_truncated(llm):
    """At temperature 2 a random model fills strings to their limits: over the cap but for the closing path."""
    messages = ex.distil_messages(TRAJ, 1000, example=False)
    closed = 0
    for seed in range(6):
        c = _chat(llm, messages, max_tokens=100, temperature=2.0, seed=seed, json_schema=ex.distil_schema({3, 8}))
        assert c.completion_tokens <= 100
        value = json.loads(c.text)
        assert 1 <= len(value["operations"]) <= ex.MAX_OPS
        closed += c.completion_tokens > 100 - close_reserve(100)  # still open when the reserve began
    assert closed >= 2


def test_merge_replies_parse_and_never_discard_the_whole_cluster(llm):
    messages = ex.merge_messages("crl/X-v0", SHOWN)
    for seed in range(4):
        c = _chat(llm, messages, max_tokens=160, temperature=1.5, seed=seed, json_schema=ex.merge_schema([3, 8]))
        decision, errors = ex.parse_merge(c.text, [3, 8])
        assert not errors, (c.text, errors)
        assert len(decision.discard_ids) < 2


def test_title_and_content_patterns_hold_in_every_distil_and_merge_reply(llm):
    import re

    title, content = r"^Rule [A-Z]$", r"^If [a-z]+, then [a-z]+\.$"
    distil = ex.distil_schema({3, 8}, title, content)
    merge = ex.merge_schema([3, 8], title, content)
    seen = 0
    for seed in range(3):
        c = _chat(llm, ex.distil_messages(TRAJ, 1000, example=False), max_tokens=240, temperature=1.0, seed=seed,
                  json_schema=distil)
        ops, errors = ex.parse_distil(c.text, {3, 8})
        m = _chat(llm, ex.merge_messages("crl/X-v0", SHOWN), max_tokens=240, temperature=1.0, seed=seed,
                  json_schema=merge)
        decision, merge_errors = ex.parse_merge(m.text, [3, 8])
        assert not errors and not merge_errors, (c.text, m.text)
        for entry in [op.entry for op in ops if op.entry] + decision.entries:
            assert re.fullmatch(title, entry.title) and re.fullmatch(content, entry.content), entry
            seen += 1
    assert seen  # the random model wrote entries, and each one matches


def test_no_update_op_is_offered_when_no_entry_was_shown():
    schema = ex.distil_schema(set())
    ops = schema["properties"]["operations"]["items"]["anyOf"]
    assert [o["properties"]["op"]["const"] for o in ops] == ["add", "none"]
    assert "DISCARD" not in json.dumps(ex.merge_schema([5]))


def test_constrained_logprobs_are_the_unmasked_models(llm):
    """The mask picks tokens; log-probs stay those a trainer's forward pass recomputes (the model's own)."""
    messages = ex.distil_messages(TRAJ, 1000, example=False)
    c = _chat(llm, messages, max_tokens=40, temperature=1.0, seed=1, json_schema=ex.distil_schema({3, 8}))
    scored = asyncio.run(llm.score_ids(c.prompt_token_ids, [c.token_ids]))
    assert c.logprobs == pytest.approx(scored.token_logprobs[0], abs=1e-4)
    assert c.sampling_logprobs == pytest.approx(c.logprobs, abs=1e-6)  # temperature 1


def test_greedy_constrained_decoding_is_deterministic_and_batch_independent(llm):
    messages = ex.distil_messages(TRAJ, 1000, example=False)
    params = SamplingParams(max_tokens=80, temperature=0.0, json_schema=ex.distil_schema({3, 8}))

    async def together():
        other = SamplingParams(max_tokens=30, temperature=1.0, seed=5)
        return await asyncio.gather(llm.chat(messages, params), llm.chat(messages, other), llm.chat(messages, params))

    alone = asyncio.run(llm.chat(messages, params))
    a, plain, b = asyncio.run(together())
    assert a.token_ids == b.token_ids == alone.token_ids
    json.loads(alone.text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(plain.text)


def test_schema_is_stored_as_json_text_and_bad_schemas_fail_before_queueing(llm):
    p = SamplingParams(json_schema={"type": "object"})
    assert p.json_schema == '{"type": "object"}' and hash(p) == hash(SamplingParams(json_schema='{"type": "object"}'))
    for bad in ("[1, 2]", "not json", '"a string"'):
        with pytest.raises(ValueError, match="json_schema"):
            check_sampling_params(SamplingParams(json_schema=bad))
    with pytest.raises(ValueError, match="json_schema"):
        _chat(llm, [{"role": "user", "content": "hi"}], max_tokens=8,
              json_schema={"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}})


# ----------------------------------------------------------------------------- the manager
def test_manager_distils_and_merges_through_the_schema_with_a_random_extractor(llm, tmp_path):
    pytest.importorskip("hnswlib")
    from crl_agent.experience import ExperienceBank, ExperienceManager, ManagerConfig

    bank = ExperienceBank(tmp_path / "bank", embedder="hash")
    shown = [bank.add("crl/X-v0", e.title, e.content) for e in SHOWN]
    sent: list[SamplingParams] = []
    chat = llm.chat

    async def recording_chat(messages, params=None):
        sent.append(params)
        return await chat(messages, params)

    async def main(config):
        m = ExperienceManager(bank, llm, config)
        for i in range(2):
            m.submit(ex.Trajectory(f"t#{i}", "crl/X-v0", "reach the stairs", TRAJ.steps, success=bool(i),
                                   retrieved=shown))
        await m.flush()
        await m.merge("crl/X-v0")
        await m.aclose()
        return m.stats

    llm.chat = recording_chat
    try:
        params = SamplingParams(max_tokens=160, temperature=1.0)
        stats = asyncio.run(main(ManagerConfig(merge_every=0, distil_params=params)))
        assert stats["malformed"] == 0 and stats["distillations"] == 2
        assert sent[0].json_schema == json.dumps(ex.distil_schema({e.id for e in shown}))
        assert {p.json_schema for p in sent} >= {json.dumps(ex.distil_schema({e.id for e in shown}))}
        sent.clear()
        asyncio.run(main(ManagerConfig(merge_every=0, distil_params=params, constrained=False)))
        assert sent and all(p.json_schema is None for p in sent)
    finally:
        del llm.chat
        bank.close()


# ----------------------------------------------------------------------------- openai response_format
@pytest.fixture
def server():
    made: list[HostileServer] = []

    def make(*behaviours) -> HostileServer:
        made.append(HostileServer(*behaviours))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_openai_backend_sends_response_format_with_the_schema(server):
    srv = server(status(200))
    llm = OpenAILLM(model="m", base_url=srv.url, max_retries=0)
    schema = ex.distil_schema({3})
    asyncio.run(llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=8, json_schema=schema)))
    body = json.loads(srv.requests[0][1])
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "distil_operations", "schema": schema, "strict": True}}
    assert llm.response_format_supported is True
    asyncio.run(llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=8)))
    assert "response_format" not in json.loads(srv.requests[1][1])


def test_openai_backend_retries_without_response_format_once_refused_and_remembers(server):
    refusal = {"error": {"message": "Unrecognized request argument supplied: response_format"}}
    srv = server(status(400, refusal), status(200))
    llm = OpenAILLM(model="m", base_url=srv.url, max_retries=0)
    params = SamplingParams(max_tokens=8, json_schema=ex.distil_schema(set()))
    c = asyncio.run(llm.chat([{"role": "user", "content": "hi"}], params))
    assert c.text == OK_BODY["choices"][0]["message"]["content"]
    assert llm.response_format_supported is False
    asyncio.run(llm.chat([{"role": "user", "content": "hi"}], params))
    sent = [json.loads(body) for _, body in srv.requests]
    assert ["response_format" in b for b in sent] == [True, False, False]


def test_openai_backend_reports_other_400s_as_errors(server):
    from crl_agent.llm import LLMError

    srv = server(status(400, {"error": {"message": "max_tokens is too large"}}))
    llm = OpenAILLM(model="m", base_url=srv.url, max_retries=0)
    with pytest.raises(LLMError, match="max_tokens is too large"):
        asyncio.run(llm.chat([{"role": "user", "content": "hi"}],
                             SamplingParams(max_tokens=8, json_schema=ex.distil_schema(set()))))
    assert llm.response_format_supported is None and len(srv.requests) == 1
