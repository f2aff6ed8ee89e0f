"""What a training run reports: a step's rollout statistics and tokens, the experience side's numbers,
the JSONL rows and TensorBoard scalars they go to, and the held-out curve (``curve.png``)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crl_agent.episode import Episode
    from crl_agent.train_config import TrainConfig
    from crl_agent.train_setup import RunSetup


def rollout_stats(episodes: list[Episode]) -> dict[str, float]:
    """What the step's rollouts say about the policy: the mean entropy of its distribution over every
    scored decision (nats, from the probabilities it sampled with; tool choices included), the share of
    decisions that chose a tool (the ``crl`` actor's ``<search>``), the share of actions that repeat the
    previous one (a policy stuck in a loop) and of invalid actions, and the mean episode length."""
    entropies, repeats, moves, invalid, decisions, tool_choices = [], 0, 0, 0, 0, 0
    for ep in episodes:
        previous = None
        for st in ep.steps:
            for decision in st.decisions:
                if decision.probs:
                    entropies.append(-sum(p * math.log(p) for p in decision.probs if p > 0))
            decisions += len(st.decisions)
            tool_choices += len(st.tool_choices)
            repeats += st.action == previous
            invalid += not st.valid_action
            moves += 1
            previous = st.action
    out = {"rollout/mean_actions": sum(len(e.steps) for e in episodes) / max(1, len(episodes)),
           "rollout/repeat_rate": repeats / max(1, moves), "rollout/invalid_rate": invalid / max(1, moves)}
    if entropies:
        out["rollout/policy_entropy"] = sum(entropies) / len(entropies)
    if decisions:
        out["rollout/tool_choice_rate"] = tool_choices / decisions
    return out


def rollout_tokens(episodes: list[Episode]) -> int:
    """Tokens the actor processed in these episodes: each scored decision's prompt plus its candidates (a
    turn that chose a tool first scores twice), or a generated turn's prompt plus its reply."""
    total = 0
    for ep in episodes:
        for step in ep.steps:
            if step.decisions:
                total += sum(len(d.prompt_token_ids) + sum(len(c) for c in d.candidate_token_ids)
                             for d in step.decisions)
            else:  # a generated reply
                turn = step.turn or {}
                total += len(turn.get("prompt_token_ids") or ()) + len(turn.get("token_ids") or ())
    return total


def experience_metrics(setup: RunSetup, merged: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's experience side so far (the manager's counters are cumulative): distillations, the share of
    valid extractor operations, the bank's size, merges, and the meta-reward (mean outcome of the episodes
    each call's entries guided, 0 -> -1) over every call that has one, whether or not the extractor trains."""
    stats = setup.manager.stats
    row: dict[str, Any] = {"extractor/distillations": stats.get("distillations", 0),
                           "extractor/valid_ops": stats.get("ops_applied", stats.get("adds", 0)),
                           "extractor/malformed": stats.get("malformed", 0)}
    if row["extractor/valid_ops"] + row["extractor/malformed"]:
        row["extractor/valid_rate"] = row["extractor/valid_ops"] / (row["extractor/valid_ops"]
                                                                   + row["extractor/malformed"])
    row["bank_entries"] = len(setup.agent.bank)
    rewarded = setup.manager.meta_rewards()
    row["extractor/rewarded_calls"] = len(rewarded)
    if rewarded:
        row["extractor/meta_reward"] = sum(rewarded) / len(rewarded)
    row["extractor/merges"] = stats.get("merges", 0)
    row.update({f"extractor/merge_{k}": v for k, v in merged.items()})
    return row


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()


class Scalars:
    """TensorBoard scalars in ``<out>/tb`` (every number of each metrics and eval row), if tensorboard is installed."""

    def __init__(self, out: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # the agent extra installs it; without it, metrics.jsonl still has everything
            self.writer = None
            print("crl_agent.train: tensorboard is not installed, so no TensorBoard scalars "
                  '(pip install "crl-bench[agent]"); metrics.jsonl has them all', file=sys.stderr)
        else:
            self.writer = SummaryWriter(str(out / "tb"))

    def add(self, row: dict[str, Any], prefix: str = "") -> None:
        if self.writer is None:
            return
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(prefix + key, value, int(row["step"]))
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def plot_curve(out: Path, evals: list[dict[str, Any]], cfg: TrainConfig) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("success", "w/o experience"), ("with_experience", "with experience")):
        pts = [(e["step"], e[key], e[key + "_se"]) for e in evals if key in e]
        if pts:
            xs, ys, se = zip(*pts, strict=True)
            ax.errorbar(xs, [100 * y for y in ys], yerr=[100 * s for s in se], marker="o", capsize=3, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"held-out success % ({cfg.eval_episodes} seeds)")
    ax.set_title(f"{cfg.mode} on {', '.join(cfg.task_ids)}", fontsize=8 if len(cfg.task_ids) > 1 else None)
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend()
    path = out / "curve.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
