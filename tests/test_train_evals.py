"""The trainer keeps each held-out evaluation's episodes in ``eval.run``'s formats, and ``eval``'s readers read them."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from crl_agent.train_evals import eval_folder  # noqa: E402
from eval.results import EpisodeLog  # noqa: E402
from eval.trajectories import load_trajectories  # noqa: E402
from eval.view import load_inputs  # noqa: E402
from tests.view_training import TASK, train_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def grpo_run(tiny, tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("train") / "grpo-seed0", tiny)


def test_each_held_out_evaluation_is_kept_as_an_eval_run_folder(grpo_run):
    evals = [json.loads(x) for x in (grpo_run / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2]
    for e in evals:
        folder = eval_folder(grpo_run, e["step"], False)
        assert folder == grpo_run / "evals" / f"step-{e['step']:04d}" / "without_experience"
        records, problems = EpisodeLog(folder / "episodes.jsonl").read()
        assert problems == [] and len(records) == 4
        assert sorted(r["seed"] for r in records) == list(range(1_000_000, 1_000_004))
        assert all(r["env_id"] == TASK and r["key"] == f"{TASK}#{r['seed']}#0" for r in records)
        # the held-out success of evals.jsonl is these episodes' success
        assert sum(r["success"] for r in records) / 4 == e["success"]
        trajs = load_trajectories(folder, validate=True)  # schema checked
        assert {t["key"] for t in trajs} == {r["key"] for r in records}
        assert all(len(t["steps"]) == t["summary"]["actions"] for t in trajs)
        meta = json.loads((folder / "eval.json").read_text())
        assert meta["step"] == e["step"] and meta["episodes"] == 4 and meta["with_experience"] is False
    assert not any(p.name.endswith(".tmp") for p in (grpo_run / "evals").rglob("*"))


def test_the_viewer_reads_a_training_run_as_a_curve_and_one_run_per_evaluation(grpo_run):
    runs, trainings, problems = load_inputs([grpo_run])
    assert problems == [] and len(trainings) == 1
    t = trainings[0]
    assert [r["step"] for r in t.runs] == [0, 2] and [e["step"] for e in t.evals] == [0, 2]
    assert [m["step"] for m in t.metrics] == [1, 2] and all("train_success" in m for m in t.metrics)
    assert t.status["steps_done"] == 2 and t.status["finished"]
    by_id = {r.id: r for r in runs}
    first, last = by_id[t.runs[0]["run"]], by_id[t.runs[1]["run"]]
    assert len(first.rows) == len(last.rows) == 4 and first.meta["no_steps"] == 0 and first.warnings == []
    assert first.summary["train_eval"]["step"] == 0 and "incomplete" not in first.summary
    # the same held-out seeds, played by the policy before and after two updates: not all alike
    assert first.actions != last.actions
