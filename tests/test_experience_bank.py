from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytest.importorskip("hnswlib", reason="the experience bank needs the agent extra")

from crl_agent.experience import BankError, DiversityConfig, ExperienceBank, HashingEmbedder, Retriever  # noqa: E402
from crl_agent.experience.bank import ExperienceEntry  # noqa: E402
from crl_agent.experience.retrieval import diversify  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = [
    ("crl/Sokoban-6x6-2-v0", "Corners", "If a box is pushed into a corner, then the level cannot be solved."),
    ("crl/Sokoban-6x6-2-v0", "Walls", "If a box is on a wall without a goal, then never push it along the wall."),
    ("crl/MiniHack-KeyRoom-S5-v0", "Keys", "If the door is locked, then pick up the key before walking to it."),
    ("crl/WebShop-v0", "Budget", "If the price is above the budget, then go back to search results."),
]


@pytest.fixture
def bank(tmp_path):
    b = ExperienceBank(tmp_path / "bank", embedder="hash")
    for task, title, content in RULES:
        b.add(task, title, content, sources=["t0"])
    yield b
    b.close()


def test_search_ranks_the_matching_rule_first_and_filters_by_task(bank):
    (top, sim), *_ = bank.search("the door is locked, where is the key", k=2)
    assert top.title == "Keys" and 0 < sim <= 1
    hits = bank.search("box corner wall", k=8, task="crl/Sokoban-6x6-2-v0")
    assert {e.title for e, _ in hits} == {"Corners", "Walls"}
    assert bank.search("anything", k=3, task="no/such-task") == []


def test_task_views_and_counts(bank):
    view = bank.view("crl/Sokoban-6x6-2-v0")
    assert len(view) == 2 and {e.title for e in view.entries()} == {"Corners", "Walls"}
    assert view.search("corner", k=1)[0][0].title == "Corners"
    assert bank.tasks() == {"crl/MiniHack-KeyRoom-S5-v0": 1, "crl/Sokoban-6x6-2-v0": 2, "crl/WebShop-v0": 1}


def test_update_reembeds_and_delete_removes_from_index(bank):
    keys = bank.search("locked door key", k=1)[0][0]
    bank.update(keys.id, title="Levers", content="If a lever is visible, then pull it to open the gate.",
                sources=["t1"])
    assert bank.search("pull the lever gate", k=1)[0][0].id == keys.id
    assert bank.get(keys.id).sources == ["t0", "t1"]
    gen = bank.generation
    assert bank.delete([keys.id, 12345]) == 1
    assert bank.generation == gen + 1 and keys.id not in bank
    assert all(e.id != keys.id for e, _ in bank.search("pull the lever gate", k=4))
    assert bank.check_consistency() == []


def test_invalid_entries_are_rejected_without_touching_the_bank(bank):
    n, gen = len(bank), bank.generation
    with pytest.raises(ValueError, match="non-empty"):
        bank.add("t", "  ", "content")
    with pytest.raises(KeyError):
        bank.update(999, title="x")
    assert len(bank) == n and bank.generation == gen and bank.check_consistency() == []


def test_replace_commits_additions_and_deletions_together(bank):
    ids = bank.ids("crl/Sokoban-6x6-2-v0")
    new = bank.replace(ids, [("crl/Sokoban-6x6-2-v0", "Boxes", "If a box is stuck, then restart.", ["t0"], "c1")])
    assert bank.ids("crl/Sokoban-6x6-2-v0") == [new[0].id] and new[0].origin == "c1"
    assert bank.check_consistency() == []


def test_a_bank_written_by_one_run_is_read_by_the_next(tmp_path):
    with ExperienceBank(tmp_path / "b", embedder="hash") as b:
        for task, title, content in RULES:
            b.add(task, title, content)
        b.record_retrieval(b.ids()[:1], now=123.0)
        expected = [(e.id, e.title) for e, _ in b.search("locked door key", k=3)]
    with ExperienceBank(tmp_path / "b", embedder="hash") as b:
        assert not b.rebuilt_index  # the saved index matched SQLite's generation
        assert [(e.id, e.title) for e, _ in b.search("locked door key", k=3)] == expected
        assert b.get(b.ids()[0]).retrieve_count == 1 and b.get(b.ids()[0]).last_retrieved == 123.0
        new = b.add("t", "New", "If new, then fresh.")
        assert new.id == max(i for i, _ in expected) + 1 or new.id > max(b.ids()[:-1])


CRASHER = textwrap.dedent(
    """
    import json, os, sys
    from crl_agent.experience import ExperienceBank
    b = ExperienceBank(sys.argv[1], embedder="hash")
    first, second = json.loads(sys.argv[2])
    b.add(*first)
    b.save()
    b.add(*second)  # after the save: the index file on disk is now one generation behind
    os._exit(0)  # a crash: no close(), no save()
    """
)


