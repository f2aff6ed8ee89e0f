"""``RayEnvPool`` (``backend="ray"``): the env-slot API on Ray actors, for runs that span machines.

Each actor hosts several envs (slots are spread round-robin over ``num_workers`` actors),
so a run scales over a Ray cluster. Calls to one actor made in the same turn of the event loop
(e.g. every episode on it stepping after the last batch of steps came back) go to it as one batch.
A batch travels over a direct socket to the actor (:mod:`crl_envs.pool.ray_channel`: a Ray round
trip costs about a millisecond, the socket's about 50 us); Ray places, kills and re-creates the
actors. Where the pool cannot connect to an actor (a firewall between nodes), or with
``direct=False``, each batch is one Ray call, :meth:`_ActorBody.call_many`, so 16 slots on an actor
pay about 1/16 of Ray's round trip a step.

Faults are handled like the process backend, with the same slot bookkeeping
(:mod:`crl_envs.pool.slots`): a call that times out or whose actor dies fails with
:class:`EnvError`, the actor is killed and re-created with its envs, every other episode it
hosted is lost until its slot is reset, and other actors keep running (an actor whose socket closes
has died: its calls fail as ``"crash"``). The calls of a batch are
answered one by one: an env that raises fails only its own call. As in the process backend,
a timeout counts from when the actor begins the work (batches on one actor run one after the
other, so a batch's clock starts when the one ahead of it returns); a batch may run as long as
its calls' timeouts added up, so with several calls in a batch a hung one is found that much later.

Actors are spread over the cluster's nodes that offer CPUs, the next one always on the node
hosting the fewest of the pool's actors (Ray's own ``SPREAD`` is best effort: it put three
zero-CPU actors on two of three nodes, or on one); ``actor_options`` can place them otherwise.
When a node is lost, the calls on its actors fail with cause ``"crash"`` and the actors are
re-created on the nodes that remain.

Needs ``ray`` (``pip install -e ".[ray]"``). The pool joins the cluster Ray is connected to:
call ``ray.init(address=...)`` yourself, or set ``RAY_ADDRESS`` (the head's ``HOST:6379``, or ``auto``
on a node that ``ray start`` joined); otherwise a local one-node cluster is started.
"""

from __future__ import annotations

import asyncio
import os
import pickle
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from crl_envs.pool.base import EnvError
from crl_envs.pool.host import answer, settle
from crl_envs.pool.ray_channel import Channel, ChannelLost, ChannelServer, new_secret
from crl_envs.pool.slots import SlotFront, SlotTable, parse_envs


def _ray():
    try:
        import ray
    except ImportError as e:
        raise gym.error.DependencyNotInstalled('the ray backend needs ray: pip install -e ".[ray]"') from e
    return ray


class _ActorBody:
    """A Ray actor body: several envs in an :class:`~crl_envs.pool.host.EnvHost` (the checks every backend shares).

    An env whose constructor raises breaks only its own slot: its calls fail with the
    constructor's error, and non-text observations from a text env are errors of their call.
    """

    def __init__(self, specs: dict[int, tuple[Any, dict]]):
        import crl_envs  # noqa: F401 - registers ids and plugins in the actor
        from crl_envs.pool.host import EnvHost

        self.host = EnvHost()
        self.slots = list(specs)
        self.limits: dict[int, float | None] = {}
        for slot, (spec, kw) in specs.items():
            try:
                self.limits[slot] = self.host.make(slot, spec, kw)
            except Exception:  # noqa: BLE001, S110 - reported by the slot's next call
                pass

    def made(self) -> dict[int, tuple[float | None, str | None]]:
        """Per slot: the env's declared ``step_time_limit_s``, and why it could not be made (or ``None``)."""
        return {slot: (self.limits.get(slot), self.host.broken.get(slot)) for slot in self.slots}

    def call(self, slot: int, method: str, args: tuple, kwargs: dict[str, Any] | None = None) -> Any:
        if method == "make":
            raise AttributeError("make cannot be called through the pool")
        return self.host.call(slot, method, args, kwargs)

    def call_many(self, calls: list[tuple[int, str, tuple, dict[str, Any] | None]]) -> list[tuple[bool, bytes]]:
        """Serve ``calls`` in order through :meth:`call`, each answered as :func:`crl_envs.pool.host.answer` does."""
        return [answer(self, *c) for c in calls]

    def open_channel(self, secret: bytes) -> tuple[str, int]:
        """Listen for the pool's direct socket (:mod:`crl_envs.pool.ray_channel`); returns its address."""
        import ray

        self.channel = ChannelServer(self.serve_pickled, secret, ray.util.get_node_ip_address())
        return self.channel.address

    def serve_pickled(self, calls: list[bytes]) -> list[tuple[bool, bytes]]:
        """:meth:`call_many` for calls pickled one by one (a call that cannot be unpickled here fails alone)."""
        out = []
        for data in calls:
            try:
                call = pickle.loads(data)  # noqa: S301 - from the pool that holds the channel's secret
            except Exception as e:  # noqa: BLE001 - e.g. a class only the pool's process can import
                out.append((False, pickle.dumps((type(e).__name__, f"the call cannot be unpickled in the actor: {e}",
                                                 ""))))
                continue
            out.append(answer(self, *call))
        return out

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


