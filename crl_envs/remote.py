"""``RemoteEnv`` (``crl/Remote-v0``): a text env served by ``python -m crl_envs.serve``, played over the network.

It speaks OpenEnv's WebSocket protocol (``/ws``: ``reset``/``step``/``state``/``close`` messages,
one env per connection) and is an ordinary ``gymnasium.Env[str, str]``, so ``eval.run``, the
trainer and the pools play a remote env like a local one::

    env = gym.make("crl/Remote-v0", url="http://127.0.0.1:8000")   # or set $CRL_REMOTE_URL
    obs, info = env.reset(seed=3)        # the server's env, reset with seed 3
    obs, reward, terminated, truncated, info = env.step("up")

Observations, rewards, ``terminated``/``truncated`` and ``info`` are the served env's own (``info``
as JSON: tuples become lists, numpy numbers Python numbers; :func:`jsonable`). Invalid moves stay
invalid moves. A failure of the server's env, a lost connection or a server error raises
:class:`RemoteEnvError`, whose ``code`` says which (the server's code, ``TIMEOUT``, ``CONNECTION_LOST`` or
``UNREACHABLE``) and whose ``session_ended`` says the episode was cut short: the session is then closed
and the next ``reset`` opens a new one.

Sessions are released by ``close()``, and whatever is still open when Python exits is closed by an
``atexit`` hook (each with a short deadline), so a program that never closes its envs still exits.

It uses the ``websockets`` client directly rather than OpenEnv's ``EnvClient``: that client's
timeout leaves the connection open, so a late reply would be read as the answer to the next
request; here a timeout closes the session.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import gymnasium as gym
import numpy as np

from crl_envs.spaces import UnicodeText

URL_VARIABLE = "CRL_REMOTE_URL"
# An error whose message starts with this ended the session on the server: it closes the connection.
SESSION_ENDED = "session ended: "
# Error codes after which the server closes the connection (OpenEnv's, plus our idle timeout).
CLOSING_CODES = ("CAPACITY_REACHED", "FACTORY_ERROR", "SESSION_ERROR", "SESSION_TIMEOUT")
MAX_FRAME_BYTES = 16 * 2**20  # the largest WebSocket message either side reads (uvicorn's default)
DEFAULT_TIMEOUT_S = 1200.0  # above the longest step a served env declares (SWE grading: 1050 s)
CLOSE_TIMEOUT_S = 2.0  # the closing handshake's wait (websockets' close_timeout)
EXIT_CLOSE_BUDGET_S = 3.0  # all sessions still open at interpreter exit are closed within this


class RemoteEnvError(RuntimeError):
    """The served env failed, the server refused a request, or the connection was lost.

    Attributes:
        code: the server's error code (``CAPACITY_REACHED``, ``SESSION_TIMEOUT``, ``EXECUTION_ERROR``...), or
            ``TIMEOUT`` (no reply in time), ``CONNECTION_LOST`` (the server closed or restarted) or
            ``UNREACHABLE`` (no session could be opened).
        session_ended: True where the session is gone (its episode, if one was running, was cut short);
            False for an error reply after which the session and its episode go on.
    """

    def __init__(self, message: str, *, code: str = "ERROR", session_ended: bool = True):
        super().__init__(message)
        self.code = code
        self.session_ended = session_ended


# Every RemoteEnv holding a connection: the atexit hook closes them while the connections' reader threads still
# run (a close from __del__ at interpreter teardown joins a daemon thread that has been frozen: it never returns).
_OPEN: weakref.WeakSet[RemoteEnv] = weakref.WeakSet()
_OPEN_LOCK = threading.Lock()


@atexit.register
def close_open_sessions(budget_s: float = EXIT_CLOSE_BUDGET_S) -> int:
    """Close every ``RemoteEnv`` session still open, within about ``budget_s`` seconds in all (the server
    releases a session whose connection drops, so the last ones are just dropped). Returns how many.

    Registered with ``atexit``: a program that exits without closing its envs releases their sessions and
    exits at once.
    """
    with _OPEN_LOCK:
        envs = list(_OPEN)
    deadline = time.monotonic() + budget_s
    for env in envs:
        left = deadline - time.monotonic()
        env._drop(say_goodbye=True, timeout=min(CLOSE_TIMEOUT_S, left) if left > 0.05 else None)
    return len(envs)


def jsonable(obj: Any) -> Any:
    """``obj`` as it reads back from JSON (what a remote env's ``info`` holds): numpy numbers and arrays
    become Python numbers and lists, tuples lists, sets sorted lists, other objects their ``str``."""
    return json.loads(json.dumps(obj, default=_json_default, allow_nan=True))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    return str(obj)


def _base_urls(url: str) -> tuple[str, str]:
    """``(http base, ws url)`` of a server given as ``http(s)://`` or ``ws(s)://`` host[:port][/prefix]."""
    parts = urlsplit(url.rstrip("/"))
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
        raise ValueError(f"{url!r} is not a server address; give http://HOST:PORT (what python -m crl_envs.serve "
                         "prints)")
    path = parts.path.removesuffix("/ws")
    secure = parts.scheme in ("https", "wss")
    http = urlunsplit(("https" if secure else "http", parts.netloc, path, "", ""))
    return http, urlunsplit(("wss" if secure else "ws", parts.netloc, path + "/ws", "", ""))


class RemoteEnv(gym.Env[str, str]):
    """A text env served over OpenEnv's protocol by ``python -m crl_envs.serve``.

    Description:
        Plays the env a server hosts: each ``RemoteEnv`` holds one WebSocket session, and so one env
        on the server, opened at the first ``reset``. The same seeds give the same episodes as the
        served env played locally.

    Action Space:
        ``UnicodeText(n)``, ``n`` the longest action the server accepts (its ``/schema``); longer
        actions, and non-``str`` ones, are invalid moves answered here without a request.

    Observation Space:
        ``UnicodeText(16 MiB)``: any text the protocol carries.

    Starting State, Rewards, Episode End, Information:
        Those of the served env (``info`` as JSON).

    Arguments:
        url: the server, ``http://HOST:PORT`` (default: ``$CRL_REMOTE_URL``).
        timeout: seconds to wait for each reply; it is also the env's ``step_time_limit_s``, so a
            pool around it never takes a long remote step (an SWE grade) for a hung one.
        connect_timeout: seconds to wait for the server to accept a connection.
        render_mode: ``"ansi"`` renders the last observation.

    Version History:
        * v0: first version.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, url: str | None = None, timeout: float = DEFAULT_TIMEOUT_S, connect_timeout: float = 30.0,
                 render_mode: str | None = None):
        url = url or os.environ.get(URL_VARIABLE)
        if not url:
            raise ValueError(f"crl/Remote-v0 needs the server's address: gym.make('crl/Remote-v0', url=...) or "
                             f"${URL_VARIABLE} (start one with python -m crl_envs.serve ENV_ID)")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r} is not supported; use one of {self.metadata['render_modes']}")
        self.url, self.ws_url = _base_urls(url)
        self.timeout, self.connect_timeout = float(timeout), float(connect_timeout)
        self.step_time_limit_s = self.timeout
        self.render_mode = render_mode
        schema = self._get_json("/schema")
        try:
            message = schema["action"]["properties"]["message"]
        except (KeyError, TypeError):
            raise RemoteEnvError(f"{self.url} is an OpenEnv server but not a crl-bench text env (its action has no "
                                 "'message'); serve the env with python -m crl_envs.serve") from None
        self.max_action_chars = int(message.get("maxLength", MAX_FRAME_BYTES))
        self.remote_env_id = str(self._get_json("/metadata").get("name", ""))
        self.action_space = UnicodeText(self.max_action_chars)
        self.observation_space = UnicodeText(MAX_FRAME_BYTES)
        self._ws: Any = None
        self._last_obs = ""
        self._last_info: dict[str, Any] = {}
        self._ended_as = (False, False)  # (terminated, truncated) once the episode ended

    # ------------------------------------------------------------ transport
    def _get_json(self, path: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=self.connect_timeout) as reply:  # noqa: S310
                return json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise RemoteEnvError(f"cannot reach the env server at {self.url}{path}: {e}; is python -m crl_envs.serve "
                                 "running there?", code="UNREACHABLE") from None

    def _connect(self) -> None:
        from websockets.sync.client import connect

        try:
            # __enter__ gives the connection on every websockets release (17.1 deprecates using connect() bare)
            self._ws = connect(self.ws_url, open_timeout=self.connect_timeout, max_size=MAX_FRAME_BYTES,
                               close_timeout=CLOSE_TIMEOUT_S).__enter__()
        except Exception as e:  # noqa: BLE001 - refused, DNS, TLS, a proxy...: one clear message
            raise RemoteEnvError(f"cannot open a session at {self.ws_url}: {type(e).__name__}: {e}",
                                 code="UNREACHABLE") from None
        with _OPEN_LOCK:
            _OPEN.add(self)

    def _drop(self, *, say_goodbye: bool = False, timeout: float | None = CLOSE_TIMEOUT_S) -> None:
        """Forget the connection and close it: with the closing handshake, waiting at most ``timeout`` s
        (``None``: just close the socket). ``say_goodbye`` first sends the protocol's ``close`` message."""
        ws, self._ws = self._ws, None
        with _OPEN_LOCK:
            _OPEN.discard(self)
        if ws is None:
            return
        if timeout is None or sys.is_finalizing():
            # At interpreter teardown the reader thread is frozen and ws.close() would join it forever.
            _close_socket(ws)
            return
        try:
            if say_goodbye:
                ws.send(json.dumps({"type": "close"}))
            ws.close_timeout = timeout
            ws.close()
        except Exception:  # noqa: BLE001 - best effort: it may be closed already
            _close_socket(ws)

    def _last_words(self) -> dict[str, Any] | None:
        """A message the server sent before closing the connection, if one is still unread."""
        try:
            return json.loads(self._ws.recv(timeout=0))
        except Exception:  # noqa: BLE001 - closed with nothing left to read
            return None

    def _request(self, message: dict[str, Any], *, reconnect: bool = False) -> dict[str, Any]:
        """Send one message and return the ``data`` of its reply; raise :class:`RemoteEnvError` on an error."""
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            if not reconnect:
                raise RemoteEnvError(f"no session with {self.url}: call reset() to open one", code="NO_SESSION")
            self._connect()
        try:
            self._ws.send(json.dumps(message))
            raw = self._ws.recv(timeout=self.timeout)
        except TimeoutError:
            self._drop()  # a late reply must never be read as the answer to the next request
            raise RemoteEnvError(f"{self.url} sent no reply to {message['type']} within {self.timeout:g} s; "
                                 "the session was closed (reset opens a new one)", code="TIMEOUT") from None
        except ConnectionClosed as e:
            last = self._last_words()  # the server may have said why before it closed (e.g. CAPACITY_REACHED)
            self._drop()
            if last is not None and last.get("type") == "error":
                raise self._error(last) from None
            why = e.rcvd.reason if e.rcvd is not None and e.rcvd.reason else str(e)
            raise RemoteEnvError(f"{self.url} closed the session ({why}); reset opens a new one",
                                 code="CONNECTION_LOST") from None
        except OSError as e:
            self._drop()
            raise RemoteEnvError(f"lost the connection to {self.url}: {e}", code="CONNECTION_LOST") from None
        reply = json.loads(raw)
        if reply.get("type") == "error":
            raise self._error(reply)
        return reply.get("data") or {}

    def _error(self, reply: dict[str, Any]) -> RemoteEnvError:
        """The error a server's error reply stands for; the session is dropped where the server ends it."""
        data = reply.get("data") or {}
        text, code = str(data.get("message", "unknown error")), str(data.get("code") or "ERROR")
        ended = text.startswith(SESSION_ENDED) or code in CLOSING_CODES
        if ended:
            self._drop()
        return RemoteEnvError(f"{self.remote_env_id or self.url}: {code}: {text}", code=code, session_ended=ended)

    # --------------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        data: dict[str, Any] = {}
        if seed is not None:
            data["seed"] = int(seed)
        if options is not None:
            data["options"] = options
        reply = self._request({"type": "reset", "data": data}, reconnect=True)
        obs = reply["observation"]
        self._last_obs, self._last_info, self._ended_as = obs["text"], obs["info"], (False, False)
        return obs["text"], obs["info"]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            return self._invalid(f"Invalid action: expected text, got {type(action).__name__}.")
        if len(action) > self.max_action_chars:
            return self._invalid(f"Invalid action: longer than {self.max_action_chars} characters (the server's limit).")
        reply = self._request({"type": "step", "data": {"message": action}})
        obs = reply["observation"]
        terminated, truncated = bool(obs["terminated"]), bool(obs["truncated"])
        self._last_obs, self._last_info = obs["text"], obs["info"]
        if (terminated or truncated) and not any(self._ended_as):
            self._ended_as = (terminated, truncated)
        return obs["text"], float(reply.get("reward") or 0.0), terminated, truncated, obs["info"]

    def _invalid(self, feedback: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """An invalid move answered here (as a served text env would): feedback, reward 0, state unchanged, and an
        episode that ended stays ended."""
        obs = f"{feedback}\n\n{self._last_obs}" if self._last_obs else feedback
        info = {"task": "", "admissible_actions": None, "success": False, "progress": 0.0,
                **self._last_info, "valid_action": False}
        return obs, 0.0, *self._ended_as, info

    def state(self) -> dict[str, Any]:
        """The server's view of this session: ``episode_id``, ``step_count``, ``env_id``, ``seed``, ``done``."""
        return self._request({"type": "state"})

    def render(self) -> str | None:
        return self._last_obs if self.render_mode == "ansi" else None

    def close(self) -> None:
        """End the session (the server releases its env); never blocks more than about 2 s, and returns at once
        after a server error or at interpreter exit. Idempotent; ``reset`` afterwards opens a new session."""
        self._drop(say_goodbye=True)
        super().close()


def _close_socket(ws: Any) -> None:
    """Close a websockets connection's socket without waiting for its reader thread (which then ends)."""
    sock = getattr(ws, "socket", None)
    if sock is None:
        return
    try:
        sock.shutdown(2)  # socket.SHUT_RDWR: wakes the reader thread's select
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
