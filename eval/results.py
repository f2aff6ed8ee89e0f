"""Run results: ``episodes.jsonl`` (one record per episode), ``trajectories.jsonl.gz`` and ``summary.json``.

``summary.json`` carries ``schema_version``; bump it when a field changes meaning.

Schema history:

- 1.1: tokens, numeric agent extras per task, the list of errored episodes.
- 1.2: several samples per seed. Episode records carry ``sample`` and keys are ``env_id#seed#sample``
  (1.1 records, keyed ``env_id#seed``, read as sample 0); ``run`` gains ``samples`` and
  ``trajectories``; each task gains ``samples`` and, when samples > 1, ``pass_at_k`` (the unbiased
  pass@k estimate over seeds, for k = 1, 2, 4, ... and k = samples) and ``seeds``.
- 1.3: the experience track (``eval.run --stream N``, :mod:`eval.stream`). A stream run's summary gains
  ``stream`` (per task the success curves over the stream with and without memory, per world the same,
  and ``experience_gain`` ± ``experience_gain_se``) and ``run.stream``; its ``tasks`` count the
  with-memory episodes only. Its episode records carry ``memory``, ``world`` and ``stream_index``, the
  without-memory pass keyed as sample 1. Migration: nothing to do; 1.2 (and older) summaries have no
  ``stream`` and read as before, and readers treat a missing ``stream`` as "not a stream run".
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from crl_agent.episode import Episode, episode_key

SCHEMA_VERSION = "1.3"
READABLE_SCHEMAS = ("1.0", "1.1", "1.2", "1.3")


def git_sha() -> str | None:
    """The checkout's commit, or ``None`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def json_default(obj: Any) -> Any:
    """JSON for what ``json`` cannot write: numpy scalars as numbers, anything else as its ``str``."""
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            value = item()
        except (TypeError, ValueError):
            value = None
        if isinstance(value, (bool, int, float, str)):
            return value
    return str(obj)


def record_key(record: dict[str, Any]) -> str:
    """The ``env_id#seed#sample`` key of an episodes.jsonl record (schema 1.1 records: sample 0)."""
    return episode_key(record["env_id"], record["seed"], record.get("sample", 0))


class EpisodeLog:
    """Append-only ``episodes.jsonl``; each line is flushed and fsynced, so a killed run loses nothing."""

    def __init__(self, path: Path):
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def load(self) -> list[dict[str, Any]]:
        """Every complete record; a torn last line (from a kill mid-write) is dropped."""
        return self.read()[0]

    def read(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Every complete record, and a warning naming the file and line of each line that is not one.

        A line that is not JSON (torn by a kill mid-write, or corrupted) or is JSON but not an episode
        record (an object with ``env_id`` and ``seed``) is skipped; readers that show a run say so.
        """
        if not self.path.exists():
            return [], []
        records, problems = [], []
        with self.path.open(encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    problems.append(f"{self.path}:{n}: not valid JSON (a torn or corrupt line); skipped")
                    continue
                records.append(record)
                if not (isinstance(record, dict) and "env_id" in record and "seed" in record):
                    problems.append(f"{self.path}:{n}: not an episode record (a JSON {type(record).__name__}, "
                                    "not an object with env_id and seed); skipped")
        return records, problems

    def latest(self) -> dict[str, dict[str, Any]]:
        """The newest complete record of each episode key (a replayed episode supersedes its errored record)."""
        out = {}
        for r in self.load():
            if isinstance(r, dict) and "env_id" in r and "seed" in r:
                r["key"] = record_key(r)
                out[r["key"]] = r
        return out

    def repair(self) -> None:
        """Rewrite the file without a torn last line, so new records start on a fresh line."""
        records = self.load()
        if self.path.exists() and not self.path.read_bytes().endswith(b"\n"):
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
            os.replace(tmp, self.path)

    def append(self, episode: Episode, **fields: Any) -> dict[str, Any]:
        """Record one episode synchronously (flushed and fsynced); returns the record as it reads back."""
        record, line = episode_record(episode, **fields)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        return record


def episode_record(episode: Episode, **fields: Any) -> tuple[dict[str, Any], str]:
    """An episode's ``episodes.jsonl`` record and its JSON line."""
    record = {**episode.summary(), **fields, "key": episode.key}
    line = json.dumps(record, default=json_default)  # an agent's non-JSON extra must not lose the episode
    return json.loads(line), line


def mean_se(xs: list[float]) -> tuple[float, float]:
    """The mean of ``xs`` and its standard error (NaN for none; 0 for one)."""
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var / len(xs))


