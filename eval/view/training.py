"""Training runs for the viewer: the learning curve and each held-out evaluation as a browsable run.

A run folder of ``python -m crl_agent.train`` (and of ``benchmarks/train_cpu.py``, one per mode and seed) holds
``config.json``, ``metrics.jsonl`` (a row per step), ``evals.jsonl`` (a row per held-out evaluation) and, since
the trainer keeps them, each evaluation's episodes under ``evals/step-NNNN/{without,with}_experience/``
(:mod:`crl_agent.train_evals`). :func:`load_training` reads it: the curve's numbers for the chart, and one
:class:`~eval.view.data.RunData` per evaluation folder, so the episode list, the episode page and Compare (step 0
against step 32 on the same held-out seed) work on them as on any eval run. A run still training, or killed,
opens with what it has.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.view.data import RunData, jsonable, load_run_data, slug

# metrics.jsonl columns the chart draws (the rest of a row stays in the file and TensorBoard)
METRIC_KEYS = ("train_success", "train_success_without_experience", "train_success_with_experience",
               "rollout/policy_entropy", "actor/entropy", "actor/approx_kl", "actor/kl_ref", "extractor/updated",
               "extractor/updates",
               "extractor/meta_reward", "extractor/valid_rate", "bank_entries", "time_s")
EVAL_KEYS = ("step", "success", "success_se", "with_experience", "with_experience_se", "errored", "mean_actions",
             "train_time_s", "eval_time_s")
CONFIG_KEYS = ("mode", "tasks", "seed", "steps", "groups", "group_size", "eval_every", "eval_episodes", "eval_seed",
               "lr", "explore", "model")
_EVAL_DIR = re.compile(r"step-(\d+)")
_HALVES = {"without_experience": False, "with_experience": True}


def is_training_run(path: Path) -> bool:
    """Whether ``path`` is a trainer's run folder (its ``config.json`` beside metrics, evaluations or both)."""
    return (path / "config.json").is_file() and any(
        (path / name).exists() for name in ("metrics.jsonl", "evals.jsonl", "evals"))


@dataclass
class TrainingData:
    """One training run for the page: its config, curve rows and the ids of its evaluation runs."""

    id: str
    label: str
    folder: str
    config: dict[str, Any]
    evals: list[dict[str, Any]]
    metrics: list[dict[str, Any]]
    runs: list[dict[str, Any]] = field(default_factory=list)  # {"step", "with_experience", "run": run id}
    status: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def manifest(self) -> dict[str, Any]:
        return jsonable({"id": self.id, "label": self.label, "folder": self.folder, "config": self.config,
                         "evals": self.evals, "metrics": self.metrics, "runs": self.runs, "status": self.status,
                         "warnings": self.warnings})


def _jsonl(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    """The JSON object lines of ``path``; a torn line (a kill mid-write) is named and skipped."""
    if not path.is_file():
        return []
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            problems.append(f"{path}:{n}: not valid JSON (a torn or corrupt line); skipped")
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def eval_folders(path: Path) -> list[tuple[int, bool, Path]]:
    """The evaluation folders a training run holds: (step, with experience, folder), by step."""
    out = []
    for step_dir in sorted((path / "evals").glob("step-*")) if (path / "evals").is_dir() else []:
        m = _EVAL_DIR.fullmatch(step_dir.name)
        if not (m and step_dir.is_dir()):
            continue
        out += [(int(m.group(1)), _HALVES[half.name], half) for half in sorted(step_dir.iterdir())
                if half.name in _HALVES and half.is_dir()]
    return sorted(out, key=lambda x: (x[0], x[1]))


def load_training(path: Path, training_id: str, used: set[str]) -> tuple[TrainingData, list[RunData]]:
    """Read a training run folder: its curve and one run per evaluation folder (ids unique within ``used``).

    Raises:
        ValueError: ``config.json`` is not a JSON object.
    """
    problems: list[str] = []
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path / 'config.json'}: not a trainer's config ({e})") from e
    if not isinstance(config, dict):
        raise ValueError(f"{path / 'config.json'}: not a trainer's config (not a JSON object)")
    evals = [{k: r[k] for k in EVAL_KEYS if k in r} for r in _jsonl(path / "evals.jsonl", problems)]
    metrics = []
    updates = 0.0
    for r in _jsonl(path / "metrics.jsonl", problems):
        row = {"step": r["step"], **{k: r[k] for k in METRIC_KEYS if isinstance(r.get(k), (int, float))}}
        if "extractor/updated" in row and "extractor/updates" not in row:  # older rows: the updates so far
            updates += row["extractor/updated"]
            row["extractor/updates"] = updates
        metrics.append(row)
    mode = str(config.get("mode", "?"))
    label = path.resolve().name or f"{mode} seed {config.get('seed', '?')}"
    data = TrainingData(id=training_id, label=label, folder=str(path), config={k: config[k] for k in CONFIG_KEYS
                                                                                 if k in config},
                        evals=evals, metrics=metrics, warnings=problems)
    runs: list[RunData] = []
    for step, with_exp, folder in eval_folders(path):
        half = "with" if with_exp else "without"
        base = slug(f"{training_id}-step-{step}" + (f"-{half}" if mode != "grpo" or with_exp else ""))
        run_id, n = base, 2
        while run_id in used:
            run_id, n = f"{base}-{n}", n + 1
        used.add(run_id)
        name = f"{label} · step {step}" + (f" · {half} experience" if mode != "grpo" or with_exp else "")
        try:
            run = load_run_data(folder, run_id, name)
        except (FileNotFoundError, ValueError) as e:
            problems.append(f"skipped {folder}: {e}")
            continue
        run.meta["training"] = training_id
        runs.append(run)
        data.runs.append({"step": step, "with_experience": with_exp, "run": run_id})
    done = metrics[-1]["step"] if metrics else 0
    planned = config.get("steps") if isinstance(config.get("steps"), int) else None
    curve = path / "curve.png"
    finished = curve.exists() and all(not (path / f).exists() or (path / f).stat().st_mtime <= curve.stat().st_mtime
                                      for f in ("metrics.jsonl", "evals.jsonl"))
    data.status = {"steps_done": done, "steps_planned": planned, "finished": finished,
                   "evaluations": len(evals), "evaluation_folders": len(data.runs)}
    return data, runs
