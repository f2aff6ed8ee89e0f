"""The experience track's protocol: streams of episodes in persistent worlds, with and without memory.

``python -m eval.run --tasks crl/MiniHack-Corridors-3-v0 --stream 8 --episodes 6 --seed 1000`` plays, for
each task, worlds ``1000 .. 1005`` (``--episodes`` counts worlds; ``--seed`` is the first world), and in
each world a *stream* of 8 consecutive episodes (reset seeds ``world * 1000 + j``,
:mod:`crl_envs.persistent`), in order, so what the agent learned in episode ``j`` is there in
episode ``j + 1``. Then it plays the same episodes again *without memory*. Worlds run side by side
(``--concurrency`` at a time); within a world the episodes run one after another.

**The memory protocol** an agent follows (documented in the README; :mod:`crl_agent.agents.notebook`
implements it, the ``crl`` agent by its bank):

- with memory: ``ctx.with_experience`` and ``ctx.learning`` are true; the harness first calls the
  agent's ``memory_reset()`` where it has one, so every run starts from an empty memory;
- without memory: both are false; the agent must neither read nor write what it remembers.

Episodes with memory are recorded as sample 0, those without as sample 1 (``episodes.jsonl`` keys
``env#seed#0`` / ``env#seed#1``), each with ``memory``, ``world`` and ``stream_index``; the agent's
policies see ``ctx.sample == 0`` in both passes, so a sampling agent draws the same random numbers.

:func:`stream_summary` is what ``summary.json`` gains under ``stream`` (schema 1.3): per task the
success curve over the stream with and without memory (the mean over worlds of each position), per
world the same curves, and the **experience gain**: success over the last ``tail`` episodes of each
stream with memory minus without (same seeds), averaged over worlds, with its standard error over
worlds (paired per world).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from typing import Any

from crl_agent.agents.base import Agent
from crl_agent.episode import EpisodeContext
from crl_agent.rollout import PoolSlot, open_pool, run_episode
from crl_envs.persistent import episode_seed
from crl_envs.registry import has_solver
from eval.recorder import RunRecorder
from eval.results import mean_se

MEMORY_SAMPLE = {True: 0, False: 1}


def stream_tail(stream: int) -> int:
    """How many episodes at the end of a stream the gain is measured on: the last half (at least 1)."""
    return max(1, stream // 2)


def stream_plan(first_world: int, worlds: int, stream: int) -> dict[int, list[int]]:
    """World -> the reset seeds of its stream, in order."""
    return {w: [episode_seed(w, j) for j in range(stream)] for w in range(first_world, first_world + worlds)}


async def run_stream_task(env_id: str, agent: Agent, recorder: RunRecorder, plan: dict[int, list[int]], *,
                          memory: bool, done: set[str], concurrency: int = 1, num_workers: int = 0,
                          backend: str = "process", step_timeout: float = 60.0,
                          make_kwargs: dict[str, Any] | None = None,
                          record_fields: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Play every world's stream of ``env_id`` once (with or without memory); returns the new records.

    Episodes whose key is in ``done`` are skipped (``--resume``); a world's later episodes still run
    after its earlier ones, in order.
    """
    n_slots = max(1, min(concurrency, len(plan)))
    pool = await open_pool([(env_id, dict(make_kwargs or {}))] * n_slots, num_workers=num_workers,
                           backend=backend, timeout=step_timeout)
    oracle = has_solver(env_id)
    free: asyncio.Queue = asyncio.Queue()
    for i in range(n_slots):
        free.put_nowait(PoolSlot(pool, i))
    sample = MEMORY_SAMPLE[memory]
    records: list[dict[str, Any]] = []

    async def world_stream(world: int, seeds: list[int]) -> None:
        slot = await free.get()
        try:
            for j, seed in enumerate(seeds):
                if f"{env_id}#{seed}#{sample}" in done:
                    continue
                ctx = EpisodeContext(env_id, seed, episode_index=j, sample=0, with_experience=memory,
                                     distil=memory, learning=memory)
                if oracle:
                    ctx = dataclasses.replace(ctx, oracle=slot.oracle())
                episode = await run_episode(slot, agent, ctx)
                episode.sample = sample
                records.append(recorder.record(episode, **(record_fields or {}), memory=memory, world=world,
                                               stream_index=j))
        finally:
            free.put_nowait(slot)

    try:
        await asyncio.gather(*(world_stream(w, s) for w, s in plan.items()))
    finally:
        pool.close()
    return records


