"""``python -m eval.view RUN [RUN ...] --out DIR [--watch]``: write a static site to browse and compare runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eval.view import build_site
from eval.view.watch import watch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.view",
                                description="Write a static site (opens from disk, no server) to browse eval and "
                                            "training runs")
    p.add_argument("runs", nargs="+", type=Path,
                   help="run folders written by eval.run (finished, running or killed), training run folders of "
                        "crl_agent.train, or folders of either")
    p.add_argument("--out", type=Path, required=True, help="folder for the site (new, empty, or an earlier site)")
    p.add_argument("--title", default="crl-bench results")
    p.add_argument("--watch", nargs="?", type=float, const=2.0, default=0.0, metavar="SECONDS",
                   help="keep running: rebuild the site whenever the runs' files change (checked every SECONDS, "
                        "default 2), and the open page picks the new data up; Ctrl-C stops")
    args = p.parse_args(argv)
    if args.watch < 0:
        p.error("--watch takes a number of seconds > 0")

    def build() -> None:
        stats = build_site(args.out, args.runs, title=args.title, watch=args.watch)
        for w in stats.warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(f"wrote {stats.files} files ({stats.bytes / 1e6:.1f} MB) to {args.out}; "
              f"open {(args.out / 'index.html').resolve().as_uri()}", flush=True)

    try:
        build()
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    if args.watch:
        print(f"watching {len(args.runs)} path(s) every {args.watch:g} s; Ctrl-C stops", flush=True)
        watch(args.runs, args.watch, build)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
