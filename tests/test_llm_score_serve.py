"""Scoring through the openai backend against crl_agent.serve's /v1/completions (echo + logprobs) on loopback."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from crl_agent.llm import SamplingParams, ScoringUnsupported  # noqa: E402
from crl_agent.llm.openai_backend import OpenAILLM  # noqa: E402
from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402
from crl_agent.serve import ChatServer  # noqa: E402

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Which way?"}]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def backend(tiny_dir):
    return TransformersLLM(tiny_dir, dtype="float32", batch_wait_ms=20)


@pytest.fixture(scope="module")
def server(backend):
    srv = ChatServer(backend, port=0).start()
    yield srv
    srv.close()


class ChatOnlyServer:
    """Answers every POST with ``status`` and a chat completion (no echoed log-probs): a server that cannot score."""

    def __init__(self, status: int):
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = {"choices": [{"index": 0, "text": "ok", "logprobs": None}]} if status == 200 else {
                    "error": {"message": "echo is not supported"}}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------- tests
MOVES = ["north", "northeast", "<|im_end|>", "south", "north"]


def test_openai_backend_scores_over_loopback_like_the_backend_itself(server, backend, tiny_dir):
    client = OpenAILLM(server.model_name, base_url=server.url, tokenizer=str(tiny_dir))
    remote = run(client.score_full(CHAT, MOVES))
    local = run(backend.score_full(CHAT, MOVES))
    assert remote.prompt_token_ids == local.prompt_token_ids
    assert remote.candidate_token_ids == local.candidate_token_ids
    assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-4)
    assert remote.logprobs[0] == remote.logprobs[4]
    assert run(client.score(CHAT, MOVES, norm="mean")) == pytest.approx(
        [lp / n for lp, n in zip(remote.logprobs, remote.token_counts, strict=True)])


def test_openai_scoring_without_a_tokenizer_says_to_use_generate(server):
    with pytest.raises(ScoringUnsupported, match="action_mode=generate"):
        run(OpenAILLM(server.model_name, base_url=server.url).score(CHAT, ["north"]))


@pytest.mark.parametrize("status", [200, 400, 404])
def test_a_server_without_echoed_logprobs_gives_a_clear_scoring_error(tiny_dir, status):
    srv = ChatOnlyServer(status)
    try:
        client = OpenAILLM("m", base_url=srv.url, tokenizer=str(tiny_dir), max_retries=0)
        with pytest.raises(ScoringUnsupported, match="action_mode=generate"):
            run(client.score(CHAT, ["north"]))
    finally:
        srv.close()


def test_completions_echo_gives_each_prompt_tokens_logprob(server, backend):
    ids = backend.render(CHAT) + backend.candidate_ids("north")
    body = {"prompt": [ids, "plain text prompt"], "max_tokens": 0, "echo": True, "logprobs": 1}
    r = httpx.post(f"{server.url}/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    first, second = r.json()["choices"]
    lps = first["logprobs"]["token_logprobs"]
    assert len(lps) == len(ids) and lps[0] is None and all(v <= 0 for v in lps[1:])
    want = run(backend.score_ids(ids[:1], [ids[1:]])).token_logprobs[0]
    assert lps[1:] == pytest.approx(want, abs=1e-4)
    assert len(second["logprobs"]["tokens"]) == len(backend.encode("plain text prompt"))
    assert r.json()["usage"]["completion_tokens"] == 0


def test_completions_generate_from_token_ids(server, backend):
    ids = backend.render(CHAT)
    body = {"prompt": ids, "max_tokens": 4, "temperature": 0, "return_token_ids": True, "logprobs": 0}
    choice = httpx.post(f"{server.url}/completions", json=body, timeout=60).json()["choices"][0]
    direct = run(backend.chat(CHAT, SamplingParams(max_tokens=4, temperature=0)))
    assert choice["token_ids"] == direct.token_ids and choice["text"] == direct.text


@pytest.mark.parametrize(("body", "fragment"), [
    ({"max_tokens": 1}, "prompt must be"),
    ({"prompt": []}, "prompt must be"),
    ({"prompt": "hi", "logprobs": 99}, "logprobs"),
    ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "hi", "echo": "yes"}, "echo"),
    ({"prompt": [[10**9]], "max_tokens": 1}, "token id"),
    ({"prompt": ["a"] * 300}, "at most"),
    ({"prompt": "hi", "n": 2}, "n=1"),
])
def test_bad_completions_requests_get_a_400(server, body, fragment):
    r = httpx.post(f"{server.url}/completions", json=body, timeout=30)
    assert r.status_code == 400 and fragment in r.json()["error"]["message"]