def test_a_stale_index_is_rebuilt_from_sqlite(tmp_path):
    rules = json.dumps([RULES[0], RULES[2]])
    subprocess.run([sys.executable, "-c", CRASHER, str(tmp_path / "b"), rules], cwd=REPO, check=True, timeout=120)
    with ExperienceBank(tmp_path / "b", embedder="hash") as b2:
        assert b2.rebuilt_index and len(b2) == 2 and b2.check_consistency() == []
        assert b2.search("locked door key", k=1)[0][0].title == "Keys"


def test_a_corrupt_index_file_is_rebuilt(tmp_path):
    with ExperienceBank(tmp_path / "b", embedder="hash") as b:
        b.add(*RULES[0])
    (index_file,) = (tmp_path / "b").glob("index-*.hnsw")
    index_file.write_bytes(b"garbage")
    with ExperienceBank(tmp_path / "b", embedder="hash") as b:
        assert b.rebuilt_index and b.check_consistency() == []


def test_opening_with_another_embedder_names_the_fix_or_reembeds(tmp_path):
    with ExperienceBank(tmp_path / "b", embedder="hash:64") as b:
        b.add(*RULES[2])
    with pytest.raises(BankError, match="reembed=True"):
        ExperienceBank(tmp_path / "b", embedder="hash:128")
    with ExperienceBank(tmp_path / "b", embedder="hash:128", reembed=True) as b:
        assert b.dim == 128 and b.search("locked door key", k=1)[0][0].title == "Keys"
        assert b.check_consistency() == []


def test_a_bank_open_elsewhere_is_refused(tmp_path):
    with ExperienceBank(tmp_path / "b", embedder="hash"):
        with pytest.raises(BankError, match="open in another process"):
            ExperienceBank(tmp_path / "b", embedder="hash")


def test_index_grows_past_its_capacity_and_matches_exact_search(tmp_path):
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(3000, 32)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    with ExperienceBank(tmp_path / "b", embedder=HashingEmbedder(32), brute_force_below=0) as b:
        for start in range(0, 3000, 1000):
            items = [("big" if i % 2 else "small", f"t{i}", f"c{i}", [], None) for i in range(start, start + 1000)]
            b.add_many(items, embeddings=vecs[start : start + 1000])
        q = rng.normal(size=(20, 32)).astype(np.float32)
        ann = b.search_vectors(q, 8)
        exact = b.search_exact(q, 8)
        recall = np.mean([len({i for i, _ in a} & {i for i, _ in e}) / 8 for a, e in zip(ann, exact, strict=True)])
        assert recall >= 0.9
        filtered = b.search_vectors(q, 8, task="big")
        assert all(b.get(i).task == "big" for row in filtered for i, _ in row)
        assert b.check_consistency() == []


def _e(i: int, count: int = 0, last: float | None = None) -> ExperienceEntry:
    return ExperienceEntry(i, "t", f"t{i}", "c", 0.0, 0.0, retrieve_count=count, last_retrieved=last)


def test_diversified_score_penalises_popular_and_recent_entries():
    now, cfg = 1000.0, DiversityConfig(dropout_p=0.0)
    rng = np.random.default_rng(0)
    fresh = [_e(0), _e(1), _e(2)]
    assert [e.id for e in diversify(fresh, 2, cfg, rng, now)] == [0, 1]
    # rank 0 retrieved 20 times: -0 - 0.4*log1p(20) = -1.22 < -1 (rank 1): it drops behind
    assert [e.id for e in diversify([_e(0, 20), _e(1), _e(2)], 2, cfg, rng, now)] == [1, 0]
    # recently retrieved (within 300 s) costs 1; an old retrieval costs nothing
    assert [e.id for e in diversify([_e(0, 0, now - 10), _e(1), _e(2)], 2, cfg, rng, now)] == [0, 1]
    assert [e.id for e in diversify([_e(0, 1, now - 10), _e(1), _e(2)], 2, cfg, rng, now)] == [1, 0]
    assert [e.id for e in diversify([_e(0, 1, now - 900), _e(1), _e(2)], 2, cfg, rng, now)] == [0, 1]


def test_dropout_move_sends_a_recent_top_entry_to_the_end():
    now = 1000.0
    cands = [_e(0, 0, now - 5), _e(1), _e(2)]
    always = diversify(cands, 2, DiversityConfig(dropout_p=1.0, lam=0.0, recent_window_s=300), np.random.default_rng(0), now)
    assert [e.id for e in always] == [1, 2]
    never = diversify(cands, 2, DiversityConfig(dropout_p=0.0, lam=0.0, recent_window_s=0.0), np.random.default_rng(0), now)
    assert [e.id for e in never] == [0, 1]


