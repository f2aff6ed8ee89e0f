"""Hostile inputs for the LLM stack: misbehaving servers for the openai backend, bad requests for
``crl_agent.serve``, and bad calls to the transformers backend. All servers are real, on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from crl_agent.llm import LLMError, SamplingParams  # noqa: E402
from crl_agent.llm.openai_backend import OpenAILLM  # noqa: E402
from crl_agent.llm.tiny import build_tiny_chat_model  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402
from crl_agent.serve import ChatServer  # noqa: E402
from tests.net_support import free_port  # noqa: E402

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
SECRET = "sk-secret-hostile-0123456789abcdef"
OK_BODY = {
    "model": "hostile",
    "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop",
                 "logprobs": {"content": [{"token": "ok", "logprob": -0.5}]}}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 1},
}


def run(coro):
    return asyncio.run(coro)


# ======================================================================= a raw hostile HTTP server
Behaviour = Callable[["_Conn"], None]


class _Conn:
    """What a behaviour gets: the socket, the request just read, and the server's stop event."""

    def __init__(self, sock: socket.socket, head: str, body: bytes, stop: threading.Event):
        self.sock, self.head, self.body, self.stop = sock, head, body, stop

    def send(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        lines = [f"HTTP/1.1 {status} Whatever", f"Content-Length: {len(data)}", "Connection: close",
                 "Content-Type: application/json", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data)


class HostileServer:
    """Loopback HTTP/1.1 server; request ``i`` is handled by ``behaviours[min(i, len - 1)]``."""

    def __init__(self, *behaviours: Behaviour):
        self.behaviours, self.requests = list(behaviours), []
        self.stop = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                f = self.request.makefile("rb")
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = f.readline()
                    if not line:
                        return
                    head += line
                text = head.decode("latin-1")
                length = next((int(h.split(":", 1)[1]) for h in text.split("\r\n")
                               if h.lower().startswith("content-length:")), 0)
                body = f.read(length)
                outer.requests.append((text, body))
                behaviour = outer.behaviours[min(len(outer.requests) - 1, len(outer.behaviours) - 1)]
                try:
                    behaviour(_Conn(self.request, text, body, outer.stop))
                except OSError:
                    pass  # the client gave up, as it should

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/v1"

    def close(self) -> None:
        self.stop.set()
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def hostile():
    made: list[HostileServer] = []

    def make(*behaviours: Behaviour) -> HostileServer:
        made.append(HostileServer(*behaviours))
        return made[-1]

    yield make
    for s in made:
        s.close()


def status(code: int, payload: object = None, headers: dict[str, str] | None = None) -> Behaviour:
    return lambda c: c.send(code, OK_BODY if payload is None else payload, headers)


def hang(c: _Conn) -> None:
    c.stop.wait(30)


def trickle(c: _Conn) -> None:
    """Headers, then one byte every 50 ms: never idle long enough for a per-read timeout."""
    c.sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nContent-Type: application/json\r\n\r\n")
    while not c.stop.wait(0.05):
        c.sock.sendall(b" ")


def giant(declare: bool) -> Behaviour:
    def behave(c: _Conn) -> None:
        size = "Content-Length: 10000000000\r\n" if declare else "Connection: close\r\n"
        c.sock.sendall(f"HTTP/1.1 200 OK\r\n{size}Content-Type: application/json\r\n\r\n".encode())
        chunk = b"[" * 65536
        for _ in range(4096):  # 256 MiB at most, far more than the client may read
            if c.stop.is_set():
                return
            c.sock.sendall(chunk)

    return behave


def cut(c: _Conn) -> None:
    """Promise 1000 bytes, send 10, close."""
    c.sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nContent-Type: application/json\r\n\r\n{\"choices\"")
    c.sock.shutdown(socket.SHUT_RDWR)


def client(url: str, **kw) -> OpenAILLM:
    kw = {"backoff_s": 0.01, "max_retries": 2, "timeout": 5.0, **kw}
    return OpenAILLM("m", base_url=url, **kw)


# ======================================================================= 1. openai backend
@pytest.mark.parametrize("code", [500, 502, 520, 529])
def test_http_5xx_then_success_is_retried(hostile, code):
    srv = hostile(status(code, {"error": {"message": "boom"}}), status(200))
    c = run(client(srv.url).chat(CHAT))
    assert c.text == "ok" and len(srv.requests) == 2


def test_http_501_is_not_retried(hostile):
    srv = hostile(status(501, {"error": {"message": "no such feature"}}))
    with pytest.raises(LLMError, match="failed with HTTP 501: no such feature"):
        run(client(srv.url).chat(CHAT))
    assert len(srv.requests) == 1


def test_429_retry_after_is_honoured(hostile):
    srv = hostile(status(429, {"error": {"message": "slow down"}}, {"Retry-After": "0.4"}), status(200))
    t0 = time.perf_counter()
    c = run(client(srv.url, backoff_s=0.001).chat(CHAT))
    assert c.text == "ok" and len(srv.requests) == 2
    assert time.perf_counter() - t0 >= 0.35  # waited what the server asked, not the 1 ms backoff


@pytest.mark.parametrize("retry_after", ["3600", "Wed, 21 Oct 2099 07:28:00 GMT", "soon", "-4", "nan"])
def test_429_retry_after_is_bounded_by_max_backoff(hostile, retry_after):
    srv = hostile(status(429, {"error": {"message": "slow down"}}, {"Retry-After": retry_after}))
    t0 = time.perf_counter()
    with pytest.raises(LLMError, match=r"after 2 attempts: HTTP 429: slow down"):
        run(client(srv.url, max_retries=1, max_backoff_s=0.2).chat(CHAT))
    assert time.perf_counter() - t0 < 5  # an hour-long Retry-After is capped at max_backoff_s


@pytest.mark.parametrize("code", [400, 401, 404, 422])
def test_client_errors_fail_at_once_naming_status_and_message_but_never_the_key(hostile, monkeypatch, code):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    echo = f"Incorrect API key provided: {SECRET}. You can find your key at example.com"
    srv = hostile(status(code, {"error": {"message": echo, "type": "invalid_request_error"}}))
    with pytest.raises(LLMError) as info:
        run(client(srv.url, backoff_s=5.0).chat(CHAT))
    msg = str(info.value)
    assert f"HTTP {code}" in msg and "Incorrect API key provided: ***" in msg and srv.url in msg
    assert SECRET not in msg and SECRET not in repr(info.value.__cause__) + repr(info.value.__context__)
    assert len(srv.requests) == 1
    assert f"Bearer {SECRET}" in srv.requests[0][0]  # the key was sent, only in the header


def test_server_that_never_answers_costs_at_most_timeout_per_attempt(hostile):
    srv = hostile(hang)
    t0 = time.perf_counter()
    with pytest.raises(LLMError, match=r"after 3 attempts: Timeout: no complete answer within 0.3s"):
        run(client(srv.url, timeout=0.3, max_retries=2).chat(CHAT))
    assert len(srv.requests) == 3 and time.perf_counter() - t0 < 3


def test_trickling_server_is_cut_at_the_total_timeout(hostile):
    """Before the fix a byte every 50 ms kept httpx's per-read timeout from ever firing."""
    srv = hostile(trickle)
    t0 = time.perf_counter()
    with pytest.raises(LLMError, match="Timeout"):
        run(client(srv.url, timeout=0.4, max_retries=1).chat(CHAT))
    assert len(srv.requests) == 2 and time.perf_counter() - t0 < 4


def test_connection_refused_names_the_url():
    port = free_port()  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(LLMError, match=rf"POST {url}/chat/completions failed after 3 attempts: ConnectError"):
        run(client(url).chat(CHAT))


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"<html>502 bad gateway</html>", "invalid JSON"),
        (b"[1, 2, 3]", "not an object"),
        (b"[" * 100_000, "invalid JSON"),
        ({"object": "chat.completion"}, "malformed"),
        ({"choices": []}, "malformed"),
        ({"choices": None}, "malformed"),
        ({"choices": ["text"]}, "malformed"),
        ({"choices": [{"message": "just a string"}]}, "malformed"),
    ],
)
def test_malformed_answers_are_a_clear_error_and_not_retried(hostile, payload, fragment):
    srv = hostile(status(200, payload))
    with pytest.raises(LLMError, match=fragment):
        run(client(srv.url).chat(CHAT))
    assert len(srv.requests) == 1


