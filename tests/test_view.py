"""The viewer's site generator (``python -m eval.view``, ``leaderboards.build --html``) without a browser."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from eval.fmt import pct
from eval.trajectories import load_trajectories
from eval.view import build_site
from eval.view import site as site_mod
from eval.view.__main__ import main as view_main
from tests import view_fixtures as F


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {
        "random": F.write_run(root / "random", [F.play_sokoban(s, "random") for s in range(4)], {"name": "random"}),
        "oracle": F.write_run(root / "oracle", [F.play_sokoban(s, "oracle") for s in range(4)], {"name": "oracle"}),
        "hostile": F.write_run(root / "hostile", F.hostile_records(), {"name": "llm"}),
        "old": F.write_run(root / "old", [F.play_sokoban(s, "random") for s in range(2)], {"name": "random"},
                           trajectories=False),
    }


def _data(path: Path):
    """The data a ``CRLVIEW.put(key, data);`` file carries."""
    m = re.fullmatch(r'CRLVIEW\.put\(("[^"]*"),JSON\.parse\((".*")\)\);\n', path.read_text(encoding="utf-8"), re.S)
    assert m, path
    return json.loads(m.group(1)), json.loads(json.loads(m.group(2)))


def _manifest(out: Path) -> dict:
    return _data(out / "data" / "site.js")[1]


def test_the_site_is_self_contained_with_a_csp_and_no_remote_loads(runs, tmp_path, capsys):
    out = tmp_path / "site"
    assert view_main([str(runs["random"]), str(runs["oracle"]), "--out", str(out)]) == 0
    assert "file://" in capsys.readouterr().out
    html = (out / "index.html").read_text()
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html).group(1)
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    for src in re.findall(r'(?:src|href)="([^"#]+)"', html):
        if src == "data:,":  # the empty favicon, so no browser asks a server for /favicon.ico
            continue
        assert not re.match(r"[a-z]+:", src), f"{src}: remote or absolute load"
        assert (out / src).is_file(), src
    for f in out.rglob("*"):
        if f.suffix in (".js", ".css", ".html"):
            assert not re.search(r"https?://\w", f.read_text()), f"{f}: names a remote address"
    assert "<script>" not in html.split("</head>")[1].replace('<script src="', "")  # no inline script


def test_every_episode_and_step_reaches_the_data_files(runs, tmp_path):
    out = tmp_path / "site"
    build_site(out, [runs["random"]])
    run = _manifest(out)["runs"][0]
    index = _data(out / "data" / run["id"] / "index.js")[1]
    fields = index["fields"]
    trajs = {(t["env_id"], t["seed"]): t for t in load_trajectories(runs["random"])}
    assert len(index["rows"]) == len(trajs) == run["episodes"] == run["trajectories"]
    for row in index["rows"]:
        ep = dict(zip(fields, row, strict=True))
        chunk = _data(out / "data" / run["id"] / f"traj-{ep['chunk'][0]}.js")[1][ep["chunk"][1]]
        traj = trajs[(run["tasks"][ep["task"]], ep["seed"])]
        assert [s[1] for s in chunk["steps"]] == [s["action"] for s in traj["steps"]]
        assert [s[0] for s in chunk["steps"]] == [s["observation"] for s in traj["steps"]]
        assert ep["success"] == traj["summary"]["success"] and ep["actions"] == len(traj["steps"])


def test_a_large_run_is_split_into_chunks_each_episode_findable(runs, tmp_path, monkeypatch):
    monkeypatch.setattr(site_mod, "CHUNK_BYTES", 2000)
    monkeypatch.setattr(site_mod, "SEARCH_CHUNK_BYTES", 500)
    out = tmp_path / "site"
    build_site(out, [runs["random"]])
    run = _manifest(out)["runs"][0]
    assert run["chunks"] > 1 and len(run["search_starts"]) > 1
    rows = _data(out / "data" / run["id"] / "index.js")[1]["rows"]
    assert len({tuple(r[-1]) for r in rows}) == len(rows)
    texts = [t for c in range(len(run["search_starts"])) for t in _data(out / "data" / run["id"] / f"search-{c}.js")[1]]
    assert len(texts) == len(rows)
    assert all(t == t.lower() for t in texts)


def test_hostile_strings_are_carried_as_data_unchanged(runs, tmp_path):
    out = tmp_path / "site"
    build_site(out, [runs["hostile"]])
    run = _manifest(out)["runs"][0]
    eps = [e for c in range(run["chunks"]) for e in _data(out / "data" / run["id"] / f"traj-{c}.js")[1]]
    actions = [s[1] for e in eps for s in e["steps"]]
    assert actions == F.HOSTILE * 2
    assert any(F.BIG_LINE in s[0] for e in eps for s in e["steps"])
    turn = eps[0]["steps"][0][10]
    assert turn["messages"][0]["content"].endswith(F.HOSTILE[0]) and "token_ids" not in turn
    for f in (out / "data").rglob("*.js"):
        assert f.read_bytes().isascii(), f  # no raw U+2028 or lone surrogate can break a script


def test_a_run_without_trajectories_shows_summaries_only(runs, tmp_path):
    out = tmp_path / "site"
    build_site(out, [runs["old"]])
    run = _manifest(out)["runs"][0]
    assert run["episodes"] == 2 and run["trajectories"] == 0 and run["chunks"] == 0
    rows = _data(out / "data" / run["id"] / "index.js")[1]["rows"]
    assert all(r[-1] is None and r[-2] is False for r in rows)


def test_a_torn_trajectories_file_keeps_the_complete_episodes(runs, tmp_path):
    run = shutil.copytree(runs["random"], tmp_path / "torn")
    path = run / "trajectories.jsonl.gz"
    data = path.read_bytes()
    path.write_bytes(data + gzip.compress(b'{"key": "x", "steps": [')[:-9])
    with pytest.warns(UserWarning, match="torn"):
        assert len(load_trajectories(run)) == 4
    out = tmp_path / "site"
    stats = build_site(out, [run])  # the build names the cut in its warnings (printed, and on the run page)
    assert any(str(path) in w and "torn" in w for w in stats.warnings), stats.warnings
    manifest_run = _manifest(out)["runs"][0]
    assert manifest_run["trajectories"] == 4 and manifest_run["trajectories_file"] == "cut"
    assert manifest_run["warnings"] == stats.warnings


def test_bad_inputs_give_clear_errors(runs, tmp_path, capsys):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep me")
    with pytest.raises(SystemExit) as e:
        view_main([str(runs["random"]), "--out", str(other)])
    assert e.value.code == 2 and "not a crl-bench site" in capsys.readouterr().err
    assert (other / "mine.txt").read_text() == "keep me"
    with pytest.raises(SystemExit):
        view_main([str(tmp_path / "missing"), "--out", str(tmp_path / "s")])
    assert "missing: not found (no such folder)" in capsys.readouterr().err
    out = tmp_path / "again"
    build_site(out, [runs["random"], runs["oracle"]])
    build_site(out, [runs["oracle"]])  # an earlier site is rebuilt whole, no stale run left
    assert [p.name for p in (out / "data").iterdir() if p.is_dir()] == ["oracle"]


def test_two_runs_with_the_same_folder_name_get_distinct_ids(runs, tmp_path):
    twin = shutil.copytree(runs["random"], tmp_path / "x" / "random")
    out = tmp_path / "site"
    build_site(out, [runs["random"], twin])
    ids = [r["id"] for r in _manifest(out)["runs"]]
    assert ids == ["random", "random-2"]


def test_pct_has_one_rule_for_missing_values():
    assert pct(0.1234) == "12.3" and pct(float("nan")) == "n/a" and pct(None) == "n/a" and pct(1.0) == "100.0"


def test_leaderboard_html_links_every_row_to_its_run_page(runs, tmp_path, capsys):
    from leaderboards.build import ROOT
    from leaderboards.build import main as board_main

    subs = tmp_path / "subs"
    shutil.copytree(ROOT / "submissions", subs)
    sub = shutil.copytree(runs["oracle"], subs / "2026-12-04_oracle-traj")
    (sub / "metadata.yaml").write_text("name: oracle with steps\nmodel: none\nagent: oracle\ndate: '2026-12-04'\n"
                                       "url: https://example.org/x\nverified: false\n")
    out = tmp_path / "board"
    assert board_main(["--submissions", str(subs), "--out", str(tmp_path / "board.md"), "--html", str(out)]) == 0
    manifest = _manifest(out)
    ids = {r["id"] for r in manifest["runs"]}
    entries = [e for g in manifest["leaderboard"]["groups"] for e in g["entries"]]
    assert len(entries) == len(list(subs.iterdir())) and all(e["run"] in ids for e in entries)
    mine = next(r for r in manifest["runs"] if r["label"] == "oracle with steps")
    assert mine["trajectories"] == 4
    assert "oracle with steps" in (tmp_path / "board.md").read_text()


@pytest.mark.parametrize("url", ["javascript:alert(1)", "data:text/html,x", "ftp://x"])
def test_a_submission_url_must_be_a_web_address(tmp_path, url):
    from leaderboards.build import ROOT
    from leaderboards.schema import SubmissionError, load_submission

    sub = shutil.copytree(sorted(p for p in (ROOT / "submissions").iterdir() if p.is_dir())[0], tmp_path / "s")
    meta = (sub / "metadata.yaml").read_text()
    (sub / "metadata.yaml").write_text(re.sub(r"url: .*", f"url: '{url}'", meta))
    with pytest.raises(SubmissionError, match="url: .* is not an http"):
        load_submission(sub)


def test_samples_of_one_seed_are_separate_episodes(tmp_path):
    recs = []
    for sample in range(2):
        r = F.play_sokoban(0, "random", rng_seed=sample)
        r.update(sample=sample, key=f"{r['env_id']}#0#{sample}")
        recs.append(r)
    run = F.write_run(tmp_path / "k2", recs, {"name": "random"})
    out = tmp_path / "site"
    build_site(out, [run])
    rows = _data(out / "data" / "k2" / "index.js")[1]["rows"]
    assert [(r[1], r[2]) for r in rows] == [(0, 0), (0, 1)]
    assert rows[0][-1] != rows[1][-1]


def test_malformed_trajectory_fields_become_text_not_a_crash(tmp_path):
    rec = F.play_sokoban(0, "random", max_steps=3)
    rec["steps"] += ["not a step", {"observation": None, "action": 7, "reward": "x", "turn": "odd",
                                    "info": ["not", "a", "dict"], "admissible_actions": [1, None]}]
    rec["steps"][0]["reward"] = float("nan")
    rec["task"] = None
    stray = {**rec, "seed": [1, 2], "key": "stray"}  # no summary line, and a seed no key can hold
    run = F.write_run(tmp_path / "odd", [rec], {"name": "random"})
    with (run / "trajectories.jsonl.gz").open("ab") as f:
        f.write(gzip.compress((json.dumps(stray) + "\n").encode()))
    out = tmp_path / "site"
    build_site(out, [run])
    assert _manifest(out)["runs"][0]["episodes"] == 1  # the stray record is outside the run's seeds
    ep = _data(out / "data" / "odd" / "traj-0.js")[1][0]
    assert ep["steps"][0][2] is None  # NaN reward: null, not an invalid JSON literal
    odd = ep["steps"][-1]
    assert odd[:3] == ["", "7", None] and odd[10] is None and ep["adm"][odd[8]] == ["1", ""]


def test_a_folder_of_runs_shows_every_run_in_it(runs, tmp_path):
    sweep = tmp_path / "sweep"
    for name in ("random", "oracle"):
        shutil.copytree(runs[name], sweep / name)
    (sweep / "notes").mkdir()
    out = tmp_path / "site"
    build_site(out, [sweep])
    assert [r["id"] for r in _manifest(out)["runs"]] == ["oracle", "random"]