@dataclass
class _Call:
    slot: int
    method: str
    args: tuple
    kwargs: dict[str, Any] | None
    timeout: float
    done: asyncio.Future


class RayEnvPool(SlotFront):
    """The :class:`~crl_envs.pool.base.SlotPool` API backed by Ray actors.

    Args:
        envs: ``(env_id, make_kwargs)`` pairs (or bare ids), one per slot.
        num_workers: actors (default: one per slot, at most 2).
        timeout: seconds a ``step``/``call`` may run before its actor is replaced.
        reset_timeout: the same for ``reset`` and actor creation.
        actor_options: Ray actor options (``ray.remote(...).options``) over the default ``num_cpus=0``,
            e.g. ``{"resources": {"env_host": 1}}``; a ``scheduling_strategy`` there replaces the spread.
        direct: send calls over a direct socket to each actor (False: every batch is a Ray call).
    """

    def __init__(
        self,
        envs: list[tuple[str, dict[str, Any]] | str],
        num_workers: int | None = None,
        timeout: float = 60.0,
        reset_timeout: float = 300.0,
        actor_options: dict[str, Any] | None = None,
        direct: bool = True,
    ):
        pairs = parse_envs(envs)
        self.num_workers = max(1, min(num_workers or min(2, len(pairs)), len(pairs)))
        self.timeout, self.reset_timeout = timeout, reset_timeout
        self.actor_options = {"num_cpus": 0, **(actor_options or {})}
        self.slots = SlotTable(pairs, self.num_workers, "actor")
        self.actors: list[Any] = [None] * self.num_workers
        self._nodes: list[str | None] = [None] * self.num_workers  # the node each actor was placed on
        self._queued: list[list[_Call]] = [[] for _ in range(self.num_workers)]  # the next batch of each actor
        self._last: list[asyncio.Future | None] = [None] * self.num_workers  # the last batch sent to each actor
        self.direct = bool(direct)
        self._secret = new_secret()
        self._channels: list[Channel | None] = [None] * self.num_workers
        # batches held while an actor's channel opens (None: not opening), sent in order once it is open or not
        self._waiting: list[list[list[_Call]] | None] = [None] * self.num_workers
        self.channel_errors: list[str | None] = [None] * self.num_workers  # why an actor is served by Ray calls
        self._opening: set[asyncio.Future] = set()  # channels being opened for re-created actors
        self._restarts = 0
        self._closed = False
        self._started = False

    def _spawn(self, w: int) -> None:
        ray = _ray()
        options = dict(self.actor_options)
        if "scheduling_strategy" not in options:
            options["scheduling_strategy"] = self._spread(w)
        self.actors[w] = ray.remote(_ActorBody).options(**options).remote(self.slots.specs(w))

    def _spread(self, w: int) -> Any:
        """Where actor ``w`` goes: the live node (with CPUs and the resources the actor asks for) hosting the
        fewest of the other actors, and not the node its predecessor ran on while another is left (a lost
        node can look alive for a moment)."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        needs = {"CPU": max(float(self.actor_options.get("num_cpus") or 0), 1e-9),
                 **{k: float(v) for k, v in (self.actor_options.get("resources") or {}).items()}}
        try:
            listed = ray.nodes()
        except Exception:  # noqa: BLE001 - no node table here (e.g. a Ray Client): Ray's own best-effort spread
            return "SPREAD"
        nodes = sorted(n["NodeID"] for n in listed if n.get("Alive")
                       and all(n.get("Resources", {}).get(k, 0) >= v for k, v in needs.items()))
        candidates = [n for n in nodes if n != self._nodes[w]] or nodes
        if not candidates:
            return "SPREAD"
        load = {n: sum(1 for v, m in enumerate(self._nodes) if m == n and v != w) for n in candidates}
        node = min(candidates, key=lambda n: load[n])
        self._nodes[w] = node
        # Hard affinity: a soft one let Ray put actors elsewhere while a fresh node's resources were still being
        # reported (two of three nodes used). Were the node lost before the actor starts, its calls fail as a
        # crash and the replacement goes to another node.
        return NodeAffinitySchedulingStrategy(node, soft=False)

    async def start(self) -> RayEnvPool:
        """Start Ray if needed (a local cluster) and create the actors with their envs.

        Raises:
            EnvError: when an env cannot be created (its constructor raised); the other slots serve.
        """
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("the pool is closed")
        ray = _ray()
        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            if os.environ.get("RAY_ADDRESS"):  # join that cluster (ray.init reads it; sizes are the cluster's)
                ray.init(log_to_driver=False)
            else:
                ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        self._started = True
        for w in range(self.num_workers):
            self._spawn(w)
            if self.direct:
                self._waiting[w] = []
        made = False
        try:
            reports = await asyncio.gather(*(asyncio.wait_for(a.made.remote(), self.reset_timeout)
                                             for a in self.actors))
            made = True
        finally:
            if self.direct and made:
                await asyncio.gather(*(self._open_channel(w) for w in range(self.num_workers)))
            elif self.direct:  # the actors did not come up: held calls go as Ray calls (and fail as those do)
                for w in range(self.num_workers):
                    self._send_held(w)
        broken = []
        for report in reports:
            for slot, (limit, why) in report.items():
                self.slots.made(slot, limit)
                if why is not None:
                    broken.append(self._error(slot, "exception", why))
        if broken:  # as the other backends: start() names the first env that could not be made
            raise min(broken, key=lambda e: e.slot)
        return self

    def _error(self, slot: int, cause: str, detail: str) -> EnvError:
        return self.slots.error(slot, cause, detail)

    def _restart(self, w: int, cause: str, detail: str) -> None:
        """Replace actor ``w``; every episode it hosted is lost until its slot is reset."""
        ray = _ray()
        try:
            ray.kill(self.actors[w], no_restart=True)
        except Exception:  # noqa: BLE001, S110 - it may be dead already
            pass
        if self._channels[w] is not None:
            self._channels[w].close()
            self._channels[w] = None
        self.slots.lose(w, cause, detail)
        self._restarts += 1
        if not self._closed:
            self._spawn(w)
            if self.direct and self._waiting[w] is None:
                self._waiting[w] = []
                task = asyncio.ensure_future(self._open_channel(w))
                self._opening.add(task)  # the loop keeps only a weak reference to a task
                task.add_done_callback(self._opening.discard)

    async def _open_channel(self, w: int) -> None:
        """Open actor ``w``'s direct socket (or leave it to Ray calls, saying why), then send the batches held."""
        actor = self.actors[w]
        try:
            address = await asyncio.wait_for(actor.open_channel.remote(self._secret), self.reset_timeout)
            channel = await Channel.open(tuple(address), self._secret, timeout=min(30.0, self.reset_timeout))
        except Exception as e:  # noqa: BLE001 - a firewall, or the actor died: Ray calls serve it (and find out)
            channel, self.channel_errors[w] = None, f"{type(e).__name__}: {e}"
        if self.actors[w] is not actor and not self._closed:  # replaced while it opened: open the new actor's
            if channel is not None:
                channel.close()
            await self._open_channel(w)
            return
        if channel is not None:
            if self._closed:
                channel.close()
            else:
                self._channels[w], self.channel_errors[w] = channel, None
        self._send_held(w)

    def _send_held(self, w: int) -> None:
        held, self._waiting[w] = self._waiting[w] or [], None
        for calls in held:
            self._dispatch(w, calls)

    async def _request(self, slot: int, method: str, args: tuple, timeout: float,
                       kwargs: dict[str, Any] | None = None) -> Any:
        s = await self._admit(slot, method)
        loop = asyncio.get_running_loop()
        queue = self._queued[s.host]
        if not queue:  # the first call this turn: the batch leaves once every caller of this turn has queued
            loop.call_soon(self._send, s.host)
        call = _Call(slot, method, args, kwargs, timeout, loop.create_future())
        queue.append(call)
        try:
            return await call.done
        except EnvError:
            if self._closed:  # close() killed the actor under this call
                raise self._error(slot, "closed", "the pool was closed") from None
            raise

    def _send(self, w: int) -> None:
        """Send actor ``w`` the calls queued for it, as one batch."""
        calls, self._queued[w] = self._queued[w], []
        if self._waiting[w] is not None and not self._closed:  # its channel is opening: after it, in order
            self._waiting[w].append(calls)
            return
        self._dispatch(w, calls)

    def _dispatch(self, w: int, calls: list[_Call]) -> None:
        """Send ``calls`` to actor ``w`` as one batch: over its channel, or as one Ray call."""
        if self._closed:
            for c in calls:
                _fail(c, self._error(c.slot, "closed", "the pool was closed"))
            return
        actor, channel = self.actors[w], self._channels[w]
        if channel is not None and channel.loop is asyncio.get_running_loop():
            payloads, sent = [], []
            for c in calls:
                try:
                    payloads.append(_pickle_call(c))
                except Exception as e:  # noqa: BLE001 - e.g. an action that cannot be pickled: fails alone
                    _fail(c, self._error(c.slot, "exception", f"the {c.method} request cannot be sent to the actor: "
                                                              f"{type(e).__name__}: {e}"))
                    continue
                sent.append(c)
            if sent:
                ahead = self._last[w]
                self._last[w] = asyncio.ensure_future(self._await_batch(w, actor, sent, channel.request(payloads),
                                                                        ahead))
            return
        try:
            ref = actor.call_many.remote([(c.slot, c.method, c.args, c.kwargs) for c in calls])
        except Exception as e:  # noqa: BLE001 - e.g. an action Ray cannot serialise
            if len(calls) > 1:  # send them one by one, so only that call fails
                for c in calls:
                    self._dispatch(w, [c])
                return
            c = calls[0]
            _fail(c, self._error(c.slot, "exception", f"the {c.method} request cannot be sent to the actor "
                                                      f"(Ray): {type(e).__name__}: {e}"))
            return
        ahead = self._last[w]
        self._last[w] = asyncio.ensure_future(self._await_batch(w, actor, calls, ref, ahead))

    async def _await_batch(self, w: int, actor: Any, calls: list[_Call], ref: Any, ahead: asyncio.Future | None) -> None:
        ray = _ray()
        if ahead is not None and not ahead.done():  # the actor serves the batch ahead first: not this one's time
            await asyncio.wait((ahead,))
        timeout = sum(c.timeout for c in calls)
        try:
            answers = await asyncio.wait_for(ref, timeout)
        except asyncio.TimeoutError:
            what = " or ".join(sorted({c.method for c in calls}))
            self._lose_batch(w, actor, calls, "timeout", f"{what} took longer than {timeout:g} s")
            return
        except (ChannelLost, ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError) as e:
            # unschedulable: placed on a node that was lost before the actor started; its replacement goes elsewhere
            self._lose_batch(w, actor, calls, "crash", f"actor died: {str(e).splitlines()[0]}")
            return
        except Exception as e:  # noqa: BLE001 - e.g. Ray could not send the answers: fails this batch's calls
            for c in calls:
                _fail(c, self._error(c.slot, "exception", f"the {c.method} request failed in Ray: "
                                                          f"{type(e).__name__}: {e}"))
            return
        for c, (ok, data) in zip(calls, answers, strict=True):
            settle(c.done, ok, data, c.method, lambda detail, slot=c.slot: self._error(slot, "exception", detail))

    def _lose_batch(self, w: int, actor: Any, calls: list[_Call], cause: str, detail: str) -> None:
        """The batch's actor hung or died: fail its calls and replace the actor (once, if it still serves ``w``)."""
        for c in calls:
            _fail(c, self._error(c.slot, cause, detail))
        if self.actors[w] is actor:
            self._restart(w, cause, detail)

    def restarts(self) -> int:
        return self._restarts

    def channels_open(self) -> list[bool]:
        """Per actor: whether its calls go over the direct socket (else as Ray calls; ``channel_errors`` says why)."""
        return [c is not None for c in self._channels]

    async def actor_nodes(self) -> list[str | None]:
        """The Ray node id each actor runs on (``None`` for one that does not answer), e.g. to check the spread."""
        ray = _ray()
        if not self._started:
            await self.start()

        async def node(actor: Any) -> str | None:
            try:
                return await asyncio.wait_for(actor.node_id.remote(), self.reset_timeout)
            except (asyncio.TimeoutError, ray.exceptions.RayError):
                return None

        return list(await asyncio.gather(*(node(a) for a in self.actors)))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for channel in self._channels:
            if channel is not None:
                channel.close()
        if self._started:
            ray = _ray()
            for a in self.actors:
                if a is not None:
                    try:
                        ray.kill(a, no_restart=True)
                    except Exception:  # noqa: BLE001, S110
                        pass


def _pickle_call(c: _Call) -> bytes:
    from ray import cloudpickle  # as Ray would pickle the call's arguments

    return cloudpickle.dumps((c.slot, c.method, c.args, c.kwargs), protocol=pickle.HIGHEST_PROTOCOL)


def _fail(call: _Call, error: EnvError) -> None:
    if not call.done.done():
        call.done.set_exception(error)
