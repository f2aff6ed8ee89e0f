"""Damaged run folders: what ``eval.view``, ``eval.report`` and ``EpisodeLog`` say about them (no browser).

A torn or invalid ``episodes.jsonl`` line is named (file and line) instead of dropped silently; a summary cut
off mid-write or one that is JSON but not an object names its file; an empty ``episodes.jsonl`` is told apart
from a missing one, and a cut-off trajectories file from one never written.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from eval.report import load_run_checked
from eval.report import main as report_main
from eval.results import EpisodeLog
from eval.view import build_site
from eval.view.__main__ import main as view_main
from tests import view_fixtures as F


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    return F.write_run(root / "random", [F.play_sokoban(s, "random", max_steps=6) for s in range(3)], {"name": "random"})


def _copy(run: Path, tmp_path: Path, name: str = "copy") -> Path:
    return shutil.copytree(run, tmp_path / name)


def _manifest(out: Path) -> dict:
    text = (out / "data" / "site.js").read_text(encoding="utf-8")
    m = re.fullmatch(r'CRLVIEW\.put\(("[^"]*"),JSON\.parse\((".*")\)\);\n', text, re.S)
    return json.loads(json.loads(m.group(2)))


def test_episode_log_read_names_each_line_it_skips(tmp_path):
    path = tmp_path / "episodes.jsonl"
    good = json.dumps({"env_id": F.SOKOBAN, "seed": 0, "success": True})
    path.write_text(good + "\n" + good[:20] + "\n[1, 2]\n\n" + good.replace('"seed": 0', '"seed": 1') + "\n")
    records, problems = EpisodeLog(path).read()
    assert problems == [f"{path}:2: not valid JSON (a torn or corrupt line); skipped",
                        f"{path}:3: not an episode record (a JSON list, not an object with env_id and seed); skipped"]
    assert len(EpisodeLog(path).latest()) == 2 and records == EpisodeLog(path).load()


def test_a_torn_episodes_line_is_named_in_the_build_output_and_the_site(run, tmp_path, capsys):
    damaged = _copy(run, tmp_path)
    lines = (damaged / "episodes.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][:30] + "\n"
    (damaged / "episodes.jsonl").write_text("".join(lines))
    out = tmp_path / "site"
    assert view_main([str(damaged), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"warning: {damaged / 'episodes.jsonl'}:2: not valid JSON" in err
    assert f"counts 3 episodes, but {damaged / 'episodes.jsonl'} holds 2 readable records" in err
    site_run = _manifest(out)["runs"][0]
    # the torn line's episode is still listed: its trajectory record carries its summary
    assert site_run["episodes"] == 3 and len(site_run["warnings"]) == 2
    assert report_main([str(damaged), "--out", str(tmp_path / "report")]) == 0
    assert f"{damaged / 'episodes.jsonl'}:2: not valid JSON" in capsys.readouterr().err


def test_a_truncated_summary_names_its_file(run, tmp_path, capsys):
    cut = _copy(run, tmp_path)
    summary = cut / "summary.json"
    summary.write_text(summary.read_text()[:200])
    for main, args in ((view_main, ["--out", str(tmp_path / "site")]), (report_main, ["--out", str(tmp_path / "r")])):
        with pytest.raises(SystemExit) as e:
            main([str(cut), *args])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"{summary}: not valid JSON" in err, err


def test_a_summary_that_is_json_but_not_an_object_is_not_a_crl_bench_summary(run, tmp_path, capsys):
    bad = _copy(run, tmp_path)
    (bad / "summary.json").write_text("[1, 2]")
    for main, args in ((report_main, ["--out", str(tmp_path / "r")]), (view_main, ["--out", str(tmp_path / "site")])):
        with pytest.raises(SystemExit) as e:
            main([str(bad), *args])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"{bad / 'summary.json'}: not a crl-bench summary" in err, err
    with pytest.raises(ValueError, match="not a crl-bench summary"):
        load_run_checked(bad)


def test_an_empty_episodes_file_is_not_a_missing_one_and_a_cut_trajectory_file_is_not_an_unwritten_one(run, tmp_path):
    empty, missing, cut = _copy(run, tmp_path, "empty"), _copy(run, tmp_path, "missing"), _copy(run, tmp_path, "cut")
    (empty / "episodes.jsonl").write_text("")
    (missing / "episodes.jsonl").unlink()
    for d in (empty, missing):
        (d / "trajectories.jsonl.gz").unlink()
    gz = cut / "trajectories.jsonl.gz"
    gz.write_bytes(gz.read_bytes()[:-30])
    out = tmp_path / "site"
    stats = build_site(out, [empty, missing, cut, run])
    by_id = {r["id"]: r for r in _manifest(out)["runs"]}
    assert by_id["empty"]["episodes_file"] == "empty" and by_id["missing"]["episodes_file"] == "missing"
    assert by_id["cut"]["trajectories_file"] == "cut" and by_id["random"]["trajectories_file"] == "present"
    assert by_id["missing"]["trajectories_file"] == "missing" and by_id["cut"]["trajectories"] == 2
    assert any(str(gz) in w for w in by_id["cut"]["warnings"]) and by_id["random"]["warnings"] == []
    assert any("counts 3 episodes" in w for w in by_id["empty"]["warnings"]) and by_id["missing"]["warnings"] == []
    assert set(stats.warnings) == {w for r in by_id.values() for w in r["warnings"]}