@pytest.mark.parametrize(
    ("choice", "extra", "expect"),
    [
        ({"message": {"content": None}, "finish_reason": "tool_calls"}, {}, {"text": "", "finish_reason": "stop"}),
        ({"message": {"content": "hi"}}, {}, {"text": "hi", "logprobs": [], "prompt_tokens": 0}),
        ({"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}, {},
         {"text": "ab"}),
        ({"message": {"content": "hi"}, "logprobs": {"content": [{"token": "h", "logprob": None}]}}, {},
         {"logprobs": []}),
        ({"message": {"content": "hi"}, "logprobs": "garbage"}, {"usage": "lots"}, {"logprobs": [], "prompt_tokens": 0}),
        ({"message": {"content": "hi"}, "logprobs": {"content": [1, "x"]}, "token_ids": ["a", None]},
         {"usage": {"prompt_tokens": "many", "completion_tokens": -3}}, {"token_ids": [], "prompt_tokens": 0}),
    ],
)
def test_optional_fields_missing_or_garbled_degrade_gracefully(hostile, choice, extra, expect):
    srv = hostile(status(200, {"choices": [choice], **extra}))
    c = run(client(srv.url).chat(CHAT))
    for key, value in expect.items():
        assert getattr(c, key) == value, key
    assert c.completion_tokens == 0 and c.model == "m"


@pytest.mark.parametrize("declare", [True, False], ids=["content-length", "until-close"])
def test_gigantic_answer_is_cut_at_max_response_bytes(hostile, declare):
    srv = hostile(giant(declare))
    t0 = time.perf_counter()
    with pytest.raises(LLMError, match="max_response_bytes=1048576"):
        run(client(srv.url, max_response_bytes=2**20).chat(CHAT))
    assert len(srv.requests) == 1 and time.perf_counter() - t0 < 10


def test_connection_closed_mid_answer_is_retried(hostile):
    srv = hostile(cut, status(200))
    c = run(client(srv.url).chat(CHAT))
    assert c.text == "ok" and len(srv.requests) == 2


def test_models_listing_that_is_not_a_list_is_a_clear_error(hostile):
    srv = hostile(status(200, {"data": "nope"}))
    with pytest.raises(LLMError, match="lists no model"):
        run(OpenAILLM(None, base_url=srv.url).chat(CHAT))


def test_api_key_in_no_exception_log_config_or_repr(hostile, monkeypatch, caplog):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    echo = {"error": {"message": f"bad key {SECRET}"}}
    srv = hostile(status(500, echo), hang, cut, status(401, echo))
    llm = client(srv.url, timeout=0.3, max_retries=3)
    with pytest.raises(LLMError) as info:
        run(llm.chat(CHAT))
    assert len(srv.requests) == 4 and caplog.records
    texts = [str(info.value), repr(info.value), caplog.text, json.dumps(llm.config()), repr(llm), repr(vars(llm))]
    texts += [r.getMessage() + repr(r.args) + str(r.exc_info) for r in caplog.records]
    assert not [t for t in texts if SECRET in t]
    assert "bad key ***" in str(info.value)


# ======================================================================= 2. our server
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "tiny-llama", max_context=1024)


