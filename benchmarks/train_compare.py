"""The fair comparison of training modes that ``benchmarks/train_cpu.py --report`` prints (issue 46 item 4).

Modes are compared seed by seed: the same training seed gives each mode the same scheduled task seeds and the
same held-out seeds, so the paired difference (crl - grpo, static - grpo, crl - static) removes what the seeds
themselves decide. Two alignments:

- **equal steps**: the held-out success at each evaluation step both runs have;
- **equal episodes played**: a crl or static step plays more episodes than a grpo step when dynamic sampling
  refills its halves, so each run's held-out success is also read at the same number of training episodes
  played (the other run's curve interpolated linearly between its evaluations; never extrapolated).

A crl run whose extractor never updated is crl in name only: it is labelled ``crl (static in effect)`` and left
out of crl's verdict and comparisons (the runs before issue 46 made 0 updates, so "crl" equalled "static").

What the seeds can resolve: with ``n`` paired seeds, the mean difference's standard error is the larger of the
spread of the paired differences over the seeds (``sd / sqrt(n)``, ``n >= 2``) and the binomial floor of the
evaluations themselves (``sqrt(sum of both runs' squared standard errors) / n``); a difference within
``1.96`` of those is not told from noise.
"""

from __future__ import annotations

import math
import statistics

STATIC_IN_EFFECT = "crl (static in effect)"
PAIRS = (("crl", "grpo"), ("static", "grpo"), ("crl", "static"))


def extractor_updates(run: dict) -> int | None:
    """How many times a run's extractor updated (``None``: not recorded, a file from before it was)."""
    ext = run.get("extractor") or {}
    return ext.get("updates")


def longest_pause(run: dict, after: int = 8) -> int | None:
    """The most steps in a row, from step ``after`` on, in which the extractor made no update (issue 46 asks a
    crl run for one at least every 4 steps from step 8: at most 3); ``None``: no per-step record."""
    schedule = run.get("extractor_schedule") or []
    if not schedule or any(row[1] is None for row in schedule):
        return None
    longest = current = 0
    before = None
    for step, updates, *_ in schedule:
        updated = before is not None and updates > before
        before = updates
        if step >= after:
            current = 0 if updated else current + 1
            longest = max(longest, current)
    return longest


def effective_mode(run: dict) -> str:
    """``crl`` unless its extractor never updated (then :data:`STATIC_IN_EFFECT`); other modes as they are."""
    if run["mode"] == "crl" and not extractor_updates(run):
        return STATIC_IN_EFFECT
    return run["mode"]


def held_out(run: dict, with_experience: bool = False) -> list[tuple[int, float, float]]:
    """``(step, success, standard error)`` of each held-out evaluation (``with_experience``: the half played
    with the bank; crl and static only)."""
    key = "with_experience" if with_experience else "success"
    return [(e["step"], e[key], e.get(f"{key}_se", 0.0)) for e in run.get("evals", []) if key in e]


def episodes_at(run: dict) -> dict[int, int]:
    """Training episodes played before each step's end: ``{step: cumulative episodes}`` (0 at step 0)."""
    out, total = {0: 0}, 0
    for step, played in run.get("episodes_played", []):
        total += played
        out[step] = total
    return out


def _interpolate(points: list[tuple[float, float, float]], x: float) -> tuple[float, float] | None:
    """Success and standard error at ``x`` on a curve of ``(x, success, se)`` points, linear between them."""
    points = sorted(points)
    for (x0, y0, s0), (x1, y1, s1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1:
            t = 0.0 if x1 == x0 else (x - x0) / (x1 - x0)
            return y0 + t * (y1 - y0), s0 + t * (s1 - s0)
    if points and points[-1][0] == x:
        return points[-1][1], points[-1][2]
    return None


def paired(a: dict, b: dict, with_experience: bool = False, by: str = "steps") -> list[tuple[int, float, float]]:
    """``(step of a, a - b in points, its standard error in points)`` at each of ``a``'s evaluations that
    ``b`` covers: at the same step (``by="steps"``), or at the same number of training episodes played
    (``by="episodes"``, ``b``'s curve interpolated)."""
    mine = held_out(a, with_experience)
    # the baseline's half of the same kind where it has one (static), else its own success (grpo has no bank)
    theirs = held_out(b, with_experience) or held_out(b, False)
    if by == "steps":
        other = {s: (y, se) for s, y, se in theirs}
        return [(s, 100 * (y - other[s][0]), 100 * math.hypot(se, other[s][1])) for s, y, se in mine if s in other]
    a_eps, b_eps = episodes_at(a), episodes_at(b)
    curve = [(b_eps[s], y, se) for s, y, se in theirs if s in b_eps]
    out = []
    for s, y, se in mine:
        if s not in a_eps:
            continue
        at = _interpolate(curve, a_eps[s])
        if at is not None:
            out.append((s, 100 * (y - at[0]), 100 * math.hypot(se, at[1])))
    return out


def resolution(diffs: list[float], ses: list[float]) -> float:
    """The smallest mean difference (points) these paired seeds tell from noise at about 95%."""
    n = len(diffs)
    floor = math.sqrt(sum(se * se for se in ses)) / n
    spread = statistics.stdev(diffs) / math.sqrt(n) if n >= 2 else 0.0
    return 1.96 * max(floor, spread)


def comparison_lines(runs: list[dict]) -> list[str]:
    """The report's comparison section: per pair of modes, the paired per-seed differences at the last
    common evaluation, at equal steps and at equal episodes played, their mean and what the seeds resolve."""
    by_mode: dict[str, dict[int, dict]] = {}
    for r in runs:
        by_mode.setdefault(effective_mode(r), {})[r["seed"]] = r
    lines = []
    for name in sorted(m for m in by_mode if m == STATIC_IN_EFFECT):
        seeds = ", ".join(str(s) for s in sorted(by_mode[name]))
        lines.append(f"- {name}: seeds {seeds} made 0 extractor updates; left out of crl's verdict and comparisons")
    for a_mode, b_mode in PAIRS:
        common = sorted(set(by_mode.get(a_mode, {})) & set(by_mode.get(b_mode, {})))
        if not common:
            continue
        variants = [(False, "steps"), (False, "episodes")]
        if a_mode in ("crl", "static"):
            variants += [(True, "steps")]
        for with_exp, by in variants:
            label = f"{a_mode}{' (with experience)' if with_exp else ''} - {b_mode}, equal {by}"
            if by == "episodes" and not all(by_mode[m][seed].get("episodes_played") for m in (a_mode, b_mode)
                                            for seed in common):
                lines.append(f"- {label}: episodes played per step not recorded (a run from before issue 46)")
                continue
            finals = []
            for seed in common:
                d = paired(by_mode[a_mode][seed], by_mode[b_mode][seed], with_exp, by)
                if d:
                    finals.append((seed, *d[-1]))
            if not finals:
                lines.append(f"- {label}: no evaluation in common")
                continue
            per_seed = "; ".join(f"seed {seed} at step {step}: {diff:+.1f} ± {se:.1f}" for seed, step, diff, se in finals)
            diffs, ses = [f[2] for f in finals], [f[3] for f in finals]
            lines.append(f"- {label}: {per_seed}; mean {statistics.mean(diffs):+.1f} over {len(finals)} seed(s); "
                         f"these seeds resolve differences beyond ±{resolution(diffs, ses):.1f} points")
    return lines