def test_retriever_updates_usage_stats_and_is_reproducible(tmp_path):
    picks = []
    for run in range(2):
        with ExperienceBank(tmp_path / f"b{run}", embedder="hash") as b:
            for task, title, content in RULES:
                b.add(task, title, content)
            r = Retriever(b, seed=7)
            picks.append([[e.id for e in r.retrieve("box on the goal", k=2, now=100.0 + i)] for i in range(6)])
            assert sum(e.retrieve_count for e in b.entries()) == 12
    assert picks[0] == picks[1]
    assert len({tuple(p) for p in picks[0]}) > 1  # diversification rotates what the actor sees


WRITER = textwrap.dedent(
    """
    import hashlib, random, sys, time
    from crl_agent.experience import ExperienceBank
    b = ExperienceBank(sys.argv[1], embedder="hash:64")
    rng = random.Random(int(sys.argv[2]))
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        title = f"rule {sys.argv[2]}-{i}"
        body = " ".join(rng.choice(["box", "wall", "key", "door", "goal", "left", "up"]) for _ in range(12))
        content = body + " #" + hashlib.sha1((title + body).encode()).hexdigest()[:12]
        op = rng.random()
        ids = b.ids()
        if op < 0.6 or len(ids) < 5:
            b.add_many([("t", title, content, [], None) for _ in range(rng.randint(1, 4))])
        elif op < 0.8:
            b.update(rng.choice(ids), title=title, content=content)
        elif op < 0.9:
            b.delete(rng.sample(ids, 2))
        else:
            b.replace(rng.sample(ids, 2), [("t", title, content, [], None)])
        if i % 7 == 0:
            b.save()
        if len(sys.argv) > 3 and i == 10:  # committed to SQLite, not saved to the index file: wait for the kill
            print("paused", flush=True)
            time.sleep(600)
    """
)


def _check_intact(path) -> tuple[int, bool]:
    with ExperienceBank(path, embedder="hash:64") as b:
        assert b.check_consistency() == []
        for e in b.entries():
            body, _, digest = e.content.rpartition(" #")
            assert hashlib.sha1((e.title + body).encode()).hexdigest()[:12] == digest, "half-written entry"
        if len(b):
            e = b.entries()[-1]
            assert b.search(e.text, k=1)[0][0].text == e.text
        return len(b), b.rebuilt_index


def test_kill_9_during_writes_leaves_a_consistent_bank(tmp_path):
    path = tmp_path / "bank"
    outcomes = []
    for round_ in range(4):
        pause = ["pause"] if round_ == 3 else []  # one kill surely leaves the saved index behind SQLite
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(round_), *pause], cwd=REPO,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        if pause:
            assert proc.stdout.readline().strip() == "paused"
        else:
            time.sleep(0.3 + 0.2 * round_)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        outcomes.append(_check_intact(path))
    assert outcomes[-1][0] > 0
    assert any(rebuilt for _, rebuilt in outcomes)  # some kill left a stale index behind, and it was rebuilt


def test_closed_and_search_exact_are_public(tmp_path):
    b = ExperienceBank(tmp_path / "b", embedder="hash")
    for rule in RULES:
        b.add(*rule)
    assert not b.closed
    q = b.embedder.embed(["locked door key"])
    best = b.search_exact(q, 2)[0]
    assert [b.get(i).title for i, _ in best][0] == "Keys" and best[0][1] >= best[1][1]
    only_sokoban = b.search_exact(q, 8, task="crl/Sokoban-6x6-2-v0")[0]
    assert {b.get(i).title for i, _ in only_sokoban} == {"Corners", "Walls"}
    assert b.search_exact(q, 3, task="no such task") == [[]]
    b.close()
    assert b.closed


def test_a_small_task_search_sees_every_add_update_and_delete(tmp_path):
    task = "crl/Sokoban-6x6-2-v0"
    with ExperienceBank(tmp_path / "b", embedder="hash") as b:
        b.add(*RULES[0])
        b.add(*RULES[1])
        b.add(*RULES[2])  # another task: never returned for this one

        def titles(query: str) -> list[str]:
            return [b.get(i).title for i, _ in b.search_vectors(b.embedder.embed([query]), 8, task)[0]]

        assert set(titles("locked door key")) == {"Corners", "Walls"}
        keys = b.add(task, "Keys here", "If the door is locked, then pick up the key.")
        assert titles("locked door key")[0] == "Keys here"
        b.update(keys.id, content="If a box is stuck, then restart.")
        assert titles("box stuck restart")[0] == "Keys here"
        b.delete([keys.id])
        assert set(titles("locked door key")) == {"Corners", "Walls"}
        assert "Keys here" not in titles("box stuck restart")