@pytest.fixture(scope="module")
def backend(tiny_dir):
    return TransformersLLM(tiny_dir, batch_wait_ms=20, max_context=1024)


@pytest.fixture(scope="module")
def server(backend):
    srv = ChatServer(backend, port=0, io_timeout=1.0).start()
    yield srv
    srv.close()


def raw_request(url: str, data: bytes, timeout: float = 30.0) -> tuple[int, dict]:
    """Send raw bytes to the server at ``url``; return (status, JSON body) of its answer."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        f = s.makefile("rb")
        code = int(f.readline().split()[1])
        length = 0
        while (line := f.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return code, json.loads(f.read(length))


def post(url: str, body: bytes, extra: str = "") -> tuple[int, dict]:
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return raw_request(url, head.encode() + body)


def assert_error(code: int, body: dict, want: int, fragment: str) -> None:
    assert code == want, body
    err = body["error"]
    assert set(err) == {"message", "type", "code"} and err["code"] == want
    assert fragment in err["message"], err["message"]


def good(server, **extra) -> dict:
    r = httpx.post(f"{server.url}/chat/completions", json={"messages": CHAT, "max_tokens": 3, **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _msg(**kw):
    return json.dumps({"messages": CHAT, **kw}).encode()


@pytest.mark.parametrize(
    ("body", "want", "fragment"),
    [
        (b"{not json", 400, "invalid JSON"),
        (b"\xff\xfe\x00garbage", 400, "invalid JSON"),
        (b"[" * 200_000 + b"]" * 200_000, 400, "invalid JSON"),
        (b"", 400, "JSON object"),
        (b'"a string"', 400, "JSON object"),
        (b"{}", 400, "messages"),
        (b'{"messages": "hello"}', 400, "messages"),
        (b'{"messages": [42]}', 400, "messages[0]"),
        (b'{"messages": [{"role": "user", "content": 42}]}', 400, "string content"),
        (b'{"messages": [{"role": "user"}]}', 400, "string content"),
        (_msg(max_tokens="lots"), 400, "max_tokens must be an integer"),
        (_msg(max_tokens=0), 400, "max_tokens must be at least 1"),
        (_msg(max_tokens=-5), 400, "max_tokens must be at least 1"),
        (_msg(max_tokens=2.5), 400, "max_tokens must be an integer"),
        (_msg(max_tokens=True), 400, "max_tokens must be an integer"),
        (_msg(max_completion_tokens=0, max_tokens=5), 400, "max_completion_tokens must be at least 1"),
        (_msg(temperature=-1), 400, "temperature must be >= 0"),
        (_msg(temperature="hot"), 400, "temperature must be a finite number"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, "finite number"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": Infinity}', 400, "finite number"),
        (_msg(top_p=0), 400, "top_p"),
        (_msg(seed="lucky"), 400, "seed must be an integer"),
        (_msg(n=1000), 400, "n=1"),
        (_msg(n=True), 400, "n=1"),
        (_msg(stop=[1, 2]), 400, "stop"),
        (_msg(stop=["x"] * 100), 400, "stop strings"),
        (_msg(stream=True), 400, "stream"),
        (_msg(model="gpt-9"), 404, "not served"),
    ],
)
def test_bad_requests_get_a_4xx_in_openai_error_shape(server, body, want, fragment):
    assert_error(*post(server.url, body), want, fragment)


@pytest.mark.parametrize(
    ("extra", "want", "fragment"),
    [
        ("Content-Length: abc\r\n", 400, "Content-Length"),
        ("Content-Length: -5\r\n", 400, "Content-Length"),
        ("Transfer-Encoding: chunked\r\n", 411, "chunked"),
    ],
)
def test_bad_framing_gets_a_4xx_and_no_hang(server, extra, want, fragment):
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()
    assert_error(*raw_request(server.url, head + b"0\r\n\r\n", timeout=10), want, fragment)


def test_client_that_stalls_mid_body_is_dropped_and_server_keeps_serving(server):
    host, port = server.url.split("//", 1)[1].split("/", 1)[0].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"mess")
        t0 = time.perf_counter()
        assert s.recv(1) == b""  # closed by the server after io_timeout=1 s, with no answer
        assert time.perf_counter() - t0 < 8
    assert good(server)["choices"][0]["message"]["role"] == "assistant"


def test_prompt_far_beyond_the_context_is_truncated_not_rejected(server, backend):
    out = good(server, messages=[{"role": "user", "content": "word " * 50_000 + "THE END"}], max_tokens=8)
    assert 0 < out["usage"]["prompt_tokens"] <= backend.max_context - 8


def test_thousands_of_turns_are_fitted_quickly(server):
    """Before the fix each dropped turn cost a full re-render: 2000 turns took ~40 s."""
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(6001)]
    t0 = time.perf_counter()
    out = good(server, messages=[{"role": "system", "content": "SYS"}, *turns], max_tokens=4)
    assert out["usage"]["prompt_tokens"] <= 1024 - 4 and time.perf_counter() - t0 < 20


def test_system_prompt_beyond_the_context_is_a_400_context_length_error(server):
    code, body = post(server.url, _msg(messages=[{"role": "system", "content": "s" * 5000},
                                                 {"role": "user", "content": "hi"}]))
    assert_error(code, body, 400, "cannot fit")
    assert body["error"]["type"] == "context_length_exceeded"


def test_text_part_content_is_accepted(server):
    parts = [{"type": "text", "text": "Say "}, {"type": "text", "text": "something."}]
    assert good(server, messages=[{"role": "user", "content": parts}])["choices"]


def test_eight_concurrent_requests_with_one_huge_seed_all_succeed(server, backend):
    """A seed past 64 bits once failed every request batched with it (torch overflow)."""

    async def go():
        async with httpx.AsyncClient(timeout=60) as c:
            bodies = [{"messages": CHAT, "max_tokens": 6, "seed": 2**70 if i == 3 else i} for i in range(8)]
            return await asyncio.gather(*(c.post(f"{server.url}/chat/completions", json=b) for b in bodies))

    before = backend.batch_stats.batches
    answers = run(go())
    assert [r.status_code for r in answers] == [200] * 8
    assert backend.batch_stats.batches - before < 8


@pytest.fixture
def counting_backend(tiny_dir):
    m = TransformersLLM(tiny_dir, max_context=4096)
    m.eos_ids = frozenset()  # generate until max_tokens
    calls = [0]
    m.model.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    return m, calls


def test_client_disconnect_cancels_its_completion_and_server_keeps_serving(counting_backend):
    m, calls = counting_backend
    with ChatServer(m, port=0) as srv:
        host, port = srv.url.split("//", 1)[1].split("/", 1)[0].split(":")
        body = json.dumps({"messages": CHAT, "max_tokens": 2000, "temperature": 1.0}).encode()
        with socket.create_connection((host, int(port))) as s:
            s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            while calls[0] < 5:  # generation has started
                time.sleep(0.02)
        out = good(srv)
        assert out["usage"]["completion_tokens"] == 3
        assert calls[0] < 1500  # the abandoned request stopped early instead of running 2000 steps


def test_cli_server_answers_attacks_then_keeps_serving(tiny_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "crl_agent.serve", "--model", str(tiny_dir), "--port", "0", "--quiet",
         "--num-threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    try:
        line = proc.stdout.readline()
        assert " on http://127.0.0.1:" in line, proc.stderr.read() if proc.poll() is not None else line
        url = line.split(" on ", 1)[1].strip()
        assert_error(*post(url, b"{oops"), 400, "invalid JSON")
        assert_error(*post(url, _msg(temperature=-1)), 400, "temperature")
        assert_error(*post(url, _msg(n=1000)), 400, "n=1")
        assert_error(*post(url, _msg(model="nope")), 404, "not served")
        c = run(OpenAILLM(None, base_url=url).chat(CHAT, SamplingParams(max_tokens=3, seed=0)))
        assert 1 <= len(c.logprobs) <= 3 and proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ======================================================================= 3. transformers backend
@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(max_tokens=-3), "max_tokens"),
        (SamplingParams(temperature=math.nan), "temperature"),
        (SamplingParams(temperature=-1), "temperature"),
        (SamplingParams(top_p=math.nan), "top_p"),
        (SamplingParams(stop=(None,)), "stop"),  # type: ignore[arg-type]
        (SamplingParams(seed=1.5), "seed"),  # type: ignore[arg-type]
    ],
)
def test_bad_sampling_params_fail_alone_not_their_batch(backend, params, fragment):
    async def go():
        return await asyncio.gather(backend.chat(CHAT, params), backend.chat(CHAT, SamplingParams(max_tokens=3)),
                                    return_exceptions=True)

    bad, fine = run(go())
    assert isinstance(bad, ValueError) and fragment in str(bad)
    assert len(fine.token_ids) >= 1


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "non-empty"),
        ("hello", "non-empty"),
        ([{"role": "user", "content": 5}], "messages[0]"),
        ([{"role": "user", "content": None}], "messages[0]"),
        ([{"role": "user", "content": "ok"}, {"role": "user", "content": {"nested": 1}}], "messages[1]"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "messages[0]"),
        (["just a string"], "messages[0]"),
    ],
)
def test_malformed_messages_are_value_errors(backend, messages, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[")):
        run(backend.chat(messages, SamplingParams(max_tokens=2)))


def test_stop_string_in_the_prompt_does_not_end_the_completion(tiny_dir):
    m = TransformersLLM(tiny_dir)
    m.eos_ids = frozenset()
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=4)
    free = run(m.chat(CHAT, p))
    stop = "Say something."  # in the prompt; random noise does not spell it
    assert stop not in free.text
    c = run(m.chat(CHAT, SamplingParams(**{**p.__dict__, "stop": (stop, "Be brief.")})))
    assert c.token_ids == free.token_ids and c.finish_reason == "length"


def test_huge_seed_is_reduced_to_64_bits(backend):
    a = run(backend.chat(CHAT, SamplingParams(max_tokens=5, temperature=1.0, seed=2**64 + 9)))
    b = run(backend.chat(CHAT, SamplingParams(max_tokens=5, temperature=1.0, seed=9)))
    assert a.token_ids == b.token_ids


def test_thousands_of_turns_take_a_few_renders(tiny_dir):
    m = TransformersLLM(tiny_dir, max_context=256)
    renders = [0]
    render = m.render
    m.render = lambda msgs: (renders.__setitem__(0, renders[0] + 1), render(msgs))[1]
    chat = [{"role": "system", "content": "SYS"}]
    chat += [{"role": "user" if i % 2 == 0 else "assistant", "content": f"t{i}"} for i in range(4001)]
    ids = m.fit_prompt(chat, 200)
    text = m.tokenizer.decode(ids)
    assert len(ids) <= 200 and "SYS" in text and "t4000" in text and "t3000" not in text
    assert renders[0] <= 16  # bisection: ~log2(4000) renders, not one per dropped turn
    assert text.split("<|im_start|>")[2].startswith("user")  # the kept history opens with a user turn


def test_cancelled_chat_leaves_its_batch_and_the_next_request_runs(counting_backend):
    m, calls = counting_backend

    async def go():
        task = asyncio.ensure_future(m.chat(CHAT, SamplingParams(max_tokens=2000, temperature=1.0)))
        while calls[0] < 5:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await asyncio.wait_for(m.chat(CHAT, SamplingParams(max_tokens=3, seed=0)), timeout=60)

    nxt = run(go())
    assert len(nxt.token_ids) == 3
    assert calls[0] < 1500  # the cancelled row stopped instead of decoding 2000 tokens first


# ======================================================================= more: client-side checks, 504, methods
def test_openai_backend_rejects_unsendable_requests_before_any_request(hostile):
    srv = hostile(status(200))
    llm = client(srv.url)
    with pytest.raises(ValueError, match="temperature"):
        run(llm.chat(CHAT, SamplingParams(temperature=math.nan)))
    with pytest.raises(ValueError, match="cannot be sent as JSON"):
        run(llm.chat([{"role": "user", "content": {"a", "set"}}]))  # type: ignore[list-item]
    assert srv.requests == []


def test_openai_backend_sends_numpy_numbers_as_json(hostile):
    np = pytest.importorskip("numpy")
    srv = hostile(status(200))
    params = SamplingParams(max_tokens=np.int64(5), temperature=np.float32(0.5), seed=np.int64(7))
    assert run(client(srv.url).chat(CHAT, params)).text == "ok"
    sent = json.loads(srv.requests[0][1])
    assert (sent["max_tokens"], sent["temperature"], sent["seed"]) == (5, 0.5, 7)


def test_completion_past_request_timeout_is_a_504_and_is_cancelled(counting_backend):
    m, calls = counting_backend
    with ChatServer(m, port=0, request_timeout=0.5) as srv:
        code, body = post(srv.url, json.dumps({"messages": CHAT, "max_tokens": 2000}).encode())
        assert_error(code, body, 504, "longer than 0.5s")
        assert body["error"]["type"] == "timeout"
        assert good(srv)["usage"]["completion_tokens"] == 3
        assert calls[0] < 1500


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_get_a_405_in_openai_error_shape(server, method):
    head = f"{method} /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}".encode()
    assert_error(*raw_request(server.url, head), 405, method)


def test_lone_surrogates_in_content_are_replaced_not_a_500(server, backend):
    """Tokenizers cannot encode them: before the fix the server answered 500 with a cryptic TypeError."""
    code, body = post(server.url, b'{"messages": [{"role": "user", "content": "bad \\ud800 text"}], "max_tokens": 2}')
    assert code == 200, body
    c = run(backend.chat([{"role": "user", "content": "bad \udfff text"}], SamplingParams(max_tokens=2)))
    assert "bad \ufffd text" in backend.tokenizer.decode(c.prompt_token_ids)


def test_api_key_with_a_trailing_newline_is_stripped_and_sent(hostile, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET + "\n")
    srv = hostile(status(200))
    assert run(client(srv.url).chat(CHAT)).text == "ok"
    assert f"Authorization: Bearer {SECRET}\r\n" in srv.requests[0][0]


@pytest.mark.parametrize("key", ["sk-caf\u00e9-123", "sk-a\tb", "sk-a\nb"])
def test_api_key_no_header_can_carry_is_a_clear_error_that_hides_it(monkeypatch, key):
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(ValueError, match=r"\$OPENAI_API_KEY holds non-ASCII or control characters") as info:
        OpenAILLM("m")
    assert key not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"base_url": "localhost:8000/v1"}, "http://"),
        ({"max_concurrency": 0}, "max_concurrency"),  # a zero semaphore would hang every request
        ({"timeout": 0}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
    ],
)
def test_bad_openai_settings_fail_at_construction(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        OpenAILLM("m", **kwargs)
