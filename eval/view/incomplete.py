"""Runs without a ``summary.json``: a summary tallied from what is on disk, so they open all the same.

``eval.run`` writes ``summary.json`` last, so a run that is still going, or was killed (977 episodes on disk),
has only ``episodes.jsonl`` and ``trajectories.jsonl.gz``. A trainer's held-out evaluation folder
(:mod:`crl_agent.train_evals`) has those plus ``eval.json``. This module tallies such a folder's episode
records into the fields of a summary the viewer shows (per-task success and progress with standard errors,
mean actions, tokens, errors, the macro average), marked ``incomplete`` with its counts, or, for a training
evaluation (which is written whole), with the ``train_eval`` facts of its ``eval.json``.

This is a tally for display, not ``eval.results.summarize``: no git SHA or creation time of the run is
known, and no env spec is looked up (the env ids need not be registered where the site is built).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from eval.trajectories import FILENAME as TRAJECTORIES

TRAIN_EVAL_META = "eval.json"  # crl_agent.train_evals.META_FILE (eval may not import the trainer's modules)


def has_episodes_on_disk(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds episodes of a run (finished or not): ``episodes.jsonl`` or trajectories."""
    return (run_dir / "episodes.jsonl").is_file() or (run_dir / TRAJECTORIES).is_file()


def _mean_se(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def _number(r: dict[str, Any], key: str) -> float:
    v = r.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0.0


def read_train_eval_meta(run_dir: Path) -> dict[str, Any] | None:
    """A training evaluation folder's ``eval.json`` (``None`` where there is none or it cannot be read)."""
    path = run_dir / TRAIN_EVAL_META
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("schema") == "crl-bench/train-eval" else None


def tally_summary(run_dir: Path, records: list[dict[str, Any]], agent: str) -> dict[str, Any]:
    """The summary fields the viewer shows, tallied from ``records`` (the latest record of each episode).

    ``agent`` names the agent where no record says (a trajectory record's ``agent``).
    """
    env_ids = list(dict.fromkeys(r["env_id"] for r in records))
    tasks: dict[str, Any] = {}
    for env_id in env_ids:
        recs = [r for r in records if r["env_id"] == env_id]
        success, success_se = _mean_se([float(bool(r.get("success"))) for r in recs])
        progress, progress_se = _mean_se([_number(r, "progress") for r in recs])
        tasks[env_id] = {
            "episodes": len(recs), "errored": sum(1 for r in recs if r.get("error")),
            "success": success, "success_se": success_se, "progress": progress, "progress_se": progress_se,
            "mean_actions": _mean_se([_number(r, "actions") for r in recs])[0],
            "mean_invalid_actions": _mean_se([_number(r, "invalid_actions") for r in recs])[0],
            "mean_tokens_in": _mean_se([_number(r, "tokens_in") for r in recs])[0],
            "mean_tokens_out": _mean_se([_number(r, "tokens_out") for r in recs])[0],
            "seeds": len({str(r.get("seed")) for r in recs}), "extra": {},
        }
    per = [t for t in tasks.values() if t["episodes"]]
    macro = {"success": sum(t["success"] for t in per) / len(per) if per else None,
             "success_se": math.sqrt(sum(t["success_se"] ** 2 for t in per)) / len(per) if per else None,
             "progress": sum(t["progress"] for t in per) / len(per) if per else None, "tasks": len(per)}
    config = next((r.get("run_config") for r in records if isinstance(r.get("run_config"), dict)), {})
    name = config.get("agent") if isinstance(config.get("agent"), str) else agent
    summary: dict[str, Any] = {
        "agent": {"name": name or "?", **({"options": config["agent_options"]}
                                          if isinstance(config.get("agent_options"), dict) else {})},
        "run": {"env_ids": env_ids, **({"seed": config["seed"]} if isinstance(config.get("seed"), int) else {})},
        "tasks": tasks, "macro": macro,
        "errors": [{"key": r.get("key"), "env_id": r["env_id"], "seed": r.get("seed"), "sample": r.get("sample", 0),
                    "error": (str(r["error"]).strip().splitlines() or ["error"])[0]} for r in records if r.get("error")],
    }
    meta = read_train_eval_meta(run_dir)
    if meta is not None:
        summary["train_eval"] = meta
    else:
        summary["incomplete"] = {"episodes": len(records), "tasks": len(env_ids)}
    return summary
