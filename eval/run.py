"""Run a task set with any agent and write versioned results.

Usage::

    python -m eval.run --agent oracle --tasks 6 --episodes 10 --seed 0 --out runs/oracle
    python -m eval.run --agent mypkg.agents:MyAgent --tasks crl/Sokoban-6x6-2-v0

It writes ``episodes.jsonl`` (one record per episode, appended as episodes finish),
``trajectories.jsonl.gz`` (every step of every episode, see :mod:`eval.trajectories`),
``summary.json`` (schema-versioned) and ``results.md`` into ``--out``, and prints a table.
``--resume`` skips the episodes already recorded there, so a killed run picks up where it stopped.
Episodes are played by :func:`crl_agent.rollout.play`, the driver the trainer uses too.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from tqdm import tqdm

from crl_agent.agents import BUILTIN, Agent, EpisodeContext, load_agent_class, parse_agent_args
from crl_agent.episode import Episode, episode_key
from crl_agent.rollout import open_pool, play
from crl_envs.registry import has_solver
from eval import report, trajectories
from eval.recorder import RunRecorder
from eval.results import EpisodeLog, json_default, summarize, write_json
from eval.suites import TASK_SETS, TaskSetError, resolve_tasks


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", default="oracle", help=f"one of {sorted(BUILTIN)} or module:Class (default: oracle)")
    p.add_argument(
        "--tasks",
        default="crl/Sokoban-6x6-2-v0",
        help=f"a task set ({', '.join(sorted(TASK_SETS))}) or a comma list of env ids",
    )
    p.add_argument("--episodes", type=int, default=10, help="episodes per task (default: 10)")
    p.add_argument("--seed", type=int, default=0, help="episode i of a task resets with seed S+i (default: 0)")
    p.add_argument("--samples", type=int, default=1,
                   help="episodes per seed, each with its own sampling seed (GRPO groups, pass@k; default: 1)")
    p.add_argument("--stream", type=int, default=None, metavar="N",
                   help="experience track: play N consecutive episodes in each persistent world (--episodes worlds, "
                        "from world --seed) with memory, then the same seeds without; summary.json gains the "
                        "experience gain (see eval/stream.py)")
    p.add_argument("--trajectories", choices=trajectories.MODES, default="text",
                   help="what trajectories.jsonl.gz keeps: text (what a person reads, default), full (adds token "
                        "ids and log-probs) or none")
    p.add_argument("--out", type=Path, default=None, help="run directory (default: runs/<time>_<agent>)")
    p.add_argument("--resume", action="store_true", help="skip episodes already recorded in --out")
    p.add_argument("--retry-errored", action="store_true",
                   help="with --resume: play again the episodes recorded as errored (e.g. during a server outage)")
    p.add_argument("--concurrency", type=int, default=1, help="episodes in flight per task (default: 1)")
    p.add_argument(
        "--num-workers",
        type=int,
        default=0,
        help="env worker processes per task; 0 runs envs in this process (default: 0)",
    )
    p.add_argument("--env-backend", choices=("process", "ray"), default="process",
                   help="where envs run when --num-workers > 0 (default: process); with 0 they run in this process, "
                        "each on its own thread")
    p.add_argument("--step-timeout", type=float, default=60.0, help="seconds before a hung env step errors (default: 60)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or table")
    p.add_argument("--max-steps", type=int, default=None,
                   help="cap every env's episode length at N steps (default: each env's own limit)")
    p.add_argument("--sequential-tasks", action="store_true",
                   help="run tasks one after another instead of side by side")
    g = p.add_argument_group("agent options (passed to agents whose constructor takes them)")
    g.add_argument("--model", default=None, help="LLM: a local model directory or a server's model name "
                   "(default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--backend", default=None, help="LLM backend: transformers, openai or vllm (default: transformers)")
    g.add_argument("--experience", choices=("on", "off"), default=None,
                   help="crl: use test-time experience (off evaluates without it, as in the paper)")
    g.add_argument("--bank", type=Path, default=None, help="crl: experience bank directory to persist and reuse")
    g.add_argument("--extractor-model", default=None, help="crl: extractor model (default: the actor's model)")
    g.add_argument("--agent-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="any other constructor argument; VALUE is parsed as JSON when it can be (repeatable)")
    return p


@dataclass
class TaskRun:
    """One task of a run: which episodes to play and how.

    Attributes:
        env_id: the Gymnasium id.
        episodes: ``(index, seed, sample)`` of each episode to play.
        concurrency: episodes in flight (one env each).
        num_workers: env worker processes (0: envs in this process, each slot on its own thread).
        backend: where pooled envs run when ``num_workers > 0`` (``process`` or ``ray``).
        step_timeout: seconds before a hung pooled call errors.
        make_kwargs: extra ``gym.make`` kwargs (the step cap).
        record_fields: added to every episode record (the configuration ``--resume`` checks).
        quiet: no progress bar.
        position: the progress bar's line.
    """

    env_id: str
    episodes: list[tuple[int, int, int]]
    concurrency: int = 1
    num_workers: int = 0
    backend: str = "process"
    step_timeout: float = 60.0
    make_kwargs: dict[str, Any] = field(default_factory=dict)
    record_fields: dict[str, Any] = field(default_factory=dict)
    quiet: bool = True
    position: int = 0


async def run_task(task: TaskRun, agent: Agent, recorder: RunRecorder) -> list[dict[str, Any]]:
    """Play ``task``'s episodes with ``concurrency`` envs and record each as it ends; returns the records."""
    env_id = task.env_id
    n_envs = max(1, min(task.concurrency, len(task.episodes)))
    if getattr(agent, "needs_solver", False) and not has_solver(env_id):
        raise TaskSetError(f"{env_id} has no solver (no oracle_action), so the {agent.name} agent cannot play it; "
                           "leave it out of --tasks or use another agent")
    try:
        pool = await open_pool([(env_id, task.make_kwargs)] * n_envs, num_workers=task.num_workers,
                               backend=task.backend, timeout=task.step_timeout)
    except Exception as e:  # noqa: BLE001 - e.g. official data missing: one clear message, not a traceback
        raise TaskSetError(f"{env_id}: cannot create the env: {type(e).__name__}: {e}") from e
    cap = task.make_kwargs.get("max_episode_steps") or gym.spec(env_id).max_episode_steps or 100
    # The bar counts episodes but moves a little at every step, so slow (LLM) episodes show progress.
    bar = tqdm(total=len(task.episodes), desc=env_id, disable=task.quiet, unit="ep", leave=True,
               position=task.position, bar_format="{l_bar}{bar}| {n:.1f}/{total_fmt} [{elapsed}<{remaining}{postfix}]")
    records: list[dict[str, Any]] = []
    moved: dict[str, float] = {}  # per episode in flight: how far its steps moved the bar (at most 0.95)

    def show() -> None:
        # The bar is set from exact counts, never summed from fractions: a sum of 1/cap steps drifts past the
        # total (tqdm then warns "clamping frac" and shows a negative time left, "<-00:00").
        bar.n = min(float(len(task.episodes)), len(records) + sum(moved.values()))
        bar.update(0)  # redraws when due

    def on_step(ctx: EpisodeContext, _step) -> None:
        key = episode_key(ctx.env_id, ctx.seed, ctx.sample)
        moved[key] = min(0.95, moved.get(key, 0.0) + 1.0 / cap)
        show()

    def on_end(ctx: EpisodeContext, episode: Episode) -> None:
        records.append(recorder.record(episode, **task.record_fields))
        moved.pop(episode.key, None)
        show()
        bar.set_postfix(success=f"{sum(r['success'] for r in records) / len(records):.2f}")

    contexts = [EpisodeContext(env_id, seed, index, sample=sample) for index, seed, sample in task.episodes]
    try:
        await play(pool, agent, contexts, oracle=has_solver(env_id), on_step=None if task.quiet else on_step,
                   on_end=on_end)
    finally:
        bar.close()
        pool.close()
    return records