def stream_summary(records: list[dict[str, Any]], env_ids: list[str], stream: int) -> dict[str, Any]:
    """The ``stream`` part of ``summary.json``: curves and the experience gain per task (see the module doc)."""
    tail = stream_tail(stream)
    tasks: dict[str, Any] = {}
    for env_id in env_ids:
        by_world: dict[int, dict[bool, list[float | None]]] = {}
        for r in records:
            if r.get("env_id") != env_id or "world" not in r or "stream_index" not in r:
                continue
            curves = by_world.setdefault(int(r["world"]), {True: [None] * stream, False: [None] * stream})
            j = int(r["stream_index"])
            if 0 <= j < stream:
                curves[bool(r["memory"])][j] = float(bool(r["success"]))
        worlds, gains = {}, []
        for w, curves in sorted(by_world.items()):
            on, off = curves[True], curves[False]
            pairs = [(a, b) for a, b in zip(on[-tail:], off[-tail:], strict=True) if a is not None and b is not None]
            gain = sum(a - b for a, b in pairs) / len(pairs) if pairs else None
            worlds[str(w)] = {"memory": on, "no_memory": off, "gain": gain}
            if gain is not None:
                gains.append(gain)

        def curve(memory: bool, curves_by_world=by_world) -> list[float | None]:
            out = []
            for j in range(stream):
                xs = [c[memory][j] for c in curves_by_world.values() if c[memory][j] is not None]
                out.append(sum(xs) / len(xs) if xs else None)
            return out

        gain, gain_se = mean_se(gains)
        tail_on = [x for c in by_world.values() for x in c[True][-tail:] if x is not None]
        tail_off = [x for c in by_world.values() for x in c[False][-tail:] if x is not None]
        tasks[env_id] = {
            "worlds": len(by_world),
            "curve_memory": curve(True),
            "curve_no_memory": curve(False),
            "tail_success_memory": mean_se(tail_on)[0],
            "tail_success_no_memory": mean_se(tail_off)[0],
            "experience_gain": gain,
            "experience_gain_se": gain_se,
            "per_world": worlds,
        }
    per_task = [t for t in tasks.values() if t["worlds"] and not math.isnan(t["experience_gain"])]
    macro = sum(t["experience_gain"] for t in per_task) / len(per_task) if per_task else float("nan")
    macro_se = (math.sqrt(sum(t["experience_gain_se"] ** 2 for t in per_task)) / len(per_task)
                if per_task else float("nan"))
    return {"stream": stream, "tail": tail, "tasks": tasks,
            "macro": {"experience_gain": macro, "experience_gain_se": macro_se, "tasks": len(per_task)}}


def stream_table(stream: dict[str, Any]) -> str:
    """The ``stream`` part of a summary as a markdown table."""
    lines = [f"Experience gain: success over the last {stream['tail']} of {stream['stream']} episodes per world, "
             "with memory minus without (same seeds), ± standard error over worlds.", "",
             "| task | worlds | with memory | without | gain | curve with memory | curve without |",
             "|---|---|---|---|---|---|---|"]

    def fmt(curve: list[float | None]) -> str:
        return " ".join("-" if x is None else f"{x:.2f}" for x in curve)

    for env_id, t in stream["tasks"].items():
        lines.append(f"| {env_id} | {t['worlds']} | {t['tail_success_memory']:.1%} | {t['tail_success_no_memory']:.1%} "
                     f"| {t['experience_gain'] * 100:+.1f} ± {t['experience_gain_se'] * 100:.1f} "
                     f"| {fmt(t['curve_memory'])} | {fmt(t['curve_no_memory'])} |")
    m = stream["macro"]
    lines.append(f"| **macro** | | | | {m['experience_gain'] * 100:+.1f} ± {m['experience_gain_se'] * 100:.1f} | | |")
    return "\n".join(lines) + "\n"


async def run_streams(args: Any, env_ids: list[str], agent: Agent, out: Any, done: dict[str, dict[str, Any]],
                      identity: dict[str, dict[str, Any]], step_caps: dict[str, dict[str, int]],
                      run_config: dict[str, Any]) -> dict[str, Any]:
    """``eval.run --stream N``: every task's worlds with memory, then again without; writes the run folder."""
    from eval import report
    from eval.results import EpisodeLog, summarize, write_json

    plan = stream_plan(args.seed, args.episodes, args.stream)
    recorder = RunRecorder(out, args.trajectories)
    try:
        for memory in (True, False):
            reset = getattr(agent, "memory_reset", None)
            if memory and callable(reset) and not done:
                reset()
            await asyncio.gather(*(
                run_stream_task(env_id, agent, recorder, plan, memory=memory, done=set(done),
                                concurrency=args.concurrency, num_workers=args.num_workers,
                                backend=args.env_backend, step_timeout=args.step_timeout,
                                make_kwargs=step_caps.get(env_id, {}),
                                record_fields={"run_config": identity[env_id]})
                for env_id in env_ids))
    finally:
        try:
            await agent.aclose()
        finally:
            recorder.close()
    wanted = {f"{e}#{s}#{k}" for e in env_ids for seeds in plan.values() for s in seeds for k in (0, 1)}
    records = [r for key, r in EpisodeLog(out / "episodes.jsonl").latest().items() if key in wanted]
    summary = summarize([r for r in records if r.get("memory", True)], env_ids, agent.config(), run_config)
    summary["stream"] = stream_summary(records, env_ids, args.stream)
    write_json(out / "summary.json", summary)
    (out / "results.md").write_text(report.markdown_table(summary) + "\n" + stream_table(summary["stream"]),
                                    encoding="utf-8")
    if not args.quiet:
        print(stream_table(summary["stream"]))
        print(f"results in {out} (episodes.jsonl, trajectories.jsonl.gz, summary.json, results.md)")
    return summary
