"""The openai backend against real HTTP servers on loopback: our own crl_agent.serve and fault injectors."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("torch")
pytest.importorskip("httpx")

from crl_agent.llm import LLMError, SamplingParams  # noqa: E402
from crl_agent.llm.openai_backend import OpenAILLM  # noqa: E402
from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402
from crl_agent.serve import ChatServer  # noqa: E402

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there."}]
SECRET = "sk-test-SECRET-0123456789"


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def backend(tiny_dir):
    return TransformersLLM(tiny_dir, batch_wait_ms=20)


@pytest.fixture(scope="module")
def server(backend):
    srv = ChatServer(backend, port=0).start()
    yield srv
    srv.close()


# ---------------------------------------------------------------- fault injectors
class ScriptedServer:
    """Answers each POST from a script of (status, delay_s) and then a canned completion."""

    def __init__(self, script: list[tuple[int, float]]):
        self.script, self.requests, self.auth = list(script), 0, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests += 1
                outer.auth.append(self.headers.get("Authorization"))
                status, delay = outer.script.pop(0) if outer.script else (200, 0.0)
                time.sleep(delay)
                body = {"error": {"message": "overloaded"}} if status != 200 else {
                    "model": "scripted", "choices": [{"message": {"role": "assistant", "content": "ok"},
                                                      "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if status == 503:
                        self.send_header("Retry-After", "0")
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    made = []

    def make(script):
        made.append(ScriptedServer(script))
        return made[-1]

    yield make
    for s in made:
        s.close()


# ---------------------------------------------------------------- our server
def test_server_completion_matches_the_backend_called_directly(server, backend):
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=42)
    direct = run(backend.chat(CHAT, params))
    client = OpenAILLM(server.model_name, base_url=server.url, return_token_ids=True)
    remote = run(client.chat(CHAT, params))
    assert remote.text == direct.text
    assert remote.token_ids == direct.token_ids
    assert remote.prompt_token_ids == direct.prompt_token_ids
    assert remote.logprobs == pytest.approx(direct.logprobs, abs=1e-5)
    assert remote.prompt_tokens == direct.prompt_tokens and remote.completion_tokens == len(direct.token_ids)


def test_logprobs_and_usage_without_token_ids(server):
    client = OpenAILLM(server.model_name, base_url=server.url)
    c = run(client.chat(CHAT, SamplingParams(max_tokens=6, temperature=1.0, seed=3)))
    assert c.token_ids == [] and 1 <= len(c.logprobs) <= 6
    assert c.completion_tokens == len(c.logprobs)  # from the server's usage
    assert all(lp <= 0 for lp in c.logprobs)


def test_stop_and_max_tokens_reach_the_backend(server, backend):
    backend_eos, backend.eos_ids = backend.eos_ids, frozenset()
    try:
        client = OpenAILLM(server.model_name, base_url=server.url, return_token_ids=True)
        free = run(client.chat(CHAT, SamplingParams(max_tokens=30, temperature=1.0, seed=9)))
        assert len(free.token_ids) == 30 and free.finish_reason == "length"
        text = free.text
        k = next(i for i in range(len(text) // 2, len(text)) if text[i].isascii() and text[i].isprintable())
        c = run(client.chat(CHAT, SamplingParams(max_tokens=30, temperature=1.0, seed=9, stop=(text[k],))))
        assert c.text == text[: text.find(text[k])] and c.finish_reason == "stop"
    finally:
        backend.eos_ids = backend_eos


def test_models_endpoint_names_the_model_and_client_defaults_to_it(server):
    client = OpenAILLM(None, base_url=server.url)
    assert run(client.list_models()) == [server.model_name]
    run(client.chat(CHAT, SamplingParams(max_tokens=2)))
    assert client.model == server.model_name


def test_concurrent_http_requests_are_batched_by_the_backend(server, backend):
    client = OpenAILLM(server.model_name, base_url=server.url)

    async def go():
        return await asyncio.gather(*(client.chat(CHAT, SamplingParams(max_tokens=8, seed=i)) for i in range(6)))

    before = backend.batch_stats.batches
    outs = run(go())
    assert len(outs) == 6 and backend.batch_stats.batches - before < 6


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"messages": CHAT, "stream": True}, 400, "stream"),
        ({"messages": CHAT, "n": 3}, 400, "n=1"),
        ({"messages": []}, 400, "messages"),
        ({"messages": CHAT, "model": "gpt-9"}, 404, "not served"),
        ({"messages": CHAT, "temperature": "hot"}, 400, "sampling"),
        ({"messages": [{"role": "alien", "content": "x"}]}, 400, "role"),
    ],
)
def test_bad_requests_get_openai_style_errors(server, body, status, fragment):
    import httpx

    r = httpx.post(f"{server.url}/chat/completions", json=body, timeout=30)
    assert r.status_code == status
    assert fragment in r.json()["error"]["message"]


def test_client_reports_a_4xx_at_once_without_retrying(server):
    client = OpenAILLM("gpt-9", base_url=server.url, backoff_s=5.0)
    t0 = time.perf_counter()
    with pytest.raises(LLMError, match="404"):
        run(client.chat(CHAT))
    assert time.perf_counter() - t0 < 4


# ---------------------------------------------------------------- retries, timeouts, keys
def test_503s_are_retried_with_backoff_until_ok(scripted):
    srv = scripted([(503, 0.0), (503, 0.0)])
    client = OpenAILLM("m", base_url=srv.url, backoff_s=0.01, max_retries=3)
    c = run(client.chat(CHAT))
    assert c.text == "ok" and srv.requests == 3 and c.completion_tokens == 1


def test_retries_give_up_with_the_last_error(scripted):
    srv = scripted([(503, 0.0)] * 5)
    client = OpenAILLM("m", base_url=srv.url, backoff_s=0.01, max_retries=2)
    with pytest.raises(LLMError, match="after 3 attempts.*503"):
        run(client.chat(CHAT))
    assert srv.requests == 3


def test_a_slow_server_times_out_and_is_retried(scripted):
    srv = scripted([(200, 3.0)])
    client = OpenAILLM("m", base_url=srv.url, timeout=0.3, backoff_s=0.01, max_retries=1)
    t0 = time.perf_counter()
    c = run(client.chat(CHAT))  # first attempt times out, the retry is answered at once
    assert c.text == "ok" and srv.requests == 2 and time.perf_counter() - t0 < 2.5

    srv2 = scripted([(200, 3.0), (200, 3.0)])
    client = OpenAILLM("m", base_url=srv2.url, timeout=0.3, backoff_s=0.01, max_retries=1)
    with pytest.raises(LLMError, match="Timeout"):
        run(client.chat(CHAT))


def test_unreachable_server_is_a_clear_error():
    client = OpenAILLM("m", base_url="http://127.0.0.1:9/v1", backoff_s=0.01, max_retries=1, timeout=2)
    with pytest.raises(LLMError, match="failed after 2 attempts"):
        run(client.chat(CHAT))


def test_api_key_is_sent_but_never_logged_or_configured(scripted, monkeypatch, caplog):
    monkeypatch.setenv("MY_KEY", SECRET)
    srv = scripted([(503, 0.0)])
    caplog.set_level(logging.DEBUG)
    client = OpenAILLM("m", base_url=srv.url, api_key_env="MY_KEY", backoff_s=0.01)
    assert run(client.chat(CHAT)).text == "ok"
    assert srv.auth == [f"Bearer {SECRET}"] * 2
    assert caplog.records, "retries and httpx requests should have logged something"
    assert SECRET not in caplog.text
    assert SECRET not in json.dumps(client.config()) and SECRET not in repr(client)
    assert client.config()["api_key_env"] == "MY_KEY"


def test_server_with_api_key_rejects_wrong_keys(backend, monkeypatch):
    monkeypatch.setenv("SERVE_KEY", SECRET)
    with ChatServer(backend, port=0, api_key_env="SERVE_KEY") as srv:
        monkeypatch.setenv("CLIENT_KEY", "wrong")
        with pytest.raises(LLMError, match="401"):
            run(OpenAILLM(srv.model_name, base_url=srv.url, api_key_env="CLIENT_KEY").chat(CHAT))
        ok = OpenAILLM(srv.model_name, base_url=srv.url, api_key_env="SERVE_KEY")
        assert run(ok.chat(CHAT, SamplingParams(max_tokens=2))).prompt_tokens > 0


def test_serve_cli_starts_a_server_on_a_free_port(tiny_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "crl_agent.serve", "--backend", "transformers", "--model", str(tiny_dir),
         "--port", "0", "--quiet", "--num-threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving tiny-llama on http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        url = line.split(" on ", 1)[1].strip()
        c = run(OpenAILLM(None, base_url=url).chat(CHAT, SamplingParams(max_tokens=4, seed=0)))
        assert 1 <= len(c.logprobs) <= 4
    finally:
        proc.terminate()
        proc.wait(timeout=30)
