"""Readable views of runs: a terminal table, a markdown table and PNG plots.

Compare several runs (one per agent) on one set of plots::

    python -m eval.report runs/random runs/oracle runs/llm --out runs/compare

It writes ``success.png`` (success per task with standard-error bars, one bar per run) and
``actions.png`` (actions per episode per task), plus ``results.md`` with one table per run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from eval.fmt import pct
from eval.results import EpisodeLog, episode_key, record_key

HEADER = ["task", "episodes", "success % ± SE", "progress %", "mean actions", "tokens in/out", "errored"]


def _tokens(t: dict[str, Any]) -> str:
    tin, tout = t.get("mean_tokens_in", 0.0), t.get("mean_tokens_out", 0.0)
    return f"{tin:.0f} / {tout:.0f}" if (tin or tout) else "–"


def rows(summary: dict[str, Any]) -> list[list[str]]:
    out = []
    for env_id, t in summary["tasks"].items():
        out.append(
            [
                env_id,
                str(t["episodes"]),
                f"{pct(t['success'])} ± {pct(t['success_se'])}",
                f"{pct(t['progress'])}",
                f"{t['mean_actions']:.1f}" if t["episodes"] else "n/a",
                _tokens(t),
                str(t["errored"]),
            ]
        )
    m = summary["macro"]
    out.append(["macro average", "", f"{pct(m['success'])} ± {pct(m['success_se'])}", pct(m["progress"]), "", "",
                ""])
    return out


def agent_label(summary: dict[str, Any]) -> str:
    agent = summary["agent"]
    llm = agent.get("llm")  # the llm and crl agents describe their backend under "llm"
    model = agent.get("model") or (llm.get("model") if isinstance(llm, dict) else None)
    return f"{agent.get('name', '?')} ({model})" if model else str(agent.get("name", "?"))


def markdown_table(summary: dict[str, Any], label: str | None = None) -> str:
    lines = [
        f"# Results: agent `{label or agent_label(summary)}`",
        "",
        f"schema {summary['schema_version']}, crl-bench {summary['package_version']}, git {summary['git_sha'] or 'n/a'}",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---" for _ in HEADER) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(summary)]
    extras = {e: t["extra"] for e, t in summary["tasks"].items() if t.get("extra")}
    if extras:
        lines += ["", "Agent metrics (mean per episode):", ""]
        lines += [f"- `{e}`: " + ", ".join(f"{k} {v:.3g}" for k, v in x.items()) for e, x in extras.items()]
    errors = summary.get("errors") or []
    if errors:
        lines += ["", f"## Errored episodes ({len(errors)})", "", "Errored episodes count as failures.", ""]
        lines += [f"- `{e['key']}`: {e['error']}" for e in errors]
    return "\n".join(lines) + "\n"


def print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"agent: {agent_label(summary)}")
    for h in HEADER:
        table.add_column(h)
    for r in rows(summary):
        table.add_row(*r)
    # Rich assumes 80 columns when output is not a terminal (CI logs, pipes), which folds every row.
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def print_errors(summary: dict[str, Any], limit: int = 10) -> None:
    """List errored episodes (they count as failures) so none goes unnoticed."""
    errors = summary.get("errors") or []
    if not errors:
        return
    print(f"{len(errors)} errored episodes (counted as failures; details in episodes.jsonl):")
    for e in errors[:limit]:
        print(f"  {e['key']}: {e['error']}")
    if len(errors) > limit:
        print(f"  ... and {len(errors) - limit} more (see results.md)")


def _short(env_id: str) -> str:
    return env_id.removeprefix("crl/").rsplit("-v", 1)[0]


def run_labels(summaries: list[dict[str, Any]], run_dirs: list[Path]) -> list[str]:
    """One legend label per run: the agent, plus the run folder where two runs share an agent label."""
    labels = [agent_label(s) for s in summaries]
    return [f"{lab} [{d.name or d}]" if labels.count(lab) > 1 else lab for lab, d in zip(labels, run_dirs, strict=True)]


def write_plots(
    summaries: list[dict[str, Any]],
    out: Path,
    records_by_run: list[list[dict[str, Any]]] | None = None,
    labels: list[str] | None = None,
) -> list[Path]:
    """Write ``success.png`` and ``actions.png`` comparing ``summaries`` (one per run) task by task.

    Returns the paths written; an empty list where matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    import numpy as np

    env_ids = list(dict.fromkeys(e for s in summaries for e in s["tasks"]))
    labels = labels or [agent_label(s) for s in summaries]
    x = np.arange(len(env_ids))
    width = 0.8 / max(1, len(summaries))
    out.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(env_ids) + 2), 4.2))
    for i, (s, label) in enumerate(zip(summaries, labels, strict=True)):
        succ = [100 * s["tasks"].get(e, {}).get("success", float("nan")) for e in env_ids]
        se = [100 * s["tasks"].get(e, {}).get("success_se", 0.0) for e in env_ids]
        ax.bar(x + (i - (len(summaries) - 1) / 2) * width, succ, width, yerr=se, capsize=3, label=label)
    ax.set_xticks(x, [_short(e) for e in env_ids], rotation=20, ha="right")
    ax.set_ylabel("success % (± SE)")
    ax.set_ylim(0, 118)  # headroom for the legend above 100 %
    ax.set_yticks(range(0, 101, 20))
    ax.set_title("Success per task")
    ax.legend(fontsize="small", loc="upper center", ncol=min(4, len(summaries)), frameon=False)
    fig.tight_layout()
    written.append(out / "success.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(env_ids) + 2), 4.2))
    for i, (s, label) in enumerate(zip(summaries, labels, strict=True)):
        pos = x + (i - (len(summaries) - 1) / 2) * width
        if records_by_run is not None:
            data = [[r["actions"] for r in records_by_run[i] if r["env_id"] == e] or [np.nan] for e in env_ids]
            parts = ax.boxplot(data, positions=pos, widths=width * 0.9, patch_artist=True, showfliers=False,
                               manage_ticks=False)
            color = f"C{i}"
            for box in parts["boxes"]:
                box.set_facecolor(color)
            parts["boxes"][0].set_label(label)
        else:
            means = [s["tasks"].get(e, {}).get("mean_actions", float("nan")) for e in env_ids]
            ax.bar(pos, means, width, label=label)
    ax.set_xticks(x, [_short(e) for e in env_ids], rotation=20, ha="right")
    ax.set_ylabel("actions per episode")
    ax.set_title("Actions per episode")
    ax.legend(fontsize="small")
    fig.tight_layout()
    written.append(out / "actions.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def read_summary(run_dir: Path) -> dict[str, Any]:
    """A run's ``summary.json``, checked to be a crl-bench summary.

    Raises:
        FileNotFoundError: there is no ``summary.json``.
        ValueError: it is not JSON (cut off mid-write, or not text) or not a crl-bench summary; the message
            names the file.
    """
    summary_path = run_dir / "summary.json"
    if not summary_path.exists():
        raise FileNotFoundError(f"{summary_path}: not found; is {run_dir} a finished eval.run directory?")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{summary_path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                         "a file cut off mid-write? eval.run writes it again at the end of a --resume") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"{summary_path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    if not isinstance(summary, dict) or not isinstance(summary.get("tasks"), dict):
        raise ValueError(f"{summary_path}: not a crl-bench summary (no 'tasks' object)")
    return summary


def load_run_checked(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """A run's summary, its episode records, and a warning for each thing that could not be read.

    Warnings name the file and line: a torn or invalid ``episodes.jsonl`` line, and a record count that
    falls short of the episodes the summary counts.

    Raises:
        FileNotFoundError, ValueError: as :func:`read_summary`.
    """
    summary = read_summary(run_dir)
    log = EpisodeLog(run_dir / "episodes.jsonl")
    all_records, problems = log.read()
    # A retried episode (--retry-errored) is recorded again; its latest record is the one that counts.
    latest: dict[str, dict[str, Any]] = {}
    for r in all_records:
        if isinstance(r, dict) and "env_id" in r and "seed" in r:
            r["key"] = record_key(r)
            latest[r["key"]] = r
    # episodes.jsonl may hold more than the summary counts (a resumed run with fewer --episodes or
    # another --seed): plot only the episodes the summary is about.
    run = summary.get("run") if isinstance(summary.get("run"), dict) else {}
    if isinstance(run.get("stream"), int) and isinstance(run.get("seed"), int) and isinstance(run.get("episodes"), int):
        # an experience-track run (--stream): worlds' episode seeds, with memory (sample 0) and without (1)
        from crl_envs.persistent import episode_seed

        wanted = {episode_key(e, episode_seed(run["seed"] + w, j), k) for e in summary["tasks"]
                  for w in range(run["episodes"]) for j in range(run["stream"]) for k in (0, 1)}
        latest = {k: r for k, r in latest.items() if k in wanted}
    elif isinstance(run.get("seed"), int) and isinstance(run.get("episodes"), int):
        samples = run.get("samples") if isinstance(run.get("samples"), int) else 1
        wanted = {episode_key(e, run["seed"] + i, k) for e in summary["tasks"] for i in range(run["episodes"])
                  for k in range(samples)}
        latest = {k: r for k, r in latest.items() if k in wanted}
    records = list(latest.values())
    counted = sum(t["episodes"] for t in summary["tasks"].values()
                  if isinstance(t, dict) and isinstance(t.get("episodes"), int))
    if log.path.exists() and len(records) < counted:
        problems.append(f"{run_dir / 'summary.json'}: counts {counted} episodes, but {log.path} holds "
                        f"{len(records)} readable records of them")
    return summary, records, problems


def load_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A run's summary and its episode records (:func:`load_run_checked` without its warnings)."""
    summary, records, _ = load_run_checked(run_dir)
    return summary, records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.report", description="Compare eval.run directories in plots")
    p.add_argument("runs", nargs="+", type=Path, help="run directories written by eval.run")
    p.add_argument("--out", type=Path, required=True, help="where to write success.png, actions.png, results.md")
    args = p.parse_args(argv)
    try:
        loaded = [load_run_checked(r) for r in args.runs]
    except (FileNotFoundError, ValueError) as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    for _, _, problems in loaded:
        for w in problems:
            print(f"warning: {w}", file=sys.stderr)
    summaries = [s for s, _, _ in loaded]
    labels = run_labels(summaries, args.runs)
    paths = write_plots(summaries, args.out, records_by_run=[r for _, r, _ in loaded], labels=labels)
    (args.out / "results.md").write_text(
        "\n".join(markdown_table(s, label) for s, label in zip(summaries, labels, strict=True)),
        encoding="utf-8",
    )
    print(f"wrote {', '.join(str(x) for x in [*paths, args.out / 'results.md'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
