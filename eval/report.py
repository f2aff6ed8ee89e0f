"""Readable views of a run: a terminal table and a markdown table."""

from __future__ import annotations

from typing import Any


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}"


def rows(summary: dict[str, Any]) -> list[list[str]]:
    out = []
    for env_id, t in summary["tasks"].items():
        out.append(
            [
                env_id,
                str(t["episodes"]),
                f"{_pct(t['success'])} ± {_pct(t['success_se'])}",
                f"{_pct(t['progress'])}",
                f"{t['mean_actions']:.1f}" if t["episodes"] else "n/a",
                str(t["errored"]),
            ]
        )
    m = summary["macro"]
    out.append(["macro average", "", f"{_pct(m['success'])} ± {_pct(m['success_se'])}", _pct(m["progress"]), "", ""])
    return out


HEADER = ["task", "episodes", "success % ± SE", "progress %", "mean actions", "errored"]


def markdown_table(summary: dict[str, Any]) -> str:
    agent = summary["agent"].get("name", "?")
    lines = [
        f"# Results: agent `{agent}`",
        "",
        f"schema {summary['schema_version']}, crl-bench {summary['package_version']}, git {summary['git_sha'] or 'n/a'}",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---" for _ in HEADER) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(summary)]
    return "\n".join(lines) + "\n"


def print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"agent: {summary['agent'].get('name', '?')}")
    for h in HEADER:
        table.add_column(h)
    for r in rows(summary):
        table.add_row(*r)
    Console().print(table)
