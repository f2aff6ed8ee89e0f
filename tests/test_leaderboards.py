from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from leaderboards.build import ROOT, main, render
from leaderboards.schema import SubmissionError, load_submission


def test_every_committed_submission_is_valid_and_the_readme_is_current(tmp_path):
    assert main(["--check"]) == 0
    subs = [load_submission(d) for d in sorted((ROOT / "submissions").iterdir()) if d.is_dir()]
    assert subs, "the baselines must be committed"
    assert (ROOT / "README.md").read_text() == render(subs), "run python -m leaderboards.build"


@pytest.fixture
def submission(tmp_path) -> Path:
    src = sorted(d for d in (ROOT / "submissions").iterdir() if d.is_dir())[0]
    dst = tmp_path / "subs" / src.name
    shutil.copytree(src, dst)
    return dst


def _edit(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("schema_version"), "summary.json: schema_version"),
        (lambda d: next(iter(d["tasks"].values())).pop("success"), r"summary.json: tasks\.crl/.*\.success: missing"),
        (lambda d: next(iter(d["tasks"].values())).update(success=1.5), r"success: 1.5 is outside"),
        (lambda d: next(iter(d["tasks"].values())).update(episodes="many"), r"episodes: expected int"),
    ],
)
def test_a_bad_summary_is_rejected_naming_file_and_field(submission, edit, message):
    _edit(submission / "summary.json", edit)
    with pytest.raises(SubmissionError, match=message):
        load_submission(submission)
    assert main(["--check", "--submissions", str(submission.parent)]) == 1


def test_bad_metadata_is_rejected_naming_the_field(submission):
    (submission / "metadata.yaml").write_text("name: x\nmodel: m\nagent: a\ndate: '2026-01-01'\nurl: ''\n")
    with pytest.raises(SubmissionError, match="metadata.yaml: verified: missing"):
        load_submission(submission)
    (submission / "metadata.yaml").write_text("name: [unclosed\n")
    with pytest.raises(SubmissionError, match="not valid YAML"):
        load_submission(submission)


def test_tables_are_sorted_by_macro_success(submission, tmp_path):
    out = tmp_path / "board.md"
    assert main(["--submissions", str(ROOT / "submissions"), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.index("oracle baseline") < text.index("random baseline")


def test_a_run_naming_a_task_sets_ids_one_by_one_joins_that_sets_table(tmp_path):
    from eval.suites import TASK_SETS
    from leaderboards.build import task_set_name

    src = next(d for d in sorted((ROOT / "submissions").iterdir()) if d.is_dir()
               and json.loads((d / "summary.json").read_text())["run"].get("tasks") == "6")
    summary = json.loads((src / "summary.json").read_text())
    summary["run"]["tasks"] = ",".join(reversed(TASK_SETS["6"]))
    assert task_set_name(summary) == "task set 6"
    summary["tasks"].pop("crl/WebShop-v0")
    assert task_set_name(summary).startswith("custom: ")


def test_an_unversioned_env_id_is_rejected_naming_the_fix(submission):
    def unversion(d):
        env_id, task = d["tasks"].popitem()
        d["tasks"]["myorg/Guess"] = {**task, "version": None}

    _edit(submission / "summary.json", unversion)
    with pytest.raises(SubmissionError, match=r"tasks\.myorg/Guess\.version: .*register the env as 'myorg/Guess-v0'"):
        load_submission(submission)


def test_the_step_cap_of_each_run_is_shown_beside_its_scores():
    subs = [load_submission(d) for d in sorted((ROOT / "submissions").iterdir()) if d.is_dir()]
    rows = {line.split(" | ")[1]: line.split(" | ") for line in render(subs).splitlines()
            if line.startswith("| ") and " | " in line and not line.startswith("| rank")}
    capped = next(r for name, r in rows.items() if "llm agent" in name and "at most 10 steps" in name)
    uncapped = next(r for name, r in rows.items() if name.startswith("oracle baseline (task set 6"))
    assert capped[4] == "10" and uncapped[4] == "env"


def test_site_names_are_short_and_names_that_would_read_alike_keep_what_tells_them_apart():
    from leaderboards.build import DISPLAY_CHARS, display_names

    grpo = "llm agent, SmolLM2-135M + LoRA trained by crl_agent.train --mode grpo (seed {}, 19 steps) (held-out seeds)"
    names = [grpo.format(0), grpo.format(1), "oracle baseline (task set 6, 20 episodes per task)", "random"]
    short = display_names(names)
    assert short[2:] == ["oracle baseline", "random"]
    assert short[0] != short[1] and short[0].endswith("(seed 0)") and short[1].endswith("(seed 1)")
    assert all(len(s) <= DISPLAY_CHARS + 20 for s in short) and short[0].startswith("llm agent, SmolLM2-135M")
