"""Valid-operation rate of the 135M extractor's distillations, free against schema-constrained, in one run.

Trajectories are real MiniHack episodes (``crl/MiniHack-Room-Random-5x5-v0`` and
``crl/MiniHack-MazeWalk-9x9-v0``, seeds 0..n-1), played by a policy that takes the env's oracle
action with probability 0.4 and a random admissible action otherwise (so some are won and some lost),
at most ``--max-steps`` steps. Each trajectory is shown with two bank entries as earlier guidance (so
``update`` is a legal op), then distilled by the packaged SmolLM2-135M through the transformers backend
with the manager's default ``distil_params`` (512 tokens, temperature 0.7, seeded per trajectory): once
free (``json_schema=None``, as before) and once with :func:`crl_agent.experience.extractor.distil_schema`.

Reported per mode, as ``crl_agent.train`` counts them: valid operations (what :func:`parse_distil`
returns) and errors (what it reports), the valid-operation rate ``valid / (valid + errors)``, the share of
replies that are strict JSON, and the time and tokens per call (one call at a time, the two modes
taking turns to go first, the prefix cache emptied before each call so both pay the same prefill).
``ms_per_token`` is a call's whole time, prefill included, over its generated tokens: shorter
constrained replies spread the same prefill over fewer tokens, so it is not the mask's cost (under
1 ms a token, against tens of ms for a decoding step).

Run: ``python benchmarks/extractor_schema.py`` (about 40 minutes on 2 busy cores); writes
``benchmarks/results/extractor_schema.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym  # noqa: E402

import crl_envs  # noqa: E402, F401 - registers crl/* ids
from crl_agent.experience import extractor as ex  # noqa: E402
from crl_agent.experience.bank import ExperienceEntry  # noqa: E402
from crl_agent.experience.manager import ManagerConfig  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402

ENVS = ("crl/MiniHack-Room-Random-5x5-v0", "crl/MiniHack-MazeWalk-9x9-v0")
SHOWN = [
    ExperienceEntry(4, "", "Stairs first", "If the stairs are visible, then walk straight to them.", 0, 0),
    ExperienceEntry(9, "", "Walls", "If a move is blocked by a wall, then try a different direction.", 0, 0),
]


def play(env_id: str, seed: int, max_steps: int, p_oracle: float = 0.4) -> ex.Trajectory:
    env = gym.make(env_id)
    rng = random.Random(seed)
    obs, info = env.reset(seed=seed)
    steps, success, progress, final = [], False, 0.0, ""
    for _ in range(max_steps):
        actions = info.get("admissible_actions") or ["north", "south", "east", "west"]
        action = env.unwrapped.oracle_action() if rng.random() < p_oracle else rng.choice(actions)
        next_obs, _, terminated, truncated, info = env.step(action)
        steps.append((obs, action))
        obs, final = next_obs, next_obs
        success, progress = bool(info.get("success")), float(info.get("progress", 0.0))
        if terminated or truncated:
            break
    env.close()
    task = env_id
    shown = [dataclasses.replace(e, task=task) for e in SHOWN]
    return ex.Trajectory(f"{env_id}#{seed}", task, info.get("task") or "", steps, success=success,
                         progress=progress, retrieved=shown, final_observation=final)


async def distil_one(llm: TransformersLLM, traj: ex.Trajectory, seed: int, constrained: bool) -> dict:
    valid_ids = {e.id for e in traj.retrieved}
    base = ManagerConfig().distil_params
    params = dataclasses.replace(base, seed=seed, json_schema=ex.distil_schema(valid_ids) if constrained else None)
    messages = ex.distil_messages(traj, ManagerConfig().max_trajectory_chars)
    llm.prefix_cache.clear()  # every call pays the same prefill, whichever mode ran this trajectory first
    t0 = time.perf_counter()
    c = await llm.chat(messages, params)
    seconds = time.perf_counter() - t0
    ops, errors = ex.parse_distil(c.text, valid_ids)
    try:
        json.loads(c.text)
        strict = True
    except ValueError:
        strict = False
    print(f"  {'schema' if constrained else 'free  '} {traj.id}: {len(ops)} ops, {len(errors)} errors, "
          f"{c.completion_tokens} tokens, {seconds:.1f}s", flush=True)
    return {"trajectory": traj.id, "success": traj.success, "seconds": round(seconds, 3),
            "prompt_tokens": c.prompt_tokens, "tokens": c.completion_tokens, "finish": c.finish_reason,
            "ops": [op.kind for op in ops], "errors": errors, "strict_json": strict, "text": c.text[:600]}


def summary(rows: list[dict]) -> dict:
    valid = sum(len(r["ops"]) for r in rows)
    bad = sum(len(r["errors"]) for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    return {
        "calls": len(rows), "valid_ops": valid, "malformed": bad,
        "valid_operation_rate": valid / (valid + bad) if valid + bad else None,
        "calls_without_errors": sum(not r["errors"] for r in rows),
        "strict_json_replies": sum(r["strict_json"] for r in rows),
        "op_kinds": {k: sum(r["ops"].count(k) for r in rows) for k in ("add", "update", "none")},
        "seconds_per_call_mean": seconds / len(rows),
        "seconds_per_call_median": statistics.median(r["seconds"] for r in rows),
        "tokens_per_call_mean": tokens / len(rows),
        "ms_per_token": 1000 * seconds / max(1, tokens),
        "hit_token_cap": sum(r["finish"] == "length" for r in rows),
        "calls_detail": rows,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=12, help="episodes, split over the two envs")
    ap.add_argument("--max-steps", type=int, default=15, help="steps per episode at most")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "extractor_schema.json"))
    args = ap.parse_args()
    trajs = [play(ENVS[i % len(ENVS)], i // len(ENVS), args.max_steps) for i in range(args.trajectories)]
    print(f"{len(trajs)} trajectories, {sum(t.success for t in trajs)} won", flush=True)
    llm = TransformersLLM(None, num_threads=args.threads)
    rows: dict[str, list[dict]] = {"free": [], "schema": []}
    for i, traj in enumerate(trajs):  # the two modes alternate, so a change in machine load hits both alike
        for constrained in ((False, True) if (i // len(ENVS)) % 2 == 0 else (True, False)):
            rows["schema" if constrained else "free"].append(await distil_one(llm, traj, i, constrained))
    await llm.aclose()
    results = {name: summary(r) for name, r in rows.items()}
    free, schema = results["free"], results["schema"]
    out = {
        "schema_version": 1,
        "benchmark": "extractor_schema",
        "model": llm.model_name, "dtype": llm.dtype, "threads": args.threads,
        "envs": list(ENVS), "trajectories": len(trajs), "won": sum(t.success for t in trajs),
        "distil_params": dataclasses.asdict(ManagerConfig().distil_params),
        "valid_operation_rate": {"free": free["valid_operation_rate"], "schema": schema["valid_operation_rate"]},
        "seconds_per_call_ratio_schema_over_free": schema["seconds_per_call_mean"] / free["seconds_per_call_mean"],
        "ms_per_token_ratio_schema_over_free": schema["ms_per_token"] / free["ms_per_token"],
        "free": free, "schema": schema,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for name, r in results.items():
        print(f"{name:6}: valid-operation rate {r['valid_operation_rate']:.2f} ({r['valid_ops']} valid, "
              f"{r['malformed']} errors), strict JSON {r['strict_json_replies']}/{r['calls']}, "
              f"{r['seconds_per_call_mean']:.1f}s and {r['tokens_per_call_mean']:.0f} tokens per call, "
              f"{r['ms_per_token']:.0f} ms/token")
    print(f"time per call schema/free: {out['seconds_per_call_ratio_schema_over_free']:.2f}x; "
          f"per token: {out['ms_per_token_ratio_schema_over_free']:.2f}x -> {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