AGENT_FLAGS = ("model", "backend", "experience", "bank", "extractor_model")


def agent_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Constructor arguments the user asked for: the agent flags that were set, plus ``--agent-arg``."""
    kwargs = {k: getattr(args, k) for k in AGENT_FLAGS if getattr(args, k, None) is not None}
    if "bank" in kwargs:
        kwargs["bank"] = str(kwargs["bank"])
    kwargs.update(parse_agent_args(args.agent_arg))
    return kwargs


def make_agent(
    name: str,
    seed: int,
    kwargs: dict[str, Any] | None = None,
    run_dir: Path | None = None,
    flag_keys: tuple[str, ...] = AGENT_FLAGS,
) -> Agent:
    """Build an agent, passing ``seed`` and ``run_dir`` where its constructor takes them.

    Raises:
        ValueError: when the user asked for an option the agent's constructor does not take.
    """
    cls = load_agent_class(name)
    params = list(inspect.signature(cls).parameters)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(cls).parameters.values())
    # an agent that groups its options in a dataclass (`options_class`) takes each field as a keyword too
    options = getattr(cls, "options_class", None)
    if dataclasses.is_dataclass(options):
        params += [f.name for f in dataclasses.fields(options) if f.name not in params]
    kwargs = dict(kwargs or {})
    # Named flags (--experience, --bank, ...) must be real parameters: swallowed by **kwargs they would
    # reach an LLM backend and fail far from their cause. --agent-arg keys may go to **kwargs.
    unknown = [k for k in kwargs if k not in params and (k in flag_keys or not takes_any)]
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") if k in flag_keys else f"--agent-arg {k}" for k in unknown)
        raise ValueError(f"agent {name!r} does not take {flags} (its constructor takes: {', '.join(params) or 'nothing'})")
    if "seed" in params:
        kwargs["seed"] = seed
    if "run_dir" in params and run_dir is not None:
        kwargs["run_dir"] = str(run_dir)
    return cls(**kwargs)


def episode_identity(
    args: argparse.Namespace, kwargs: dict[str, Any], env_id: str, step_caps: dict[str, dict[str, int]]
) -> dict[str, Any]:
    """What makes an episode of ``env_id`` comparable with another: agent, its options, seed and step cap.

    It is stored in every episode record, so ``--resume`` can refuse to mix runs of different configurations.
    """
    cap = step_caps.get(env_id, {}).get("max_episode_steps", gym.spec(env_id).max_episode_steps)
    ident = {"agent": BUILTIN.get(args.agent, args.agent), "agent_options": kwargs, "seed": args.seed,
             "max_episode_steps": cap}
    return json.loads(json.dumps(ident, default=json_default))  # compare as it reads back from episodes.jsonl


def check_resumable(records: list[dict[str, Any]], identity: dict[str, dict[str, Any]], out: Path) -> None:
    """Refuse to resume a run whose recorded episodes were played with another configuration.

    Raises:
        ValueError: naming the first setting that differs and the fix.
    """
    for r in records:
        old, new = r.get("run_config"), identity.get(r.get("env_id"))
        if old is None or new is None or old == new:
            continue  # records from before run_config was recorded, or tasks this run does not touch
        diffs = [f"{k}: recorded {old.get(k)!r}, now {new.get(k)!r}" for k in sorted(set(old) | set(new))
                 if old.get(k) != new.get(k)]
        raise ValueError(
            f"{out} holds episodes played with another configuration ({r['key']}: {'; '.join(diffs)}); "
            "resume with the same --agent, agent options, --seed and --max-steps, or choose another --out"
        )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    env_ids = resolve_tasks(args.tasks)
    kwargs = agent_kwargs(args)
    out: Path = args.out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}_{args.agent.rsplit(':', 1)[-1]}"
    args.out = out  # main() names it if the run is interrupted
    log = EpisodeLog(out / "episodes.jsonl")
    if log.path.exists() and not args.resume:
        raise SystemExit(f"{log.path} exists: pass --resume to continue that run, or choose another --out")
    # --max-steps caps each env's own limit (the paper runs LLM agents for at most 30 turns).
    step_caps = {}
    if args.max_steps:
        for env_id in env_ids:
            limit = gym.spec(env_id).max_episode_steps
            step_caps[env_id] = {"max_episode_steps": min(limit, args.max_steps) if limit else args.max_steps}
    unbounded = [e for e in env_ids if e not in step_caps and not gym.spec(e).max_episode_steps]
    if unbounded:  # an agent that never ends the episode would run forever
        raise TaskSetError(f"{', '.join(unbounded)} registered without max_episode_steps: pass --max-steps N, "
                           "or register the env with max_episode_steps=N")
    identity = {e: episode_identity(args, kwargs, e, step_caps) for e in env_ids}
    log.repair()
    done = log.latest()
    check_resumable(list(done.values()), identity, out)
    trajectories.repair(out, done)  # after a kill: no trajectory without its episode record, none torn
    try:
        agent = make_agent(args.agent, args.seed, kwargs, run_dir=out)
    except (TaskSetError, ValueError):
        raise
    except Exception as e:  # noqa: BLE001 - e.g. a model path that does not load: one line, not a traceback
        raise TaskSetError(f"could not create the {args.agent!r} agent: {type(e).__name__}: {e}") from e
    if args.retry_errored:
        done = {k: r for k, r in done.items() if not r.get("error")}
    run_config = {
        "tasks": args.tasks,
        "env_ids": env_ids,
        "episodes": args.episodes,
        "seed": args.seed,
        "samples": args.samples,
        "trajectories": args.trajectories,
        "num_workers": args.num_workers,
        "env_backend": args.env_backend,
        "argv": sys.argv[1:],
    }
    run_config["max_steps"] = args.max_steps
    run_config["max_episode_steps"] = {e: c["max_episode_steps"] for e, c in step_caps.items()}
    if args.stream:  # the experience track: worlds (--episodes of them) played as streams, with and without memory
        from eval.stream import run_streams

        run_config["stream"] = args.stream
        return await run_streams(args, env_ids, agent, out, done, identity, step_caps, run_config)
    wanted = {(e, args.seed + i, k): i for e in env_ids for i in range(args.episodes) for k in range(args.samples)}
    tasks = []
    for env_id in env_ids:
        episodes = [(i, s, k) for (e, s, k), i in wanted.items() if e == env_id and episode_key(e, s, k) not in done]
        if episodes:
            tasks.append(TaskRun(env_id, episodes, concurrency=args.concurrency, num_workers=args.num_workers,
                                 backend=args.env_backend, step_timeout=args.step_timeout,
                                 make_kwargs=step_caps.get(env_id, {}), record_fields={"run_config": identity[env_id]},
                                 quiet=args.quiet, position=len(tasks)))
    recorder = RunRecorder(out, args.trajectories)
    try:
        # Tasks run side by side (one progress bar each), so an LLM agent batches across tasks.
        if args.sequential_tasks:
            for task in tasks:
                await run_task(task, agent, recorder)
        else:
            await asyncio.gather(*(run_task(task, agent, recorder) for task in tasks))
    finally:
        try:
            await agent.aclose()
        finally:
            recorder.close()
    wanted = {episode_key(*k) for k in wanted}
    records = [r for key, r in log.latest().items() if key in wanted]
    summary = summarize(records, env_ids, agent.config(), run_config)
    write_json(out / "summary.json", summary)
    (out / "results.md").write_text(report.markdown_table(summary), encoding="utf-8")
    plots = report.write_plots([summary], out, records_by_run=[records])
    if not args.quiet:
        report.print_table(summary)
        report.print_errors(summary)
        print(f"results in {out} (episodes.jsonl, trajectories.jsonl.gz, summary.json, results.md"
              f"{''.join(', ' + p.name for p in plots)})")
        print(next_steps(args, out))
    return summary


def next_steps(args: argparse.Namespace, out: Path) -> str:
    """What to do after a run: look at it, and (for the embedded model) where real numbers come from."""
    lines = ["next:", f"  python -m eval.view {out} --out {out}/site   # then open {out}/site/index.html in a browser"]
    if args.agent in ("llm", "crl") and args.model is None:
        lines.append("  the embedded 135M model is a pipeline check; for real numbers serve a larger model and add "
                     "--backend openai --model NAME --agent-arg base_url=http://HOST:PORT/v1")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error("--episodes must be at least 1")
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    if args.stream is not None and (args.stream < 1 or args.samples != 1):
        parser.error("--stream must be at least 1, and takes no --samples")
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if args.max_steps is not None and args.max_steps < 1:
        parser.error("--max-steps must be at least 1")
    if args.num_workers < 0:
        parser.error("--num-workers must be at least 0")
    if args.retry_errored and not args.resume:
        parser.error("--retry-errored needs --resume and the --out of the run to retry")
    if args.quiet:  # also the model-loading bars of transformers / huggingface_hub
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        if "transformers" in sys.modules:
            sys.modules["transformers"].utils.logging.disable_progress_bar()
    try:
        asyncio.run(run(args))
    except (TaskSetError, ValueError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except json.JSONDecodeError as e:
        parser.exit(1, f"{parser.prog}: error: corrupt results file: {e}\n")
    except KeyboardInterrupt:
        out = args.out
        kept = len(EpisodeLog(out / "episodes.jsonl").latest()) if out is not None else 0
        where = f" in {out}" if out is not None else ""
        print(f"\n{parser.prog}: interrupted; {kept} episode(s) recorded{where}. Run the same command with "
              "--resume to finish it.", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
