"""Serve any registered text env over OpenEnv's protocol: ``python -m crl_envs.serve ENV_ID``.

Usage::

    python -m crl_envs.serve crl/Sokoban-6x6-2-v0 --port 8000 --max-concurrent 8

The server is OpenEnv's own (``openenv-core``: FastAPI and uvicorn), with these routes:

* ``GET /health``, ``/schema`` (the action ``{"message": str}``; the observation: ``text``, ``task``,
  ``admissible_actions``, the whole ``info``, ``terminated``, ``truncated``, ``reward``, ``done``; the
  state: ``episode_id``, ``step_count``, ``env_id``, ``seed``, ``done``), ``/metadata`` and ``/state``
  (a fresh env's state, with the same keys as a session's);
* ``POST /reset`` (``{"seed": 3}``) and ``/step``: OpenEnv builds a fresh env for every plain HTTP
  request, so ``/reset`` shows a seed's first observation and ``/step`` (no episode to step) answers 409;
* ``WebSocket /ws``: one session per connection, with ``reset`` (``data``: ``seed``, ``options``,
  ``episode_id``), ``step`` (``data``: ``{"message": action}``), ``state`` and ``close`` messages.

Each session owns one env in a one-slot pool of ours (:func:`crl_envs.pool.make_pool`; by default a
worker process, so an env that crashes, hangs past ``--step-timeout`` or is killed ends only its own
session: the client gets the error, starting ``session ended:``, and the connection is closed). A
session that sends nothing for ``--session-timeout`` seconds is closed and its env released. Bad
JSON (``INVALID_JSON``), unknown message types (``UNKNOWN_TYPE``), and frames that are not a JSON
object, oversized actions, bad seeds and unknown reset keys (``VALIDATION_ERROR``, as OpenEnv answers
bad input) get error replies and the session goes on; connections beyond ``--max-concurrent`` are
refused with ``CAPACITY_REACHED``. A step after the episode ended reaches the env (ours answer it as
an invalid move) but its reply keeps ``done`` true, with ``terminated``/``truncated`` as the episode
ended, and the session's ``state.done`` stays true until the next ``reset``.
``crl/Remote-v0`` (:class:`crl_envs.remote.RemoteEnv`) is the Gymnasium client.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import functools
import inspect
import json
import socket
import sys
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from crl_envs.pool import EnvError, make_pool
from crl_envs.registry import check_env_id, env_class
from crl_envs.remote import MAX_FRAME_BYTES, SESSION_ENDED, jsonable

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
    from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata, SchemaResponse, WSErrorCode
    from pydantic import Field, create_model
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise gym.error.DependencyNotInstalled('serving envs needs openenv-core: pip install -e ".[openenv]"') from e

LOST_CAUSES = ("crash", "timeout", "memory", "closed")  # the episode's env is gone: the session ends


ACTION_HELP = "the action, e.g. 'go north' or 'click[Buy Now]'"


class TextAction(Action):
    """One action of a text env: the text an agent sends."""

    message: str = Field(description=ACTION_HELP)


class TextObservation(Observation):
    """What a text env returns from ``reset`` and ``step`` (``done`` is ``terminated or truncated``)."""

    text: str = Field(description="the observation text")
    task: str | None = Field(default=None, description="the goal (info['task'])")
    admissible_actions: list[str] | None = Field(
        default=None, description="the valid actions now, or null where the env cannot list them")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's whole info dict, as JSON")
    terminated: bool = Field(default=False, description="the episode ended (won or lost)")
    truncated: bool = Field(default=False, description="the episode hit its step limit")


class TextEnvState(State):
    """A session's state: OpenEnv's ``episode_id`` and ``step_count``, plus the env and its seed."""

    env_id: str = ""
    seed: int | None = None
    done: bool = False


# The messages of the RequestErrors raised in this /ws session and not yet answered; SessionGuard sets it per
# connection, so their replies carry OpenEnv's VALIDATION_ERROR instead of the EXECUTION_ERROR its loop gives
# every exception an env method raises.
_RAISED_REQUEST_ERRORS: ContextVar[list[str] | None] = ContextVar("raised_request_errors", default=None)


class RequestError(ValueError):
    """A request the served env cannot take (answered with 400 over HTTP, ``VALIDATION_ERROR`` over /ws)."""

    def __init__(self, message: str):
        super().__init__(message)
        raised = _RAISED_REQUEST_ERRORS.get()
        if raised is not None:
            raised.append(message)


class NoEpisodeError(RuntimeError):
    """A step with no episode to step (answered with 409 over HTTP)."""


@dataclass(frozen=True)
class ServeConfig:
    """How a server makes and runs its envs.

    Attributes:
        env_id: the registered id every session plays.
        env_kwargs: extra ``gymnasium.make`` kwargs.
        backend: the pool backend of each session's env: ``"process"`` (a worker process, the default:
            a crash ends only its session) or ``"inline"`` (this process: lighter, no isolation).
        step_timeout: seconds a step may run before the session's env counts as hung (kept above what
            the env declares one step may take, e.g. SWE grading).
        reset_timeout: the same for making the env and ``reset``.
        max_action_chars: the longest action accepted; longer ones are refused without reaching the env.
    """

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    backend: str = "process"
    step_timeout: float = 60.0
    reset_timeout: float = 300.0
    max_action_chars: int = 2**20

    def metadata(self) -> EnvironmentMetadata:
        from crl_envs import __version__

        doc = inspect.getdoc(env_class(self.env_id)) or ""
        summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
        return EnvironmentMetadata(name=self.env_id, version=__version__,
                                   description=summary or f"{self.env_id}, a text env served by crl-bench")


class PooledEnvironment(Environment):
    """One session's env, in a one-slot pool of its own, behind OpenEnv's ``Environment`` interface.

    OpenEnv calls the async methods on the server's event loop and builds one instance per
    WebSocket session (and per plain HTTP request). The pool starts at the first ``reset``.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session owns its env and its pool

    def __init__(self, config: ServeConfig):
        super().__init__()
        self.config = config
        self.pool: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = TextEnvState(env_id=config.env_id)
        self._ended_as = (False, False)  # (terminated, truncated) of the step that ended the episode
        self._ended: str | None = None

    # OpenEnv calls reset_async/step_async where they are overridden; these sync forms are its abstract API.
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        raise NotImplementedError("PooledEnvironment is served asynchronously: call reset_async")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        raise NotImplementedError("PooledEnvironment is served asynchronously: call step_async")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          options: dict[str, Any] | None = None, **unknown: Any) -> TextObservation:
        self._check_open()
        if unknown:
            raise RequestError(f"reset takes seed, options and episode_id; got {', '.join(sorted(unknown))}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise RequestError(f"seed must be a non-negative integer or null, got {seed!r}")
        if options is not None and not isinstance(options, dict):
            raise RequestError(f"options must be an object or null, got {type(options).__name__}")
        if episode_id is not None and not isinstance(episode_id, str):
            raise RequestError(f"episode_id must be a string, got {type(episode_id).__name__}")
        pool = await self._start_pool()
        try:
            obs, info = await pool.reset(0, seed=seed, options=options)
        except EnvError as e:
            raise self._failed(e) from None
        self._state = TextEnvState(env_id=self.config.env_id, seed=seed, episode_id=episode_id or uuid.uuid4().hex)
        self._ended_as = (False, False)
        return self._observation(obs, info, None, terminated=False, truncated=False)

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        self._check_open()
        text = getattr(action, "message", None)
        if not isinstance(text, str):
            raise RequestError("a step's data is {\"message\": \"<action text>\"}")
        if len(text) > self.config.max_action_chars:
            raise RequestError(f"the action has {len(text):,} characters; this server takes at most "
                               f"{self.config.max_action_chars:,} (--max-action-chars), so it was not sent to the env")
        if self.pool is None or self._state.episode_id is None:
            raise NoEpisodeError("no episode to step: send reset first (over HTTP, OpenEnv builds a fresh env for "
                                 "every request: play episodes over the /ws session)")
        try:
            obs, reward, terminated, truncated, info = await self.pool.step(0, text)
        except EnvError as e:
            raise self._failed(e) from None
        self._state.step_count += 1
        if self._state.done:  # stepped after the end: it stays over as it ended, whatever the env says
            terminated, truncated = terminated or self._ended_as[0], truncated or self._ended_as[1]
        elif terminated or truncated:
            self._state.done, self._ended_as = True, (terminated, truncated)
        return self._observation(obs, info, reward, terminated=terminated, truncated=truncated)

    @property
    def state(self) -> TextEnvState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return self.config.metadata()

    # ------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._ended is not None:
            raise RuntimeError(f"{SESSION_ENDED}{self._ended}")

    async def _start_pool(self) -> Any:
        if self.pool is None:
            self._loop = asyncio.get_running_loop()
            c = self.config
            self.pool = make_pool([(c.env_id, c.env_kwargs)], c.backend, num_workers=1, timeout=c.step_timeout,
                                  reset_timeout=c.reset_timeout)
            try:
                await self.pool.start()
            except EnvError as e:  # its constructor raised
                raise self._failed(e) from None
        return self.pool

    def _failed(self, e: EnvError) -> Exception:
        """The error a failed env call answers; a lost env (crash, hang, memory) ends the session."""
        if e.cause not in LOST_CAUSES:
            return RuntimeError(str(e))
        self._ended = f"{e}; open a new session to play on"
        self.close()
        return RuntimeError(f"{SESSION_ENDED}{self._ended}")

    def _observation(self, obs: str, info: dict[str, Any], reward: float | None, *, terminated: bool,
                     truncated: bool) -> TextObservation:
        info = jsonable(info)
        task = info.get("task")
        return TextObservation(text=obs, task=task if isinstance(task, str) else None,
                               admissible_actions=info.get("admissible_actions"), info=info,
                               terminated=terminated, truncated=truncated, done=terminated or truncated,
                               reward=reward)

    def close(self) -> None:
        """Release the session's env; OpenEnv calls it from a worker thread, the pool lives on the loop."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or loop.is_closed():
            pool.close()
            return

        async def close_on_loop() -> None:
            pool.close()

        asyncio.run_coroutine_threadsafe(close_on_loop(), loop).result(timeout=60)


class SessionGuard:
    """ASGI middleware for the ``/ws`` sessions, adding what OpenEnv's loop lacks.

    * a session silent for ``idle_timeout`` seconds gets a ``SESSION_TIMEOUT`` error and is closed
      (OpenEnv's own reaper frees the env but leaves the connection open);
    * a session whose env was lost (an error starting ``session ended:``) is closed after that error;
    * binary frames are read as UTF-8 text (OpenEnv reads text frames only);
    * a frame that is JSON but not an object (``[1, 2]``, ``"hi"``, ``null``) gets a ``VALIDATION_ERROR``
      and the session goes on (OpenEnv's loop would end the session on it);
    * the requests our env refuses (:class:`RequestError`) are answered with ``VALIDATION_ERROR``.

    Closing works by telling OpenEnv's loop the client left: it then frees the session's env and
    closes the connection itself, with the reason this middleware records.
    """

    def __init__(self, app: Any, idle_timeout: float | None):
        self.app, self.idle_timeout = app, idle_timeout

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket" or scope.get("path") != "/ws":
            await self.app(scope, receive, send)
            return
        ended: list[str] = []
        raised: list[str] = []
        _RAISED_REQUEST_ERRORS.set(raised)  # this task's context: OpenEnv's loop runs the env in it

        async def error(message: str, code: str) -> None:
            await send({"type": "websocket.send", "text": json.dumps({"type": "error", "data": {
                "message": message, "code": code}})})

        async def guarded_receive() -> dict:
            while not ended:
                try:
                    message = await asyncio.wait_for(receive(), self.idle_timeout)
                except asyncio.TimeoutError:
                    why = (f"{SESSION_ENDED}no message for {self.idle_timeout:g} s (--session-timeout); "
                           "its env was released: open a new session")
                    ended.append("idle timeout")
                    await error(why, "SESSION_TIMEOUT")
                    break
                if message["type"] == "websocket.receive" and message.get("text") is None:
                    try:
                        message = {"type": "websocket.receive", "text": (message.get("bytes") or b"").decode()}
                    except UnicodeDecodeError:
                        await error("a binary frame that is not UTF-8 text; send JSON messages", "INVALID_JSON")
                        continue
                problem = not_an_object(message.get("text"))
                if problem is not None:
                    await error(problem, WSErrorCode.VALIDATION_ERROR.value)
                    continue
                return message
            return {"type": "websocket.disconnect", "code": 1000}

        async def guarded_send(message: dict) -> None:
            text = message.get("text") if message["type"] == "websocket.send" else None
            if text and text.startswith('{"type":"error"'):
                if SESSION_ENDED in text:
                    ended.append("the session's env was lost")
                if raised:
                    message = {**message, "text": validation_error(text, raised)}
            if message["type"] == "websocket.close":
                if ended:
                    message = {**message, "code": 1000, "reason": ended[0]}
                try:
                    await send(message)
                except OSError:  # the client closed first (uvicorn's ClientDisconnected): nothing left to close
                    pass
                return
            await send(message)

        await self.app(scope, guarded_receive, guarded_send)


def not_an_object(text: str | None) -> str | None:
    """Why a frame that parses as JSON is no message (not an object); None for an object or for text that is not
    JSON at all (OpenEnv answers that with ``INVALID_JSON``)."""
    if text is None or text.lstrip().startswith("{"):  # an object, or broken JSON: OpenEnv's own reply
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    kind = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "null")
    return ('a message is a JSON object such as {"type": "step", "data": {"message": "up"}}; got ' + kind +
            "; the session goes on")


def validation_error(text: str, raised: list[str]) -> str:
    """An error reply with ``VALIDATION_ERROR`` for its code where it answers a :class:`RequestError` in ``raised``
    (which it empties: OpenEnv answers each request before it reads the next)."""
    reply = json.loads(text)
    data = reply.get("data") or {}
    if data.get("code") == WSErrorCode.EXECUTION_ERROR.value and data.get("message") in raised:
        data["code"] = WSErrorCode.VALIDATION_ERROR.value
        text = json.dumps(reply)
    raised.clear()
    return text


def create_app(config: ServeConfig, *, max_concurrent: int = 8, session_timeout: float | None = 300.0) -> Any:
    """The ASGI app serving ``config.env_id``: OpenEnv's FastAPI app behind :class:`SessionGuard`.

    Raises:
        gymnasium.error.NameNotFound, gymnasium.error.DependencyNotInstalled: for an unknown id or a
            family whose backend is not installed.
    """
    check_env_id(config.env_id)
    if config.backend not in ("process", "inline", "ray"):
        raise ValueError(f"unknown backend {config.backend!r}; use process, inline or ray")
    # /schema states this server's action limit (RemoteEnv sizes its action space by it); the limit itself is
    # checked in step_async, so a refused action is never echoed back in a validation error
    action_cls = create_model("TextAction", __base__=TextAction, message=(str, Field(
        description=ACTION_HELP, json_schema_extra={"maxLength": config.max_action_chars})))
    app: FastAPI = create_fastapi_app(
        functools.partial(PooledEnvironment, config), action_cls, TextObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_concurrent))
    app.title = f"{config.env_id} (crl-bench, OpenEnv protocol)"
    # OpenEnv's GET /state and /schema use its base State model, which drops env_id, seed and done: state them
    for route in [r for r in app.router.routes if getattr(r, "path", None) in ("/state", "/schema")]:
        app.router.routes.remove(route)

    @app.get("/state", response_model=TextEnvState, tags=["State Management"],
             summary="A fresh env's state (a /ws session's has the same keys)")
    async def http_state() -> TextEnvState:
        return PooledEnvironment(config).state

    @app.get("/schema", response_model=SchemaResponse, tags=["Schema"], summary="JSON schemas of action, observation "
             "and state")
    async def schema() -> SchemaResponse:
        return SchemaResponse(action=action_cls.model_json_schema(), observation=TextObservation.model_json_schema(),
                              state=TextEnvState.model_json_schema())

    @app.exception_handler(RequestError)
    async def bad_request(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(exc)})

    @app.exception_handler(NoEpisodeError)
    async def no_episode(_: Request, exc: NoEpisodeError) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    return SessionGuard(app, session_timeout)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m crl_envs.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("env_id", help="a registered env id (ours or a plugin's), e.g. crl/Sokoban-6x6-2-v0")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--max-concurrent", type=int, default=8, help="sessions (envs) at once (default: 8)")
    p.add_argument("--backend", choices=("process", "inline"), default="process",
                   help="where each session's env runs: its own worker process (default) or this process")
    p.add_argument("--session-timeout", type=float, default=300.0,
                   help="close a session that sends nothing for this many seconds (default: 300)")
    p.add_argument("--step-timeout", type=float, default=60.0,
                   help="seconds before a hung step ends its session (default: 60; longer where the env declares it)")
    p.add_argument("--max-action-chars", type=int, default=2**20,
                   help="refuse longer actions (default: 1048576)")
    return p


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (as uvicorn binds one), or :class:`OSError` naming the address."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror} (--host)") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: rebind over TIME_WAIT, never a listener
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        hint = " (another server holds it: stop that one or pick another --port)" if e.errno == errno.EADDRINUSE else ""
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror}{hint}") from None
    return sock


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        """uvicorn's server, saying where it serves once it accepts connections (not before)."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(f"serving {args.env_id} at {url} (OpenEnv protocol; sessions at {url.replace('http', 'ws', 1)}/ws; "
                      f"play it with gym.make('crl/Remote-v0', url='{url}'))", flush=True)

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_concurrent < 1:
        parser.error("--max-concurrent must be at least 1")
    if args.session_timeout <= 0 or args.step_timeout <= 0 or args.max_action_chars < 1:
        parser.error("--session-timeout, --step-timeout and --max-action-chars must be positive")
    try:
        config = ServeConfig(args.env_id, backend=args.backend,
                             step_timeout=args.step_timeout, max_action_chars=args.max_action_chars)
        app = create_app(config, max_concurrent=args.max_concurrent, session_timeout=args.session_timeout)
    except (ValueError, gym.error.Error) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    try:
        sock = listen(args.host, args.port)
    except OSError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 1
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{sock.getsockname()[1]}"
    server = AnnouncingServer(uvicorn.Config(app, ws_max_size=MAX_FRAME_BYTES, log_level="warning"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
