"""Success on the learning-ready MiniHack task, per agent, with and without the Objects part.

    python benchmarks/minihack_learnable.py [--agent random,oracle] [--episodes 64] [--seed 0]
        [--objects on,off] [--env crl/MiniHack-Room-Random-5x5-Short-v0] [--out DIR]
        [agent options as for python -m eval.run: --model M, --backend B, --agent-arg KEY=VALUE, ...]

Every agent plays the same seeds (``seed``, ``seed + 1``, ...) through ``eval.run``'s own
episode loop (:func:`eval.run.run_task`), so an ``llm`` agent is measured exactly as
``python -m eval.run --agent llm`` would measure it; the agent options after the known flags
go to every agent whose constructor takes them. ``--objects off`` builds the env with
``objects=False`` (the older observation: no Objects part, a legend of every symbol), which
``python -m eval.run`` cannot ask for. Prints success ± standard error and the mean number
of actions per episode; ``--out`` keeps each run's ``episodes.jsonl`` and a ``summary.json``.

The task (``crl/MiniHack-Room-Random-5x5-Short-v0``): a lit 5x5 room whose start and
staircase vary by seed (1-4 moves apart), 16 steps per episode.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*pkg_resources.*")

import crl_envs  # noqa: E402,F401
from crl_agent.agents import load_agent_class  # noqa: E402
from eval.results import EpisodeLog  # noqa: E402
from eval.run import agent_kwargs, build_parser, make_agent, run_task  # noqa: E402

ENV_ID = "crl/MiniHack-Room-Random-5x5-Short-v0"


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict]:
    """This script's flags, and the agent options (parsed by ``eval.run``'s own parser) from the rest."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", default="random,oracle", help="comma list of agents (as --agent of eval.run)")
    p.add_argument("--episodes", type=int, default=64, help="seeds per agent (default: 64)")
    p.add_argument("--seed", type=int, default=0, help="first seed (default: 0)")
    p.add_argument("--objects", default="on", help="comma list of on/off: with and/or without the Objects part")
    p.add_argument("--env", default=ENV_ID, help=f"env id (default: {ENV_ID})")
    p.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args, rest = p.parse_known_args(argv)
    modes = [m.strip() for m in args.objects.split(",") if m.strip()]
    if not modes or set(modes) - {"on", "off"}:
        p.error(f"--objects {args.objects!r}: use on, off or on,off")
    if args.episodes < 1:
        p.error("--episodes must be at least 1")
    args.objects = modes
    args.agent = [a.strip() for a in args.agent.split(",") if a.strip()]
    return args, agent_kwargs(build_parser().parse_args(rest))


def options_for(agent: str, options: dict) -> dict:
    """The agent options this agent's constructor takes (``random`` takes none of an LLM's)."""
    params = inspect.signature(load_agent_class(agent)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(options)
    return {k: v for k, v in options.items() if k in params}


async def measure(agent_name: str, options: dict, env_id: str, seeds: list[int], objects: bool,
                  out: Path) -> dict:
    """Play ``seeds`` with one agent; return success, its standard error and mean actions."""
    agent = make_agent(agent_name, seeds[0], options, run_dir=out)
    log = EpisodeLog(out / "episodes.jsonl")
    try:
        records = await run_task(env_id, agent, seeds, log, concurrency=1, quiet=True,
                                 make_kwargs={"objects": objects})
    finally:
        await agent.aclose()
    errors = [r for r in records if r.get("error")]
    if errors:
        raise RuntimeError(f"{agent_name}: {len(errors)} episodes errored, e.g. {errors[0]['error']}")
    wins = [float(r["success"]) for r in records]
    p = sum(wins) / len(wins)
    return {"agent": agent_name, "objects": objects, "episodes": len(wins), "success": p,
            "success_se": math.sqrt(p * (1 - p) / len(wins)),
            "mean_actions": sum(r["actions"] for r in records) / len(records)}


def main(argv: list[str] | None = None) -> int:
    args, options = parse(argv)
    seeds = [args.seed + i for i in range(args.episodes)]
    root = args.out or Path(tempfile.mkdtemp(prefix="minihack_learnable_"))
    rows = []
    print(f"{args.env}: {len(seeds)} seeds from {args.seed}")
    print(f"{'agent':<12}{'objects':>8}{'success':>16}{'actions/episode':>17}")
    for agent in args.agent:
        taken = options_for(agent, options)
        if set(options) - set(taken):
            print(f"  ({agent} does not take {', '.join(sorted(set(options) - set(taken)))}: left out)")
        for mode in args.objects:
            row = asyncio.run(measure(agent, taken, args.env, seeds, mode == "on",
                                      root / f"{agent.replace(':', '_')}-objects-{mode}"))
            rows.append(row)
            success = f"{100 * row['success']:.1f} ± {100 * row['success_se']:.1f}%"
            print(f"{agent:<12}{mode:>8}{success:>16}{row['mean_actions']:>17.1f}")
    if args.out:
        summary = {"env_id": args.env, "seeds": seeds, "agent_options": options, "results": rows}
        (root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
