"""Scores never wait for a long generation: they run between its decoding steps (continuous batching).

Deterministic by decoding-step counts, not wall time: a hook the engine calls after each decoding step
submits a score at step 3 and, at a later step (20 of a 120-step generation, or the step the bound
names), holds the decoding thread until that score has returned; only interleaving lets it return
there. Holding the decoder there is what makes the step count independent of load: the event loop
that runs the score's callback may lag the decoding thread by several steps on a busy machine.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("torch")

from crl_agent.llm import SamplingParams  # noqa: E402
from crl_agent.llm.batching import RequestBatcher  # noqa: E402
from crl_agent.llm.transformers_backend import TransformersLLM  # noqa: E402

CHAT = [{"role": "system", "content": "You write long notes."}, {"role": "user", "content": "Describe the room."}]
ASK = [{"role": "system", "content": "You pick moves."}, {"role": "user", "content": "The stairs are east. Move?"}]
MOVES = ["north", "south", "east", "west", "wait"]
GEN_TOKENS = 120


def _backend(tiny, interleave_steps: int) -> TransformersLLM:
    llm = TransformersLLM(tiny, dtype="float32", prefix_cache_bytes=0, interleave_steps=interleave_steps)
    llm.eos_ids = set()  # every generation decodes its full length
    return llm


def _score_during_generation(llm: TransformersLLM, wait_s: float, n_scores: int = 1, submit_at: int = 3,
                             wait_at: int = 20):
    """Generate GEN_TOKENS greedily; at decoding step ``submit_at`` submit ``n_scores`` scores, at step ``wait_at``
    wait up to ``wait_s`` for them. Returns (completion, scores, returned-by-step-``wait_at``, step counts seen
    when each score returned, whether the generation had finished when the first score returned)."""
    steps: list[int] = []
    scores_done = threading.Event()
    waited: list[bool] = []
    seen_at: list[int] = []
    gen_done_first: list[bool] = []
    holder: dict = {}

    async def main():
        loop = asyncio.get_running_loop()

        async def start_scores():
            def returned(_):
                seen_at.append(steps[-1] if steps else 0)
                gen_done_first.append(holder["gen"].done())
                if len(seen_at) == n_scores:
                    scores_done.set()

            holder["scores"] = [asyncio.ensure_future(llm.score(ASK, MOVES[: 3 + k])) for k in range(n_scores)]
            for t in holder["scores"]:
                t.add_done_callback(returned)

        def hook(step: int) -> None:
            steps.append(step)
            if step == submit_at:
                offered = llm.batch_stats.offered
                asyncio.run_coroutine_threadsafe(start_scores(), loop).result(10)
                deadline = time.monotonic() + (10 if llm.interleave_steps else 0.2)
                while llm.batch_stats.offered < offered + n_scores and time.monotonic() < deadline:
                    time.sleep(0.001)  # until the batcher has put them within this batch's reach
            if step == wait_at:
                waited.append(scores_done.wait(wait_s))

        llm._engine.on_decode_step = hook
        holder["gen"] = asyncio.ensure_future(llm.chat(CHAT, SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0)))
        completion = await holder["gen"]
        scores = await asyncio.gather(*holder["scores"])
        llm._engine.on_decode_step = None
        return completion, scores

    completion, scores = asyncio.run(main())
    return completion, scores, waited, seen_at, gen_done_first


def test_a_score_submitted_while_a_generation_decodes_returns_before_it_finishes(tiny, one_thread):
    llm = _backend(tiny, interleave_steps=2)
    try:
        completion, (scores,), waited, seen_at, gen_done_first = _score_during_generation(llm, wait_s=30,
                                                                                          wait_at=3 + 2 + 1)
        assert waited == [True]  # back by decoding step 6 of 120 (taken in at step 4)
        assert seen_at[0] <= 3 + 2 + 1 and gen_done_first == [False]
        assert llm.batch_stats.interleaved == 1
        assert len(completion.token_ids) == GEN_TOKENS
        # identical to the same requests run alone
        alone_score = asyncio.run(llm.score(ASK, MOVES[:3]))
        alone_gen = asyncio.run(llm.chat(CHAT, SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0)))
        assert scores == alone_score
        assert completion.token_ids == alone_gen.token_ids and completion.logprobs == alone_gen.logprobs
    finally:
        asyncio.run(llm.aclose())


def test_several_interleaved_scores_run_together_and_match_their_unbatched_values(tiny, one_thread):
    llm = _backend(tiny, interleave_steps=4)
    try:
        completion, scores, waited, seen_at, _ = _score_during_generation(llm, wait_s=30, n_scores=3, wait_at=19)
        assert waited == [True] and max(seen_at) < 20
        assert llm.batch_stats.interleaved == 3

        async def together():  # the same three as one batch of their own, no generation running
            return await asyncio.gather(*(llm.score(ASK, MOVES[: 3 + k]) for k in range(3)))

        assert scores == asyncio.run(together())
        for k, got in enumerate(scores):  # and each alone, up to the rounding of a padded batch
            assert got == pytest.approx(asyncio.run(llm.score(ASK, MOVES[: 3 + k])), abs=1e-4)
    finally:
        asyncio.run(llm.aclose())


def test_without_interleaving_the_score_waits_for_the_whole_generation(tiny, one_thread):
    """The baseline the two tests above improve on (and proof that they can fail)."""
    llm = _backend(tiny, interleave_steps=0)
    try:
        completion, (scores,), waited, seen_at, gen_done_first = _score_during_generation(llm, wait_s=0.5)
        assert waited == [False] and seen_at == [GEN_TOKENS - 1] and len(completion.token_ids) == GEN_TOKENS
        assert scores == asyncio.run(llm.score(ASK, MOVES[:3]))
    finally:
        asyncio.run(llm.aclose())


def test_scores_in_a_generations_own_batch_are_delivered_before_it_decodes(tiny, one_thread):
    llm = _backend(tiny, interleave_steps=4)
    first_step_done: list[bool] = []

    async def main():
        score = asyncio.ensure_future(llm.score(ASK, MOVES))
        gen = asyncio.ensure_future(llm.chat(CHAT, SamplingParams(max_tokens=40, temperature=0.0)))

        def hook(step):
            if step == 1:
                time.sleep(0.05)  # leave the loop time to run the score's callbacks
                first_step_done.append(score.done())

        llm._engine.on_decode_step = hook
        await asyncio.gather(score, gen)
        return llm.batch_stats.sizes

    try:
        sizes = asyncio.run(main())
        assert sizes[0] == 2 and first_step_done == [True]
    finally:
        asyncio.run(llm.aclose())


def test_batcher_carries_untaken_and_refused_requests_into_the_next_batch():
    """A running batch takes what ``interleave`` allows when it asks; the rest runs next, before newer work."""
    batches: list[list[str]] = []
    started = threading.Event()

    def run(reqs, window):
        batches.append(list(reqs))
        if reqs == ["long"]:
            started.set()
            deadline = time.monotonic() + 10
            while window._stats.offered < 2 and time.monotonic() < deadline:
                time.sleep(0.001)
            for req, resolve in window.take():
                resolve(f"{req} inside")
        return [f"{r} done" for r in reqs]

    async def main():
        b = RequestBatcher(run, max_batch_size=8, max_wait_s=0.001, interleave=lambda r: r.startswith("score"))
        long = asyncio.ensure_future(b.submit("long"))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        gen = asyncio.ensure_future(b.submit("gen"))
        s1, s2 = b.submit("score1"), b.submit("score2")
        out = await asyncio.gather(long, gen, s1, s2)
        await b.aclose()
        return out, b.stats

    out, stats = asyncio.run(main())
    assert out == ["long done", "gen done", "score1 inside", "score2 inside"]
    assert batches == [["long"], ["gen"]] and stats.interleaved == 2 and stats.offered == 2


# ------------------------------------------------------------------ generations join a decoding batch
class _Window:
    """A batch window by hand: requests offered to the running batch, and what it resolved at which step."""

    def __init__(self, engine):
        self.engine, self.inbox, self.resolved = engine, [], {}
        self.step = 0

    def offer(self, name, req):
        self.inbox.append((req, lambda res, name=name: self.resolved.setdefault(name, (res, self.step))))

    def take(self, accept=None):
        taken = [x for x in self.inbox if accept is None or accept(x[0])]
        self.inbox = [x for x in self.inbox if x not in taken]
        return taken

    def deliver(self, index, result):
        self.resolved.setdefault(f"batch{index}", (result, self.step))


def _gen_req(llm, chat, max_new, temperature=0.0, seed=0):
    from crl_agent.llm.hf_engine import GenRequest

    return GenRequest(llm.render(chat), SamplingParams(max_tokens=max_new, temperature=temperature), max_new, seed)


@pytest.mark.parametrize("kv_room", [True, False])
def test_generations_that_arrive_mid_decode_join_the_batch_and_decode_what_they_would_alone(tiny, kv_room,
                                                                                           monkeypatch):
    """Two chats offered at decoding step 2 of a 40-token generation join it at step 4, return long before it
    ends, and decode the tokens (and log-probs) they decode alone; the long row is undisturbed. With kv_room
    the joined rows are written once into buffers with room (no second copy by make_room); without it the
    plain copying cache merges them."""
    from crl_agent.llm import kv_room as kv_room_module

    made = []
    real = kv_room_module.make_room
    monkeypatch.setattr(kv_room_module, "make_room", lambda cache, room: (made.append(room), real(cache, room))[1])
    llm = TransformersLLM(tiny, dtype="float32", prefix_cache_bytes=2**26, interleave_steps=4)
    llm.eos_ids = set()
    engine = llm._engine
    engine.kv_room = kv_room
    long = _gen_req(llm, CHAT, 40)
    shorts = {"greedy": _gen_req(llm, ASK, 6), "sampled": _gen_req(llm, ASK + [{"role": "user", "content": "Go."}],
                                                                    8, temperature=1.0, seed=7)}
    window = _Window(engine)

    def hook(step):
        window.step = step
        if step == 2:
            for name, req in shorts.items():
                window.offer(name, req)

    engine.on_decode_step = hook
    try:
        got_long = engine.run([long], window)[0]
        engine.on_decode_step = None
        assert engine.joined == 2 and not window.inbox
        assert made == ([40] if kv_room else [])  # the batch's start only: the join wrote into room itself
        for name, req in shorts.items():
            res, step = window.resolved[name]
            alone = engine.run([type(req)(**req.__dict__)])[0]
            assert step <= 4 + req.max_new < 40, f"{name} returned at step {step}, after the long generation"
            assert res.token_ids == alone.token_ids and len(res.token_ids) == req.max_new
            assert res.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
            assert res.sampling_logprobs == pytest.approx(alone.sampling_logprobs, abs=1e-4)
        alone_long = engine.run([_gen_req(llm, CHAT, 40)])[0]
        assert got_long.token_ids == alone_long.token_ids
        assert got_long.logprobs == pytest.approx(alone_long.logprobs, abs=1e-4)
        assert window.resolved["batch0"][1] == 39  # the batch's own request is delivered when it finishes
    finally:
        asyncio.run(llm.aclose())


def test_a_batch_takes_in_at_most_max_rows_generations_and_leaves_the_rest_for_the_next(tiny):
    """max_rows 2: one row decodes, so one chat joins at a time, two in all; the third is left offered."""
    llm = TransformersLLM(tiny, dtype="float32", prefix_cache_bytes=0, interleave_steps=2, max_batch_size=2)
    llm.eos_ids = set()
    engine = llm._engine
    window = _Window(engine)

    def hook(step):
        window.step = step
        if step == 1:
            for k in range(3):
                window.offer(f"short{k}", _gen_req(llm, ASK, 3, seed=k))

    engine.on_decode_step = hook
    try:
        engine.run([_gen_req(llm, CHAT, 30)], window)
        assert engine.joined == 2 and len(window.inbox) == 1
        assert {"short0", "short1"} <= set(window.resolved) and "short2" not in window.resolved
        assert window.resolved["short0"][1] < window.resolved["short1"][1] < 29
    finally:
        asyncio.run(llm.aclose())


def test_a_chat_sent_while_another_decodes_joins_it_through_the_backend(tiny):
    """End to end: the batcher offers the second chat to the running batch, which takes it in (one batch,
    not two), and both return what they return alone."""
    llm = _backend(tiny, interleave_steps=4)
    short_params = SamplingParams(max_tokens=5, temperature=0.0)
    long_params = SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0)

    async def main():
        loop = asyncio.get_running_loop()
        holder = {}

        def hook(step):
            if step == 2:
                holder["short"] = asyncio.run_coroutine_threadsafe(llm.chat(ASK, short_params), loop)
            if step == 3:  # hold the decoder until the batcher has offered the chat to this batch
                deadline = time.monotonic() + 30
                while llm.batch_stats.offered < 1 and time.monotonic() < deadline:
                    time.sleep(0.005)

        llm._engine.on_decode_step = hook
        long = await llm.chat(CHAT, long_params)
        short = await asyncio.wrap_future(holder["short"])
        llm._engine.on_decode_step = None
        return long, short, list(llm.batch_stats.sizes)

    try:
        long, short, sizes = asyncio.run(main())
        assert sizes == [1] and llm._engine.joined == 1, "the second chat did not join the running batch"
        alone_short = asyncio.run(llm.chat(ASK, short_params))
        alone_long = asyncio.run(llm.chat(CHAT, long_params))
        assert short.token_ids == alone_short.token_ids and long.token_ids == alone_long.token_ids
    finally:
        asyncio.run(llm.aclose())