def _extra_means(recs: list[dict[str, Any]]) -> dict[str, float]:
    """Means of the numeric fields agents report in ``EpisodeResult.extra`` (e.g. ``search_time_s``)."""
    sums: dict[str, list[float]] = {}
    for r in recs:
        for k, v in (r.get("extra") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                sums.setdefault(k, []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sorted(sums.items())}


def pass_at_k(records: list[dict[str, Any]], samples: int) -> dict[str, float]:
    """Unbiased pass@k over seeds (Chen et al. 2021): ``1 - C(n-c, k) / C(n, k)`` averaged over seeds.

    ``n`` is a seed's recorded samples and ``c`` its successes; seeds with fewer than ``k`` samples
    are left out of that ``k``. Reported for k = 1, 2, 4, ... below ``samples``, and ``samples``.
    """
    by_seed: dict[int, list[bool]] = {}
    for r in records:
        by_seed.setdefault(r["seed"], []).append(bool(r["success"]))
    ks = sorted({k for k in (2 ** i for i in range(samples.bit_length())) if k < samples} | {samples})
    out = {}
    for k in ks:
        vals = [1.0 - (math.comb(len(v) - sum(v), k) / math.comb(len(v), k)) for v in by_seed.values() if len(v) >= k]
        if vals:
            out[str(k)] = sum(vals) / len(vals)
    return out


def env_metadata(env_id: str) -> dict[str, Any]:
    spec = gym.spec(env_id)
    return {
        "version": spec.version,
        "entry_point": spec.entry_point if isinstance(spec.entry_point, str) else repr(spec.entry_point),
        "kwargs": spec.kwargs,
        "max_episode_steps": spec.max_episode_steps,
    }


def summarize(
    records: list[dict[str, Any]],
    env_ids: list[str],
    agent_config: dict[str, Any],
    run_config: dict[str, Any],
) -> dict[str, Any]:
    """Build ``summary.json`` from episode records.

    Errored episodes count as failures in the success rate and are reported separately.
    """
    import crl_envs

    tasks: dict[str, Any] = {}
    caps = run_config.get("max_episode_steps") or {}
    samples = int(run_config.get("samples") or 1)
    for env_id in env_ids:
        recs = [r for r in records if r["env_id"] == env_id]
        success, success_se = mean_se([float(r["success"]) for r in recs])
        progress, progress_se = mean_se([float(r["progress"]) for r in recs])
        actions, _ = mean_se([float(r["actions"]) for r in recs])
        tasks[env_id] = {
            **env_metadata(env_id),
            **({"max_episode_steps": caps[env_id]} if env_id in caps else {}),
            "episodes": len(recs),
            "errored": sum(1 for r in recs if r.get("error")),
            "success": success,
            "success_se": success_se,
            "progress": progress,
            "progress_se": progress_se,
            "mean_actions": actions,
            "mean_invalid_actions": mean_se([float(r["invalid_actions"]) for r in recs])[0],
            "mean_wall_time_s": mean_se([float(r["wall_time_s"]) for r in recs])[0],
            "mean_tokens_in": mean_se([float(r.get("tokens_in", 0)) for r in recs])[0],
            "mean_tokens_out": mean_se([float(r.get("tokens_out", 0)) for r in recs])[0],
            "extra": _extra_means(recs),
            "samples": samples,
            "seeds": len({r["seed"] for r in recs}),
        }
        if samples > 1:
            tasks[env_id]["pass_at_k"] = pass_at_k(recs, samples)
    per_task = [t for t in tasks.values() if t["episodes"]]
    macro_success = sum(t["success"] for t in per_task) / len(per_task) if per_task else float("nan")
    # The macro average's standard error, treating tasks as independent.
    macro_se = math.sqrt(sum(t["success_se"] ** 2 for t in per_task)) / len(per_task) if per_task else float("nan")
    errors = [
        {"key": r["key"], "env_id": r["env_id"], "seed": r["seed"], "sample": r.get("sample", 0), "error": str(r["error"]).strip().splitlines()[0]}
        for r in records if r.get("error")
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "package_version": crl_envs.__version__,
        "git_sha": git_sha(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "agent": agent_config,
        "run": run_config,
        "tasks": tasks,
        "macro": {
            "success": macro_success,
            "success_se": macro_se,
            "progress": sum(t["progress"] for t in per_task) / len(per_task) if per_task else float("nan"),
            "tasks": len(per_task),
        },
        "errors": errors,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically, so a kill never leaves half a summary.

    Values JSON cannot hold (a ``Path`` in an agent's config, a callable in a plugin's spec kwargs) are
    written as numbers (numpy scalars) or as their ``str``, so a finished run never fails at its last step.
    """
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=True, default=json_default) + "\n", encoding="utf-8")
    os.replace(tmp, path)
