"""benchmarks/train_cpu.py: one result file per run, merged by --report into the tag's table and plot.

No training here: run folders are written by hand (the trainer's evals.jsonl and metrics.jsonl), and the
run itself is replaced by a fake where an invocation is tested end to end.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def bench(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_train_cpu", ROOT / "benchmarks" / "train_cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(module, "git_sha", lambda: "0" * 40)
    return module


def _run_folder(path: Path, before: float, after: float, step_s: float, steps: int = 4) -> Path:
    path.mkdir(parents=True)
    evals = [{"step": 0, "success": before, "success_se": 0.05, "errored": 0, "mean_actions": 13.5},
             {"step": steps, "success": after, "success_se": 0.06, "errored": 0, "mean_actions": 11.0}]
    metrics = [{"step": i, "time_s": step_s, "train_success": 0.25, "rollout/policy_entropy": 1.5 - 0.1 * i,
                "signal_groups": 0.5} for i in range(steps)]
    (path / "evals.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return path


def _host(cpu: str, gflops: float) -> dict:
    return {"cpu_model": cpu, "cores": 2, "engine_dtype": "bfloat16",
            "matmul_gflops": {"float32": gflops / 2, "bfloat16": gflops}}


def _write(bench, tmp_path, mode, seed, before, after, step_s, host, settings=None, tag="t"):
    row = bench.summarise(mode, seed, _run_folder(tmp_path / "runs" / f"{mode}-seed{seed}", before, after, step_s))
    return bench.write_seed_result(bench.RESULTS / tag, tag, row, settings or dict(bench.SETTINGS),
                                   {"steps": 32}, 1, host)


def test_report_merges_per_seed_files_from_different_hosts_into_one_table_and_plot(bench, tmp_path, capsys):
    a = _write(bench, tmp_path, "grpo", 0, 0.20, 0.55, 62.0, _host("Intel Xeon", 2400))
    b = _write(bench, tmp_path, "grpo", 3, 0.25, 0.50, 171.0, _host("AMD EPYC", 430))
    assert a.name == "grpo-seed0.json" and a.with_suffix(".png").stat().st_size > 0
    saved = json.loads(b.read_text())
    assert saved["host"]["cpu_model"] == "AMD EPYC" and saved["run"]["step_s_median"] == 171.0
    assert (saved["mode"], saved["seed"], saved["budget"]) == ("grpo", 3, {"steps": 32})

    assert bench.main(["--report", "--tag", "t"]) == 0
    table = (bench.RESULTS / "t" / "table.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| grpo |")]
    assert len(rows) == 2
    assert "Intel Xeon, 2 cores, bfloat16 2,400 GFLOP/s" in rows[0] and "| 62 s |" in rows[0]
    assert "AMD EPYC" in rows[1] and "| 171 s |" in rows[1] and "+25.0 ±" in rows[1]
    assert ("- grpo: 2 of 5 seeds: gains +25.0, +35.0; median so far +30.0; every seed >= +10: holds so far "
            "(the 3 missing must each gain >= +10); median >= +20: open: needs 1 of the 3 missing seeds at >= +20") in table
    assert (bench.RESULTS / "t" / "plot.png").stat().st_size > 0
    assert "left out" not in table
    assert "wrote" in capsys.readouterr().out


def test_the_verdict_over_five_seeds_says_what_is_settled_and_what_the_missing_ones_need(bench):
    def runs(*gains):
        return [{"mode": "grpo", "gain_points": g} for g in gains]

    done = bench.verdict(runs(12, 25, 31, 22, 9))["grpo"]
    assert (done["missing"], done["median"], done["every seed >= +10"], done["median >= +20"]) == (0, 22, False, True)
    assert bench.verdict_line("grpo", done) == ("- grpo: gains +9.0, +12.0, +22.0, +25.0, +31.0; median +22.0; "
                                                 "every seed >= +10: False; median >= +20: True")
    two_low = bench.verdict(runs(10.9, 14.1))["grpo"]  # the median is the third of five: all 3 missing must reach it
    assert (two_low["missing"], two_low["needed"], two_low["every seed >= +10"], two_low["median >= +20"]) == \
        (3, 3, None, None)
    assert "needs 3 of the 3 missing seeds at >= +20" in bench.verdict_line("grpo", two_low)
    three_low = bench.verdict(runs(10.9, 14.1, 18))["grpo"]
    assert (three_low["needed"], three_low["median >= +20"]) == (None, False)
    assert "median >= +20: failed whatever the missing seeds gain" in bench.verdict_line("grpo", three_low)
    three_high = bench.verdict(runs(20, 25, 40))["grpo"]
    assert (three_high["needed"], three_high["median >= +20"]) == (0, True)
    assert "met whatever the missing seeds gain" in bench.verdict_line("grpo", three_high)
    one_below_ten = bench.verdict(runs(35, 5))["grpo"]
    assert one_below_ten["every seed >= +10"] is False and "every seed >= +10: failed" in \
        bench.verdict_line("grpo", one_below_ten)
    assert bench.verdict(runs(25, 35), planned=2)["grpo"]["median >= +20"] is True


def test_a_torn_per_seed_file_is_named_and_left_out(bench, tmp_path, capsys):
    _write(bench, tmp_path, "grpo", 0, 0.20, 0.55, 62.0, _host("Intel Xeon", 2400))
    good = _write(bench, tmp_path, "grpo", 1, 0.20, 0.40, 62.0, _host("Intel Xeon", 2400))
    torn = good.with_name("grpo-seed2.json")
    torn.write_text(good.read_text()[:200])  # a write cut short
    assert bench.main(["--report", "--tag", "t"]) == 1
    err = capsys.readouterr().err
    assert "grpo-seed2.json: cannot be read as JSON" in err and "rerun that seed or delete the file" in err
    table = (bench.RESULTS / "t" / "table.md").read_text()
    assert len([line for line in table.splitlines() if line.startswith("| grpo |")]) == 2
    assert "left out:" in table and "grpo-seed2.json" in table


def test_a_file_that_is_not_what_its_name_says_is_refused(bench, tmp_path):
    path = _write(bench, tmp_path, "grpo", 0, 0.20, 0.55, 62.0, _host("Intel Xeon", 2400))
    path.rename(path.with_name("crl-seed0.json"))
    docs, problems = bench.merge(bench.RESULTS / "t")
    assert docs == [] and "holds grpo seed 0" in problems[0]
    path.with_name("crl-seed0.json").write_text(json.dumps({"mode": "crl", "seed": 0}))
    assert "not a per-seed result" in bench.merge(bench.RESULTS / "t")[1][0]


def test_a_missing_seed_asked_for_gives_the_command_that_makes_it(bench, tmp_path, capsys):
    _write(bench, tmp_path, "grpo", 0, 0.20, 0.55, 62.0, _host("Intel Xeon", 2400))
    assert bench.main(["--report", "--tag", "t", "--modes", "grpo", "--seeds", "0,4"]) == 1
    err = capsys.readouterr().err
    assert "grpo seed 4: no result" in err
    assert "python benchmarks/train_cpu.py --tag t --modes grpo --seeds 4 --steps 32 --jobs 1" in err


def test_a_run_with_other_settings_is_left_out_naming_them(bench, tmp_path):
    host = _host("AMD EPYC", 430)
    _write(bench, tmp_path, "grpo", 0, 0.2, 0.5, 171.0, host)
    _write(bench, tmp_path, "grpo", 1, 0.2, 0.5, 171.0, host)
    _write(bench, tmp_path, "grpo", 2, 0.2, 0.9, 171.0, host, settings={**bench.SETTINGS, "lr": 2e-3})
    docs, problems = bench.merge(bench.RESULTS / "t")
    assert [d["seed"] for d in docs] == [0, 1]
    assert len(problems) == 1 and "grpo-seed2.json" in problems[0] and "(lr differ)" in problems[0]


def test_report_of_an_empty_tag_says_how_to_start(bench, capsys):
    (bench.RESULTS / "empty").mkdir(parents=True)
    assert bench.main(["--report", "--tag", "empty"]) == 1
    assert "no per-seed results" in capsys.readouterr().err
    assert not (bench.RESULTS / "empty" / "table.md").exists()


def test_an_invocation_writes_one_file_per_run_with_its_host(bench, tmp_path, monkeypatch):
    calls = []

    def fake_run(mode, seed, minutes, out, settings, threads):
        calls.append((mode, seed, minutes, settings["steps"], settings["dynamic-sampling"], threads))
        row = bench.summarise(mode, seed, _run_folder(out, 0.2, 0.5, 100.0))
        return {**row, "returncode": 0, "wall_s": 1.0}

    monkeypatch.setattr(bench, "run_one", fake_run)
    monkeypatch.setattr(bench, "host_record", lambda threads: {**_host("AMD EPYC", 430), "torch_threads": threads})
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    assert bench.main(["--modes", "grpo", "--seeds", "3", "--tag", "t", "--work", str(tmp_path / "w")]) == 0
    # one run with the default --jobs 2: it gets both cores; 32 steps, no time budget
    assert calls == [("grpo", 3, 0.0, 32, 4, 2)]
    saved = json.loads((bench.RESULTS / "t" / "grpo-seed3.json").read_text())
    assert saved["host"]["torch_threads"] == 2 and saved["budget"] == {"steps": 32} and saved["jobs"] == 1
    assert (bench.RESULTS / "t" / "table.md").exists()


def test_bad_modes_seeds_and_tags_are_refused(bench):
    for argv in (["--seeds", "a"], ["--modes", "ppo"], ["--tag", "../x"], ["--set", "steps=3"], ["--set", "nokey=1"]):
        with pytest.raises(SystemExit):
            bench.main(["--report", *argv] if argv[0] != "--set" else argv)


def test_results_of_the_one_file_per_tag_layout_import_as_per_seed_files(bench, tmp_path):
    row = bench.summarise("grpo", 0, _run_folder(tmp_path / "old" / "grpo-seed0", 0.219, 0.578, 62.0))
    crl = {**bench.summarise("crl", 1, _run_folder(tmp_path / "old" / "crl-seed1", 0.203, 0.188, 129.0)),
           "machine": "a later session's machine"}
    legacy = tmp_path / "train_cpu_solo.json"
    legacy.write_text(json.dumps({"schema_version": "1.0", "tag": "solo", "minutes": 30.0, "jobs": 1,
                                  "settings": {"env": "crl/MiniHack-Room-Random-5x5-Short-v0", "lr": 5e-4,
                                               "steps": 1000}, "runs": [row, crl]}))
    assert bench.main(["--import-results", str(legacy), "--tag", "solo"]) == 0
    grpo = json.loads((bench.RESULTS / "solo" / "grpo-seed0.json").read_text())
    assert grpo["settings"]["tasks"] == "crl/MiniHack-Room-Random-5x5-Short-v0" and grpo["settings"]["device"] == "cpu"
    assert grpo["budget"] == {"minutes": 30.0, "steps": 1000} and grpo["imported"] == "1.0"
    assert grpo["host"]["note"].startswith("not recorded")
    assert json.loads((bench.RESULTS / "solo" / "crl-seed1.json").read_text())["host"]["note"] == "a later session's machine"
    assert "30 minutes a run" in (bench.RESULTS / "solo" / "table.md").read_text()


def test_importing_something_else_fails_clearly(bench, tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit, match="not a results file"):
        bench.main(["--import-results", str(bad), "--tag", "x"])


def _mode_run(path: Path, mode: str, successes: list[float], played: int, updates: int = 0,
              with_exp: list[float] | None = None) -> Path:
    """A run folder with an evaluation every 4 steps (successes at steps 0, 4, ...), ``played`` training
    episodes a step and, for crl/static, the extractor's update count and the with-experience half."""
    path.mkdir(parents=True)
    evals = []
    for i, y in enumerate(successes):
        e = {"step": 4 * i, "success": y, "success_se": 0.05, "errored": 0, "mean_actions": 10.0}
        if with_exp is not None:
            e.update(with_experience=with_exp[i], with_experience_se=0.05)
        evals.append(e)
    steps = 4 * (len(successes) - 1)
    metrics = [{"step": i + 1, "time_s": 60.0, "train_success": 0.3, "episodes": 16, "episodes_played": played,
                "episodes_kept": played // 2, "kept_with_experience": 0.5 if with_exp else 0.0,
                **({"extractor/updates": updates if i + 1 >= 2 else 0} if mode in ("crl", "static") else {})}
               for i in range(steps)]
    (path / "evals.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return path


def test_report_pairs_modes_seed_by_seed_at_equal_steps_and_episodes_and_labels_a_crl_run_that_never_trained(
        bench, tmp_path):
    runs = {("grpo", 0): ([0.20, 0.30, 0.40], 16, 0, None), ("grpo", 1): ([0.20, 0.25, 0.30], 16, 0, None),
            ("crl", 0): ([0.20, 0.35, 0.50], 32, 3, [0.22, 0.40, 0.60]),
            ("crl", 1): ([0.20, 0.30, 0.45], 32, 0, [0.20, 0.30, 0.40]),  # its extractor never updated
            ("static", 0): ([0.20, 0.30, 0.45], 32, 0, [0.20, 0.35, 0.45])}
    for (mode, seed), (ys, played, updates, wexp) in runs.items():
        row = bench.summarise(mode, seed, _mode_run(tmp_path / f"{mode}{seed}", mode, ys, played, updates, wexp))
        bench.write_seed_result(bench.RESULTS / "t", "t", row, dict(bench.SETTINGS), {"steps": 8}, 1,
                                _host("Intel Xeon", 2400))
    saved = json.loads((bench.RESULTS / "t" / "crl-seed0.json").read_text())["run"]
    assert saved["extractor"]["updates"] == 3 and saved["episodes_played"][0] == [1, 32]
    assert saved["step0_gap_points"] == pytest.approx(2.0)
    bench.main(["--report", "--tag", "t"])
    table = (bench.RESULTS / "t" / "table.md").read_text()
    assert "| crl (static in effect) | 1 |" in table and "| crl | 0 |" in table
    # its 3 updates all came by step 2: steps 8..8 had none (issue 46 asks for at most 3 in a row)
    assert "extractor updates: 3, at most 1 steps in a row without one from step 8" in table
    assert "- crl (static in effect): seeds 1 made 0 extractor updates; left out of crl's verdict" in table
    assert "- crl: 1 of 5 seeds: gains +30.0" in table  # seed 1's +25 is not crl's
    # equal steps: crl seed 0 against grpo seed 0 at step 8: 50% - 40%
    assert "- crl - grpo, equal steps: seed 0 at step 8: +10.0 ± 7.1; mean +10.0 over 1 seed(s)" in table
    # equal episodes: crl's 256 episodes at step 8 are grpo's step 16, beyond its curve; at step 4 crl's 128
    # episodes are grpo's step 8 (40%): 35% - 40%
    assert "- crl - grpo, equal episodes: seed 0 at step 4: -5.0 ± 7.1" in table
    assert "- crl (with experience) - grpo, equal steps: seed 0 at step 8: +20.0" in table
    assert "- crl - static, equal steps: seed 0 at step 8: +5.0" in table
    assert "- crl (with experience) - static, equal steps: seed 0 at step 8: +15.0" in table
    assert "these seeds resolve differences beyond ±13.9 points" in table  # 1.96 * 7.07 with one seed


def test_the_longest_pause_between_extractor_updates_counts_from_step_8(bench):
    import train_compare

    def run(updates: list[int]) -> dict:
        return {"extractor_schedule": [(i + 1, u, 0, 0, None, None) for i, u in enumerate(updates)]}

    # updates at steps 5, 8 and 12: none at 9, 10, 11; none at 13, 14 either
    assert train_compare.longest_pause(run([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3])) == 3
    assert train_compare.longest_pause(run([0] * 7 + list(range(1, 10)))) == 0  # every step from 8
    assert train_compare.longest_pause(run([0] * 12)) == 5  # none at all: steps 8-12
    assert train_compare.longest_pause({"extractor_schedule": [(1, None, 0, 0, None, None)]}) is None


def test_the_resolution_grows_with_the_spread_of_the_paired_differences(bench):
    import train_compare

    tight = train_compare.resolution([10.0, 11.0, 9.0], [7.0, 7.0, 7.0])
    loose = train_compare.resolution([30.0, -10.0, 10.0], [7.0, 7.0, 7.0])
    assert tight == pytest.approx(1.96 * 7.0 * 3 ** 0.5 / 3) and loose == pytest.approx(1.96 * 20.0 / 3 ** 0.5)


def test_a_baseline_tag_lends_its_grpo_runs_to_the_comparison(bench, tmp_path, capsys):
    for tag, mode, ys, played, updates, wexp in (("default", "grpo", [0.2, 0.3, 0.4], 16, 0, None),
                                                 ("eq", "crl", [0.2, 0.35, 0.5], 16, 2, [0.2, 0.4, 0.6])):
        row = bench.summarise(mode, 0, _mode_run(tmp_path / tag, mode, ys, played, updates, wexp))
        bench.write_seed_result(bench.RESULTS / tag, tag, row, dict(bench.SETTINGS), {"steps": 8}, 1,
                                _host("Intel Xeon", 2400))
    assert bench.main(["--report", "--tag", "eq", "--baseline-tag", "default", "--modes", "grpo,crl", "--seeds", "0,1"]) == 1
    table = (bench.RESULTS / "eq" / "table.md").read_text()
    assert "| grpo | 0 |" in table and "- crl - grpo, equal steps: seed 0 at step 8: +10.0" in table
    err = capsys.readouterr().err
    assert "crl seed 1: no result" in err and "grpo seed 1" not in err  # grpo's seeds are the baseline's to have
