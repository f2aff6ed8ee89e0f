"""Run folders for the viewer's tests and benchmark, in the exact on-disk formats of eval.run.

``episodes.jsonl`` (one summary line per episode), ``summary.json`` (schema 1.2) and
``trajectories.jsonl.gz`` (trajectory schema 1.0: gzip, one member per episode line). Sokoban episodes are
played for real (a seeded random policy, or the env's own oracle); LLM turns and hostile strings are made up.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path
from typing import Any

from crl_agent.rollout import episode_key
from eval.results import mean_se

SOKOBAN = "crl/Sokoban-6x6-2-v0"

# Strings that would run code if any page ever put them into HTML or a URL.
HOSTILE = [
    "<script>window.__pwned = 'script'</script>",
    '<img src=x onerror="window.__pwned = \'img\'">',
    "</script><script>window.__pwned = 'close'</script>",
    '<a href="javascript:window.__pwned=\'link\'">click me</a>',
    "javascript:window.__pwned='url'",
    "<svg onload=\"window.__pwned='svg'\"></svg> &amp; &lt;b&gt;",
    "line\u2028separator\u2029and \"quotes\" 'single' `back` \\ backslash",
]
BIG_LINE = "X" * 1_000_000  # a 1 MB line in one observation


def _summary_of(traj: dict[str, Any]) -> dict[str, Any]:
    return traj["summary"]


def play_sokoban(seed: int, policy: str, max_steps: int = 30, env_id: str = SOKOBAN, agent: str | None = None,
                 rng_seed: int = 0) -> dict[str, Any]:
    """One real Sokoban episode as a trajectory record (``policy`` is ``random`` or ``oracle``)."""
    import gymnasium as gym

    import crl_envs  # noqa: F401 - registers crl/*

    env = gym.make(env_id, max_episode_steps=max_steps)
    rng = random.Random(rng_seed * 1_000_003 + seed)
    obs, info = env.reset(seed=seed)
    task = info.get("task", "")
    steps: list[dict[str, Any]] = []
    total = 0.0
    term = trunc = False
    while not (term or trunc):
        adm = list(info.get("admissible_actions") or [])
        action = env.unwrapped.oracle_action() if policy == "oracle" else rng.choice(adm)
        new_obs, reward, term, trunc, new_info = env.step(action)
        total += float(reward)
        steps.append({
            "t": len(steps), "observation": obs, "admissible_actions": adm, "action": action, "reward": float(reward),
            "valid_action": bool(new_info.get("valid_action", True)), "terminated": bool(term),
            "truncated": bool(trunc), "success": bool(new_info.get("success")),
            "progress": float(new_info.get("progress", 0.0)),
            "info": {k: v for k, v in new_info.items() if k not in ("admissible_actions",)
                     and isinstance(v, (str, int, float, bool))},
            "turn": None,
        })
        obs, info = new_obs, new_info
    env.close()
    last = steps[-1] if steps else {}
    return _record(env_id, seed, agent or policy, task, steps, obs, {
        "success": bool(last.get("success")), "progress": float(last.get("progress", 0.0)), "reward": total,
        "actions": len(steps), "invalid_actions": sum(not s["valid_action"] for s in steps), "terminated": bool(term),
        "truncated": bool(trunc), "wall_time_s": 0.01, "error": None, "tokens_in": 0, "tokens_out": 0, "extra": {}})


def _record(env_id: str, seed: int, agent: str, task: str, steps: list[dict[str, Any]], final: str,
            summary: dict[str, Any], sample: int = 0, mode: str = "text") -> dict[str, Any]:
    return {"schema": "crl-bench/trajectory", "schema_version": "1.0", "mode": mode,
            "key": f"{env_id}#{seed}#{sample}", "env_id": env_id, "seed": seed, "sample": sample, "agent": agent,
            "task": task, "summary": summary, "steps": steps, "final_observation": final}


def llm_turn(step: int, obs: str, action: str, options: list[str], extra_text: str = "") -> dict[str, Any]:
    """A scored LLM turn with messages, candidates, experience entries and a search."""
    weights = [math.exp(-abs(i - step % len(options))) for i in range(len(options))]
    z = sum(weights)
    cands = [{"text": o, "logprob": math.log(w / z), "prob": w / z} for o, w in zip(options, weights, strict=True)]
    return {
        "messages": [{"role": "system", "content": "You are playing a text game. " + extra_text},
                     {"role": "user", "content": obs}],
        "reply": f"I think I should go {action}. " + extra_text,
        "method": "score", "policy_version": 3,
        "candidates": cands, "chosen": options.index(action) if action in options else 0,
        "experience_shown": [{"id": 7, "title": "Push boxes away from corners " + extra_text,
                              "content": "A box in a corner can never move again. " + extra_text}],
        "searches": [{"question": "where is the nearest target? " + extra_text, "answer": "two rows down. " + extra_text}],
    }


def llm_run_records(seeds: range, env_id: str = SOKOBAN, max_steps: int = 8) -> list[dict[str, Any]]:
    """Real Sokoban episodes whose steps carry made-up LLM turns (the llm agent's trace)."""
    recs = []
    for seed in seeds:
        rec = play_sokoban(seed, "random", max_steps=max_steps, env_id=env_id, agent="llm", rng_seed=1)
        for s in rec["steps"]:
            s["turn"] = llm_turn(s["t"], s["observation"], s["action"], s["admissible_actions"])
        rec["summary"].update(tokens_in=300 * len(rec["steps"]), tokens_out=8 * len(rec["steps"]),
                              extra={"search_time_s": 0.02})
        recs.append(rec)
    return recs


def hostile_records(env_id: str = SOKOBAN, seeds: range = range(2)) -> list[dict[str, Any]]:
    """Episodes whose every text field holds markup, script and a 1 MB line."""
    recs = []
    for seed in seeds:
        steps = []
        for t, h in enumerate(HOSTILE):
            obs = f"step {t}: {h}" + ("\n" + BIG_LINE if t == 1 and seed == 0 else "")
            steps.append({"t": t, "observation": obs, "admissible_actions": [h, "up"], "action": h, "reward": 0.0,
                          "valid_action": t % 2 == 0, "terminated": False, "truncated": t == len(HOSTILE) - 1,
                          "success": False, "progress": 0.0, "info": {"note": h, "__proto__": {"polluted": "yes"}},
                          "turn": llm_turn(t, obs, h, [h, "up", "down"], extra_text=h)})
        recs.append(_record(env_id, seed, "llm", HOSTILE[0], steps, HOSTILE[2], {
            "success": False, "progress": 0.0, "reward": 0.0, "actions": len(steps), "invalid_actions": 3,
            "terminated": False, "truncated": True, "wall_time_s": 0.5, "error": HOSTILE[1] if seed == 1 else None,
            "tokens_in": 10, "tokens_out": 5, "extra": {}}, mode="full"))
    return recs


def write_run(folder: Path, records: list[dict[str, Any]], agent: dict[str, Any], trajectories: bool = True,
              seed: int = 0) -> Path:
    """Write ``records`` (trajectory records) as an eval.run folder; ``trajectories=False`` is an older run."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "episodes.jsonl").open("w", encoding="utf-8") as f:
        for r in records:
            line = {"env_id": r["env_id"], "seed": r["seed"], **r["summary"], "sample": r["sample"],
                    "key": episode_key(r["env_id"], r["seed"], r["sample"])}
            f.write(json.dumps(line) + "\n")
    if trajectories:
        with (folder / "trajectories.jsonl.gz").open("wb") as f:
            for r in records:  # one gzip member per episode, as the run appends them
                f.write(gzip.compress((json.dumps(r) + "\n").encode("utf-8")))
    env_ids = list(dict.fromkeys(r["env_id"] for r in records))
    tasks = {}
    for e in env_ids:
        rs = [r["summary"] for r in records if r["env_id"] == e]
        succ, succ_se = mean_se([float(r["success"]) for r in rs])
        prog, prog_se = mean_se([float(r["progress"]) for r in rs])
        tasks[e] = {"version": 0, "entry_point": "x", "kwargs": {}, "max_episode_steps": 100, "episodes": len(rs),
                    "errored": sum(1 for r in rs if r["error"]), "success": succ, "success_se": succ_se,
                    "progress": prog, "progress_se": prog_se,
                    "mean_actions": mean_se([float(r["actions"]) for r in rs])[0],
                    "mean_invalid_actions": mean_se([float(r["invalid_actions"]) for r in rs])[0],
                    "mean_wall_time_s": 0.01, "mean_tokens_in": mean_se([float(r["tokens_in"]) for r in rs])[0],
                    "mean_tokens_out": mean_se([float(r["tokens_out"]) for r in rs])[0],
                    "extra": {"search_time_s": 0.02} if agent.get("name") == "llm" else {}}
    per = list(tasks.values())
    seeds = sorted({r["seed"] for r in records})
    summary = {
        "schema_version": "1.2", "package_version": "0.1.0", "git_sha": None, "created": "2026-12-03T12:00:00Z",
        "python": "3.11", "agent": agent,
        "run": {"tasks": ",".join(env_ids), "env_ids": env_ids, "episodes": len(seeds), "seed": seed,
                "samples": 1 + max(r["sample"] for r in records), "trajectories": "text" if trajectories else "none"},
        "tasks": tasks,
        "macro": {"success": sum(t["success"] for t in per) / len(per),
                  "success_se": math.sqrt(sum(t["success_se"] ** 2 for t in per)) / len(per),
                  "progress": sum(t["progress"] for t in per) / len(per), "tasks": len(per)},
        "errors": [{"key": episode_key(r["env_id"], r["seed"], r["sample"]), "env_id": r["env_id"], "seed": r["seed"],
                    "sample": r["sample"], "error": str(r["summary"]["error"]).splitlines()[0]} for r in records if r["summary"]["error"]],
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return folder


def sokoban_runs(root: Path, episodes: int = 5) -> tuple[Path, Path]:
    """A random run and an oracle run on the same Sokoban seeds."""
    rand = write_run(root / "random", [play_sokoban(s, "random") for s in range(episodes)], {"name": "random"})
    orac = write_run(root / "oracle", [play_sokoban(s, "oracle") for s in range(episodes)], {"name": "oracle"})
    return rand, orac


def big_run(folder: Path, episodes: int = 5000, steps: int = 30, tasks: int = 5) -> Path:
    """A synthetic run of ``episodes`` x ``steps`` Sokoban-sized steps (for the speed benchmark)."""
    rng = random.Random(0)
    board = "Goal: Push all 2 boxes onto the targets.\n######\n#__###\n#____#\n#.#$_#\n#._$@#\n######\n" \
            "Legend: # wall, _ floor, . target, $ box, * box on a target, @ you, + you on a target\n"
    moves = ["up", "down", "left", "right"]
    recs = []
    for i in range(episodes):
        env_id = "crl/Sokoban-6x6-2-v0" if i % tasks == 0 else f"crl/Synthetic{i % tasks}-v0"
        n = steps
        st = [{"t": t, "observation": board + f"Boxes on targets: {t % 3}/2. Episode {i} step {t} token{rng.random():.6f}.\n"
               "Actions: up, down, left, right", "admissible_actions": moves, "action": rng.choice(moves),
               "reward": 0.0, "valid_action": True, "terminated": t == n - 1, "truncated": False, "success": False,
               "progress": t / n, "info": {}, "turn": None} for t in range(n)]
        ok = rng.random() < 0.3
        recs.append(_record(env_id, i // tasks, "random", "Push all 2 boxes onto the targets.", st, board, {
            "success": ok, "progress": 1.0 if ok else 0.5, "reward": 1.0 if ok else 0.0, "actions": n,
            "invalid_actions": 0, "terminated": True, "truncated": False, "wall_time_s": 0.01, "error": None,
            "tokens_in": 0, "tokens_out": 0, "extra": {}}))
    return write_run(folder, recs, {"name": "random"})
