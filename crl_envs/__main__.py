"""``python -m crl_envs list``: every registered id with its family and backend status."""

from __future__ import annotations

import argparse
import re

import gymnasium as gym

import crl_envs
from crl_envs.registry import family_of


def _rows() -> list[tuple[str, str, str, str, str]]:
    rows = []
    for env_id in sorted(gym.registry):
        spec = gym.registry[env_id]
        fam = family_of(env_id)
        entry = spec.entry_point
        ep = entry if isinstance(entry, str) else f"{getattr(entry, '__module__', '?')}:{getattr(entry, '__qualname__', '')}"
        if fam is None and ep.startswith(("gymnasium.", "shimmy.")):
            continue  # Gymnasium's own envs (a class entry point is listed by its module too)
        m = re.search(r"-v(\d+)$", env_id)
        family = fam.name if fam else f"plugin ({ep.split(':')[0]})"
        installed = "yes" if fam is None or fam.installed() else f"no: pip install -e \".[{fam.extra}]\""
        rows.append((env_id, family, f"v{m.group(1)}" if m else "-", str(spec.max_episode_steps), installed))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crl_envs", description=crl_envs.__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list every env id")
    parser.parse_args(argv)
    rows = _rows()
    header = ("id", "family", "version", "max steps", "backend installed")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(5)]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
