"""``python -m eval.view RUN [RUN ...] --out DIR``: write a static site to browse and compare runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eval.view import build_site


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.view",
                                description="Write a static site (opens from disk, no server) to browse eval runs")
    p.add_argument("runs", nargs="+", type=Path, help="run folders written by eval.run, or folders of them")
    p.add_argument("--out", type=Path, required=True, help="folder for the site (new, empty, or an earlier site)")
    p.add_argument("--title", default="crl-bench results")
    args = p.parse_args(argv)
    try:
        stats = build_site(args.out, args.runs, title=args.title)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    for w in stats.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"wrote {stats.files} files ({stats.bytes / 1e6:.1f} MB) to {args.out}; "
          f"open {(args.out / 'index.html').resolve().as_uri()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
