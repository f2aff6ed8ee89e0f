"""A small OpenAI-compatible server for any crl-bench LLM backend.

Usage::

    python -m crl_agent.serve --backend transformers --port 8000            # packaged SmolLM2
    python -m crl_agent.serve --backend transformers --model /models/qwen --port 8000
    python -m eval.run --agent llm --backend openai --model smollm2-135m ...  # elsewhere

Endpoints: ``GET /v1/models``, ``GET /health`` and ``POST /v1/chat/completions`` with
``messages``, ``max_tokens`` (or ``max_completion_tokens``), ``temperature``, ``top_p``,
``stop``, ``seed``, ``logprobs`` (the sampled token's log-prob; ``top_logprobs`` lists stay
empty) and vLLM's ``return_token_ids``. No streaming and ``n`` must be 1.
``POST /v1/completions`` takes raw prompts (text or token ids) with ``echo`` and ``logprobs``, which
is how the ``openai`` backend scores candidates (:mod:`crl_agent.serve_completions`).

It is built on the standard library (``http.server.ThreadingHTTPServer``) rather than a web
framework: it needs no extra dependency, and one thread per connection handing requests to a
single asyncio loop is all a backend needs, since the backend itself batches concurrent requests.
With ``--port 0`` it picks a free port; the first stdout line says where it listens.

Every bad request gets a 4xx answer in OpenAI's error shape (``{"error": {"message", "type",
"code"}}``) and the server keeps serving: invalid JSON or UTF-8, a body that is not an object,
missing or malformed ``messages``, sampling fields of the wrong type or range, an unknown model
(404), a body over 32 MiB (413), a chunked body (411), a system prompt too long for the context
(400, ``context_length_exceeded``; longer chats lose their oldest turns instead). A client that
stalls mid-request is dropped after ``--io-timeout`` seconds; a client that disconnects while its
completion runs has the completion cancelled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from crl_agent.llm import BACKENDS, LLM, ContextLengthError, LLMError, make_llm
from crl_agent.serve_completions import completions_response
from crl_agent.serve_requests import HTTPError, sampling_params_from_request

log = logging.getLogger("crl_agent.serve")
MAX_BODY_BYTES = 32 * 2**20


class ClientGone(Exception):
    """The client closed its connection before its completion was ready."""


class ChatServer:
    """Serve one :class:`LLM` over HTTP in background threads.

    Args:
        llm: the backend.
        host: interface to bind (loopback by default).
        port: TCP port; 0 picks a free one (see :attr:`url`).
        model_name: the name ``/v1/models`` reports (default: the backend's ``config()["model"]``).
        api_key_env: when set, requests must carry ``Authorization: Bearer $<api_key_env>``.
        request_timeout: seconds one completion may take before the server answers 504.
        io_timeout: seconds a connection may stall while sending its request (or idle between
            requests) before the server drops it.
    """

    def __init__(
        self,
        llm: LLM,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str | None = None,
        api_key_env: str | None = None,
        request_timeout: float = 600.0,
        io_timeout: float = 60.0,
    ):
        self.llm = llm
        self.model_name = model_name or str(llm.config().get("model") or llm.name)
        key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not key:
            raise ValueError(f"--api-key-env {api_key_env} is set but ${api_key_env} is empty")
        self._api_key = key
        self.request_timeout = request_timeout
        self.io_timeout = io_timeout
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="serve-loop", daemon=True)
        self.httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self.httpd.daemon_threads = True
        self._http_thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> ChatServer:
        """Serve in background threads; returns at once."""
        self._loop_thread.start()
        self._http_thread = threading.Thread(target=self.httpd.serve_forever, name="serve-http", daemon=True)
        self._http_thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the backend."""
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._loop_thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.llm.aclose(), self.loop).result(timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._loop_thread.join(timeout=30)

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- handling
    def complete(self, body: dict[str, Any], client_gone: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Answer one chat-completions request body (runs in a connection thread).

        Args:
            body: the parsed JSON request.
            client_gone: polled while the completion runs; when it returns True the completion is
                cancelled and :class:`ClientGone` raised.
        """
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPError(400, "messages must be a non-empty list")
        if body.get("model") not in (None, "", self.model_name):
            raise HTTPError(404, f"model {body['model']!r} is not served here; this server serves {self.model_name!r}",
                            "model_not_found")
        params = sampling_params_from_request(body)
        c = self.wait(self.llm.chat(messages, params), client_gone)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": c.text},
            "finish_reason": c.finish_reason,
            "logprobs": None,
        }
        if body.get("logprobs") and c.logprobs:
            pieces = getattr(self.llm, "token_strings", None)
            tokens = pieces(c.token_ids) if pieces and c.token_ids else [f"token_id:{t}" for t in c.token_ids]
            choice["logprobs"] = {
                "content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                    for t, lp in zip(tokens, c.logprobs, strict=False)
                ]
            }
        out: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens,
                "total_tokens": c.prompt_tokens + c.completion_tokens,
            },
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = list(c.token_ids)
            out["prompt_token_ids"] = list(c.prompt_token_ids or [])
        return out

    def wait(self, coro: Any, client_gone: Callable[[], bool] | None = None) -> Any:
        """Run ``coro`` on the server's loop and wait for it (runs in a connection thread).

        Backend errors become :class:`HTTPError` (``ValueError`` 400, ``ContextLengthError`` 400
        ``context_length_exceeded``, other ``LLMError`` 500); past ``request_timeout`` the work is
        cancelled and a 504 raised; when ``client_gone()`` turns True it is cancelled and
        :class:`ClientGone` raised.
        """
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        deadline = time.monotonic() + self.request_timeout
        while True:
            try:
                return fut.result(timeout=max(0.0, min(0.25, deadline - time.monotonic())))
            except FutureTimeout as e:
                if time.monotonic() >= deadline:
                    fut.cancel()
                    raise HTTPError(504, f"completion took longer than {self.request_timeout:g}s", "timeout") from e
                if client_gone is not None and client_gone():
                    fut.cancel()
                    raise ClientGone() from e
            except ContextLengthError as e:
                raise HTTPError(400, str(e), "context_length_exceeded") from e
            except ValueError as e:
                raise HTTPError(400, str(e)) from e
            except LLMError as e:
                raise HTTPError(500, str(e), "server_error") from e

    def text_complete(self, body: dict[str, Any], client_gone: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Answer one ``/v1/completions`` request body (see :mod:`crl_agent.serve_completions`)."""
        if body.get("model") not in (None, "", self.model_name):
            raise HTTPError(404, f"model {body['model']!r} is not served here; this server serves {self.model_name!r}",
                            "model_not_found")
        if not all(hasattr(self.llm, m) for m in ("encode", "score_ids", "complete_ids")):
            raise HTTPError(501, f"the {self.llm.name} backend serves /v1/chat/completions only (raw prompts and echoed "
                                 "log-probs need token-level calls it does not have); for vLLM, run vLLM's own server "
                                 "(python -m vllm.entrypoints.openai.api_server)", "not_implemented")
        return completions_response(self, body, client_gone)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = server.io_timeout  # a stalled or idle connection is dropped, never holds a thread forever

            def log_message(self, fmt: str, *args: Any) -> None:  # request line only, never headers
                log.info("%s %s", self.address_string(), fmt % args)

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if self.close_connection:
                        self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client left; nothing to tell it
                    self.close_connection = True

            def _client_gone(self) -> bool:
                """True when the client closed its side (EOF or reset) while we compute."""
                try:
                    readable, _, _ = select.select([self.connection], [], [], 0)
                    return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
                except (OSError, ValueError):
                    return True

            def _error(self, e: HTTPError) -> None:
                self._send(e.status, {"error": {"message": e.message, "type": e.kind, "code": e.status}})

            def _authorised(self) -> bool:
                if server._api_key is None:
                    return True
                if self.headers.get("Authorization", "") == f"Bearer {server._api_key}":
                    return True
                self._error(HTTPError(401, "missing or wrong API key", "authentication_error"))
                return False

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/health":
                    self._send(200, {"status": "ok"})
                elif path == "/v1/models":
                    if self._authorised():
                        self._send(200, {"object": "list", "data": [
                            {"id": server.model_name, "object": "model", "created": 0, "owned_by": "crl-bench"}]})
                else:
                    self._error(HTTPError(404, f"no route {self.path}", "not_found"))

            def _not_allowed(self) -> None:
                self.close_connection = True  # any body it sent is unread
                self._error(HTTPError(405, f"method {self.command} is not allowed; use GET or POST", "not_allowed"))

            do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed  # noqa: N815

            def _read_body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    raise HTTPError(411, "chunked request bodies are not supported; send Content-Length")
                declared = (self.headers.get("Content-Length") or "0").strip()
                if not declared.isdigit():
                    raise HTTPError(400, f"bad Content-Length header {declared[:40]!r}")
                length = int(declared)
                if length > MAX_BODY_BYTES:
                    raise HTTPError(413, f"request body over {MAX_BODY_BYTES} bytes")
                raw = self.rfile.read(length) if length else b""
                if len(raw) < length:
                    raise HTTPError(400, f"request body ended after {len(raw)} of {length} bytes")
                return raw

            def do_POST(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0].rstrip("/")
                try:
                    raw = self._read_body()
                except HTTPError as e:  # the body was not read in full: the connection cannot be reused
                    self.close_connection = True
                    self._error(e)
                    return
                except OSError:  # the client stalled past io_timeout or left mid-body
                    self.close_connection = True
                    return
                routes = {"/v1/chat/completions": server.complete, "/v1/completions": server.text_complete}
                if path not in routes:
                    self._error(HTTPError(404, f"no route {self.path}; use /v1/chat/completions or /v1/completions",
                                          "not_found"))
                    return
                if not self._authorised():
                    return
                try:
                    try:
                        body = json.loads(raw or b"null")
                    except (ValueError, RecursionError) as e:  # JSON, UTF-8 or nesting-depth errors
                        raise HTTPError(400, f"invalid JSON body: {str(e)[:200]}") from e
                    if not isinstance(body, dict):
                        raise HTTPError(400, "the request body must be a JSON object")
                    self._send(200, routes[path](body, self._client_gone))
                except ClientGone:
                    log.info("%s left before its completion was ready; cancelled it", self.address_string())
                    self.close_connection = True
                except HTTPError as e:
                    self._error(e)
                except Exception as e:  # noqa: BLE001 - answer 500 rather than drop the connection
                    log.exception("chat completion failed")
                    self._error(HTTPError(500, f"{type(e).__name__}: {e}", "server_error"))

        return Handler


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m crl_agent.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=sorted(BACKENDS), default="transformers")
    p.add_argument("--model", default=None, help="model directory (default: the packaged SmolLM2-135M)")
    p.add_argument("--served-model-name", default=None, help="name reported by /v1/models")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--api-key-env", default=None, help="require Authorization: Bearer $VAR")
    p.add_argument("--device", default=None, help="transformers: cpu, cuda or auto")
    p.add_argument("--max-batch-size", type=int, default=None)
    p.add_argument("--num-threads", type=int, default=None, help="transformers: torch CPU threads")
    p.add_argument("--io-timeout", type=float, default=60.0, help="drop a connection stalled this many seconds")
    p.add_argument("--request-timeout", type=float, default=600.0, help="answer 504 after this many seconds")
    p.add_argument("--quiet", action="store_true", help="no access log")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(asctime)s %(message)s")
    kwargs: dict[str, Any] = {}
    if args.backend == "transformers":
        kwargs.update({k: v for k, v in {"device": args.device, "max_batch_size": args.max_batch_size,
                                          "num_threads": args.num_threads}.items() if v is not None})
    elif args.backend == "vllm" and args.max_batch_size:
        kwargs["max_batch_size"] = args.max_batch_size
    llm = make_llm(args.backend, args.model, **kwargs)
    server = ChatServer(llm, args.host, args.port, args.served_model_name, args.api_key_env,
                        request_timeout=args.request_timeout, io_timeout=args.io_timeout).start()
    print(f"serving {server.model_name} on {server.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
