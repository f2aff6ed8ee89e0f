"""ExperienceManager: the asyncio service between actors, the bank and the extractor.

- **search**: requests are micro-batched (``batch_size`` 32, ``max_wait_ms`` 5) by the
  :class:`~crl_agent.llm.batching.RequestBatcher` the local LLM backends use: one embedder call
  and one index pass per batch, with an LRU cache of query embeddings; results are
  diversified (:mod:`crl_agent.experience.retrieval`).
- **distil**: :meth:`ExperienceManager.submit` queues a finished trajectory and returns at once;
  background workers call the extractor and apply its operations, so an actor never waits.
- **merge**: every ``merge_every`` distillations, clusters of near-duplicates (cosine above
  ``merge_threshold``) go to the extractor (MERGE / REWRITE / DISCARD / KEEP); replacements and
  deletions commit in one transaction, so originals disappear only with a valid replacement.
- **ask**: search-and-ask; the extractor answers a question from retrieved entries.
- A read-write lock lets searches run together while bank writes run alone; :meth:`flush`
  waits for every queued distillation (call it before each rollout step).
- **pause**: while the extractor trains (:meth:`pause_extractor` ... :meth:`resume_extractor`), its
  calls wait and so do the bank's writes: distillations stay queued, merges wait, search-and-ask
  answers from the retrieved entries alone; searches go on, so rollouts never wait for the trainer.
- **hold writes**: while a training step's episodes play (:meth:`hold_writes` ... :meth:`release_writes`)
  the extractor still distils, but the operations wait to be applied (and merges wait), so every
  episode of the step searches the same bank: none sees a lesson drawn from its own group-mates.
- Every extractor call and every guided episode's outcome go to the JSONL call log
  (:mod:`crl_agent.experience.calllog`) for the extractor's trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crl_agent.experience import extractor as ex
from crl_agent.experience.bank import ExperienceBank, ExperienceEntry
from crl_agent.experience.calllog import CallLog, ExtractorSample, fold_samples
from crl_agent.experience.retrieval import DiversityConfig, Retriever, near_duplicates
from crl_agent.experience.rwlock import RWLock
from crl_agent.llm.base import LLM, Completion, SamplingParams
from crl_agent.llm.batching import RequestBatcher

log = logging.getLogger(__name__)


@dataclass
class ManagerConfig:
    """ExperienceManager knobs (defaults from the paper's code where it has them).

    Attributes:
        k: entries per retrieval.
        batch_size: most search requests served together.
        max_wait_ms: longest a request waits for its batch to fill.
        cache_size: query embeddings kept (LRU).
        distil_workers: concurrent distillations (a batching backend serves them together; 1: one at a time).
        merge_every: merge after this many distillations (0: never automatically).
        merge_threshold: cosine similarity above which two entries are near-duplicates.
        merge_neighbours: neighbours examined per entry when clustering.
        merge_max_cluster: largest cluster sent to the extractor at once.
        diversity: retrieval diversification.
        seed: seed of the dropout-move RNG.
        distil_params, merge_params, answer_params: extractor sampling per job.
        constrained: send distil and merge calls the JSON Schema of their replies
            (:func:`~crl_agent.experience.extractor.distil_schema`, ``SamplingParams.json_schema``), so a
            backend that honours it (transformers, vllm, an openai server with ``response_format``) writes
            operations that parse by construction; False leaves the replies free and the lenient parser alone.
        title_pattern, content_pattern: regular expressions that every entry's title and content match in
            constrained replies (default: one line starting with a visible character). E.g.
            ``content_pattern=r"^If .+, then .+$"`` holds a small extractor to the if-then rules the prompt
            asks for; a pattern the backend cannot compile fails the call (logged as an extractor error).
        credit_no_ops: a distillation that wrote no entry earns, as its meta-reward, the mean outcome (±1) of
            the episodes played without experience that ended after it (the next ``NO_OP_WINDOW``): writing
            nothing is worth what the actor does alone. Off (the paper's rule), such a call guides no episode
            and is never trained, so an extractor punished for wrong entries can learn to write none at all
            (tests/test_extractor_mechanism.py shows it on 2 of 5 tiny-model seeds).
        max_trajectory_chars: trajectory text budget in the distil prompt.
        distil_example: open the distil prompt with one worked exchange (it helps a small extractor write
            the format unconstrained; with ``constrained`` it only lengthens the prompt, by ~1,100 characters).
    """

    k: int = 4
    batch_size: int = 32
    max_wait_ms: float = 5.0
    cache_size: int = 4096
    distil_workers: int = 4
    merge_every: int = 5
    merge_threshold: float = 0.9
    merge_neighbours: int = 8
    merge_max_cluster: int = 5
    diversity: DiversityConfig = field(default_factory=DiversityConfig)
    seed: int = 0
    distil_params: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=512, temperature=0.7))
    merge_params: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=384, temperature=0.3))
    answer_params: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=160, temperature=0.3))
    max_trajectory_chars: int = 8000
    constrained: bool = True
    distil_example: bool = True
    credit_no_ops: bool = False
    title_pattern: str = ex.LINE_PATTERN
    content_pattern: str = ex.LINE_PATTERN


@dataclass
class AskResult:
    """A search-and-ask answer, the entries it drew on, its call id and how long it took."""

    answer: str
    entries: list[ExperienceEntry]
    call_id: str | None
    seconds: float


@dataclass
class _Request:
    query: str
    k: int
    task: str | None
    record: bool = True  # False: a held-out episode's search, which leaves usage stats and the RNG alone


class ExperienceManager:
    """Async front of an :class:`ExperienceBank` and an extractor :class:`LLM`.

    Args:
        bank: the bank (the caller owns and closes it).
        extractor: any LLM backend; ``None`` serves searches only (distillations are dropped).
        config: knobs.
        log_path: where the call log goes (``None``: kept in memory).
    """

    def __init__(
        self,
        bank: ExperienceBank,
        extractor: LLM | None,
        config: ManagerConfig | None = None,
        log_path: str | Path | None = None,
    ):
        self.bank = bank
        self.extractor = extractor
        self.config = config or ManagerConfig()
        self.retriever = Retriever(bank, self.config.diversity, self.config.seed)
        self.lock = RWLock()
        self.calls = CallLog(log_path)
        self.run_tag = uuid.uuid4().hex[:8]
        self._call_counter = itertools.count()
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        if self.config.batch_size < 1:
            raise ValueError(f"ManagerConfig.batch_size must be at least 1, got {self.config.batch_size}")
        self._searches: RequestBatcher[_Request, list[ExperienceEntry]] = RequestBatcher(
            self._serve, self.config.batch_size, self.config.max_wait_ms / 1000, thread_name="experience-search"
        )
        self._started = False
        self._pending = 0  # trajectories queued or being distilled
        self._distil_q: asyncio.Queue[ex.Trajectory] | None = None
        self._tasks: list[asyncio.Task] = []
        self._merge_lock: asyncio.Lock | None = None
        self._merged_at: dict[str, float] = {}
        self._closed = False
        self._extractor_free = asyncio.Event()  # cleared while the extractor trains (pause_extractor)
        self._extractor_free.set()
        self._writes_free = asyncio.Event()  # cleared while a step's episodes play (hold_writes)
        self._writes_free.set()
        self.stats: dict[str, float] = dict.fromkeys(
            (
                "searches", "search_batches", "cache_hits", "search_s", "distillations", "adds", "updates", "nones",
                "malformed", "extractor_errors", "merges", "merge_clusters", "merged_away", "asks", "ask_s",
                "asks_paused", "pauses",
            ),
            0,
        )

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Start the distillation workers on the running loop (idempotent; other calls do it)."""
        self._ensure_started()

    def _ensure_started(self) -> None:
        if self._closed:
            raise RuntimeError("ExperienceManager is closed")
        if self._started:
            return
        loop = asyncio.get_running_loop()
        self._started = True
        self._distil_q = asyncio.Queue()
        self._merge_lock = asyncio.Lock()
        for i in range(self.config.distil_workers):
            self._tasks.append(loop.create_task(self._distil_loop(), name=f"experience-distil-{i}"))

    async def aclose(self, flush: bool = True) -> None:
        """Finish queued distillations (unless ``flush=False``), stop the workers, close the log."""
        if self._closed:
            return
        if flush and self._distil_q is not None:
            self.resume_extractor()  # closing: held distillations run (after any update still in progress)
            self.release_writes()
            await self.flush()
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._searches.aclose()
        self.calls.close()

    # ---------------------------------------------------------------- pause while the extractor trains
    def pause_extractor(self) -> None:
        """Hold every extractor call (and so every bank write) until :meth:`resume_extractor`.

        The trainer calls it when it starts an extractor update that runs beside the rollouts: queued
        and new distillations wait and then run on the updated weights, merges wait, search-and-ask
        answers without the extractor; searches and :meth:`submit` go on as usual.
        """
        if self._extractor_free.is_set():
            self.stats["pauses"] += 1
        self._extractor_free.clear()

    def resume_extractor(self) -> None:
        """Let the held extractor calls run (idempotent)."""
        self._extractor_free.set()

    @property
    def extractor_paused(self) -> bool:
        return not self._extractor_free.is_set()

    def hold_writes(self) -> None:
        """Hold every bank write (distillations' operations, merges) until :meth:`release_writes`.

        The trainer holds them while a step's episodes play, so that all of them search the bank as it
        was flushed before the step. Unlike :meth:`pause_extractor` the extractor keeps working:
        distillations run and wait only to apply their operations; search-and-ask is answered.
        """
        self._writes_free.clear()

    def release_writes(self) -> None:
        """Let the held bank writes land (idempotent)."""
        self._writes_free.set()

    @property
    def writes_held(self) -> bool:
        return not self._writes_free.is_set()

    @contextlib.asynccontextmanager
    async def _bank_write(self):
        """The bank's write lock, taken once writes are not held. The hold is checked again with the lock
        in hand: it may begin while a write waits for the searches in flight."""
        while True:
            await self._writes_free.wait()
            async with self.lock.write():
                if self._writes_free.is_set():
                    yield
                    return

    async def replace_bank(self, bank: ExperienceBank) -> ExperienceBank:
        """Serve searches and apply operations on ``bank`` from now on; returns the old one (its owner
        closes it). Waits for searches in flight; call it with no distillation queued."""
        async with self.lock.write():
            old, self.bank, self.retriever.bank = self.bank, bank, bank
        return old

    def _new_call_id(self) -> str:
        return f"{self.run_tag}-{next(self._call_counter):06d}"

    # ---------------------------------------------------------------- search
    async def search(self, query: str, k: int | None = None, task: str | None = None,
                     record: bool = True) -> list[ExperienceEntry]:
        """Diversified entries for ``query`` (within ``task`` if given). ``record`` (default) updates the
        entries' usage stats (retrieval count, recency) and draws the dropout move from the retriever's
        RNG; ``record=False`` (a held-out episode) leaves both as they were, so evaluating changes nothing
        that training searches see."""
        await self.start()
        return await self._searches.submit(_Request(query, self.config.k if k is None else k, task, record))

    async def _serve(self, batch: list[_Request]) -> list[list[ExperienceEntry]]:
        """One batch of searches (the batcher hands an exception raised here to every request in it)."""
        t0 = time.perf_counter()
        try:
            vectors = await self._embed_queries([r.query for r in batch])
            async with self.lock.read():
                return await asyncio.to_thread(self._search_batch, batch, vectors)
        finally:
            self.stats["searches"] += len(batch)
            self.stats["search_batches"] += 1
            self.stats["search_s"] += time.perf_counter() - t0

    async def _embed_queries(self, queries: list[str]) -> dict[str, np.ndarray]:
        out, missing = {}, []
        for q in dict.fromkeys(queries):
            if q in self._cache:
                self._cache.move_to_end(q)
                out[q] = self._cache[q]
            else:
                missing.append(q)
        self.stats["cache_hits"] += len(queries) - len(missing)  # repeats within a batch count too
        if missing:
            vecs = await asyncio.to_thread(self.bank.embedder.embed, missing)
            for q, v in zip(missing, vecs, strict=True):
                out[q] = v
                self._cache[q] = v
            while len(self._cache) > self.config.cache_size:
                self._cache.popitem(last=False)
        return out

    def _search_batch(self, batch: list[_Request], vectors: dict[str, np.ndarray]) -> list[list[ExperienceEntry]]:
        results: list[list[ExperienceEntry]] = [[] for _ in batch]
        groups: dict[str | None, list[int]] = {}
        for i, r in enumerate(batch):
            groups.setdefault(r.task, []).append(i)
        now = time.time()
        for task, idx in groups.items():
            kmax = max(batch[i].k for i in idx) * self.config.diversity.oversample
            hits = self.bank.search_vectors(np.stack([vectors[batch[i].query] for i in idx]), kmax, task)
            for i, h in zip(idx, hits, strict=True):
                want = batch[i].k * self.config.diversity.oversample
                results[i] = self.retriever.select(h[:want], batch[i].k, now, record=batch[i].record,
                                                   key=batch[i].query)
        return results

    # ---------------------------------------------------------------- search-and-ask
    async def ask(self, question: str, task: str | None = None, k: int | None = None,
                  record: bool = True) -> AskResult:
        """Answer ``question`` from retrieved entries through the extractor (logged as an ``answer`` call).

        The answer always comes from the extractor, also while it trains (:meth:`pause_extractor` holds
        bank writes, not answers): its backend answers with the weights it has when the call runs, whose
        version the logged call records, so the actor's search tool means the same thing at every step.
        ``record=False`` (a held-out episode): the search leaves usage stats alone (:meth:`search`) and
        the answer is not logged, since no outcome will ever credit it."""
        t0 = time.perf_counter()
        entries = await self.search(question, k, task, record=record)
        answer, call_id = "", None
        if entries and self.extractor is not None:
            if self.extractor_paused:
                self.stats["asks_paused"] += 1  # answered all the same, by the weights of the moment
            messages = ex.answer_messages(task or "any", question, entries)
            try:
                completion, seconds = await self._chat(messages, self.config.answer_params)
                answer = ex.parse_answer(completion.text)
                if record:
                    call_id = self._log_call("answer", messages, completion, [], [], [e.id for e in entries],
                                             task, params=self.config.answer_params, seconds=seconds)
            except Exception as e:  # noqa: BLE001 - an extractor failure must not end the episode
                self.stats["extractor_errors"] += 1
                log.warning("search-and-ask extractor call failed: %s", e)
        if not answer:
            answer = (
                "Relevant lessons: " + " ".join(f"{e.title}: {e.content}" for e in entries[:2])
                if entries
                else "No relevant experience yet."
            )
        seconds = time.perf_counter() - t0
        self.stats["asks"] += 1
        self.stats["ask_s"] += seconds
        return AskResult(answer, entries, call_id, seconds)

    # ---------------------------------------------------------------- distillation
    def submit(self, traj: ex.Trajectory) -> None:
        """Queue a finished trajectory for distillation; returns at once (call from the loop's thread)."""
        if self.extractor is None or self._closed:
            return
        self._ensure_started()
        assert self._distil_q is not None
        self._distil_q.put_nowait(traj)
        self._pending += 1

    @property
    def pending(self) -> int:
        """Trajectories queued or being distilled."""
        return self._pending

    async def flush(self) -> None:
        """Wait until every queued distillation (and the merges it triggers) is applied; save the index."""
        await self.start()
        assert self._distil_q is not None
        if self.extractor_paused and self._pending:
            raise RuntimeError("flush() while the extractor is paused would wait for ever: resume_extractor() first")
        if self.writes_held and self._pending:
            raise RuntimeError("flush() while bank writes are held would wait for ever: release_writes() first")
        await self._distil_q.join()
        async with self.lock.write():
            await asyncio.to_thread(self.bank.save)

    async def _distil_loop(self) -> None:
        assert self._distil_q is not None
        while True:
            traj = await self._distil_q.get()
            try:
                await self._extractor_free.wait()
                await self.distil(traj)
                self.stats["distillations"] += 1
                every = self.config.merge_every
                if every and self.stats["distillations"] % every == 0:
                    await self.merge()
            except Exception as e:  # noqa: BLE001 - one bad trajectory or call never stops the service
                self.stats["extractor_errors"] += 1
                log.warning("distillation of %s failed: %s", traj.id, e)
            finally:
                self._pending -= 1
                self._distil_q.task_done()

    def _with_schema(self, params: SamplingParams, schema: dict[str, Any]) -> SamplingParams:
        return dataclasses.replace(params, json_schema=schema) if self.config.constrained else params

    async def distil(self, traj: ex.Trajectory) -> list[ex.DistilOp]:
        """Run the extractor on one trajectory and apply its operations; returns the applied ops."""
        if self.extractor is None:
            raise RuntimeError("no extractor: pass an LLM to ExperienceManager to distil trajectories")
        messages = ex.distil_messages(traj, self.config.max_trajectory_chars, self.config.distil_example)
        valid_ids = {e.id for e in traj.retrieved}
        schema = ex.distil_schema(valid_ids, self.config.title_pattern, self.config.content_pattern)
        params = self._with_schema(self.config.distil_params, schema)
        completion, seconds = await self._chat(messages, params)
        ops, errors = ex.parse_distil(completion.text, valid_ids)
        call_id = self._new_call_id()
        async with self._bank_write():
            applied, touched, apply_errors = await asyncio.to_thread(self._apply_distil, traj, ops, call_id)
        errors += apply_errors
        self.stats["malformed"] += len(errors)
        self._log_call("distil", messages, completion, [op.to_dict() for op in applied], errors, touched,
                       traj.task, call_id=call_id, params=self.config.distil_params, trajectory=traj.id,
                       seconds=seconds)
        return applied

    def _apply_distil(
        self, traj: ex.Trajectory, ops: list[ex.DistilOp], call_id: str
    ) -> tuple[list[ex.DistilOp], list[int], list[str]]:
        applied, touched, errors = [], [], []
        for op in ops:
            if op.kind == "none":
                self.stats["nones"] += 1
                applied.append(op)
                continue
            assert op.entry is not None
            try:
                if op.kind == "add":
                    e = self.bank.add(traj.task, op.entry.title, op.entry.content, [traj.id], origin=call_id)
                    self.stats["adds"] += 1
                else:
                    current = self.bank.get_many(op.target_ids)
                    foreign = [e.id for e in current if e.task != traj.task]
                    if foreign:  # a trajectory rewrites its own task's lessons only
                        errors.append(f"update: targets {foreign} belong to another task than {traj.task!r}")
                        continue
                    alive = [e.id for e in current]
                    if not alive:
                        errors.append(f"update: targets {op.target_ids} no longer exist")
                        continue
                    e = self.bank.update(alive[0], op.entry.title, op.entry.content, [traj.id], origin=call_id)
                    self.bank.delete(alive[1:])  # folded into the first target
                    self.stats["updates"] += 1
            except (ValueError, KeyError) as err:
                errors.append(f"{op.kind}: {err}")
                continue
            applied.append(op)
            touched.append(e.id)
        return applied, touched, errors

    # ---------------------------------------------------------------- merge
    async def merge(self, task: str | None = None) -> dict[str, int]:
        """Consolidate near-duplicate entries of ``task`` (or of every task); returns decision counts."""
        if self.extractor is None:
            return {}
        await self.start()
        assert self._merge_lock is not None
        counts: dict[str, int] = {}
        await self._extractor_free.wait()
        await self._writes_free.wait()
        async with self._merge_lock:
            self.stats["merges"] += 1
            for t in [task] if task is not None else list(self.bank.tasks()):
                started = time.time()
                async with self.lock.read():
                    clusters = await asyncio.to_thread(
                        near_duplicates, self.bank, t, self.config.merge_threshold, self._merged_at.get(t, 0.0),
                        self.config.merge_neighbours, self.config.merge_max_cluster,
                    )
                for cluster in clusters:
                    try:
                        kind = await self._merge_cluster(t, cluster)
                    except Exception as err:  # noqa: BLE001 - one unusable decision never stops the other clusters
                        self.stats["malformed"] += 1
                        log.warning("merge of entries %s failed and was skipped: %s", [c.id for c in cluster], err)
                        kind = "ERROR"
                    counts[kind] = counts.get(kind, 0) + 1
                self._merged_at[t] = started
        return counts

    async def _merge_cluster(self, task: str, cluster: list[ExperienceEntry]) -> str:
        assert self.extractor is not None
        messages = ex.merge_messages(task, cluster)
        try:
            schema = ex.merge_schema([e.id for e in cluster], self.config.title_pattern, self.config.content_pattern)
            params = self._with_schema(self.config.merge_params, schema)
            completion, seconds = await self._chat(messages, params)
        except Exception as e:  # noqa: BLE001
            self.stats["extractor_errors"] += 1
            log.warning("merge extractor call failed: %s", e)
            return "ERROR"
        ids = [e.id for e in cluster]
        decision, errors = ex.parse_merge(completion.text, ids)
        call_id = self._new_call_id()
        touched: list[int] = []
        async with self._bank_write():
            current = {e.id: e.updated for e in self.bank.get_many(ids)}
            if current != {e.id: e.updated for e in cluster}:
                errors.append("cluster changed while the extractor was thinking; left alone")
                decision = ex.MergeDecision("KEEP")
            elif decision.kind in ("MERGE", "REWRITE"):
                sources = sorted({s for e in cluster for s in e.sources})
                items = [(task, d.title, d.content, sources, call_id) for d in decision.entries]
                new = await asyncio.to_thread(self.bank.replace, ids, items)
                touched = [e.id for e in new]
                self.stats["merged_away"] += len(ids) - len(new)
            elif decision.kind == "DISCARD":
                await asyncio.to_thread(self.bank.delete, decision.discard_ids)
                self.stats["merged_away"] += len(decision.discard_ids)
        self.stats["merge_clusters"] += 1
        self.stats["malformed"] += len(errors)
        self._log_call("merge", messages, completion, [decision.to_dict()], errors, touched, task,
                       call_id=call_id, params=self.config.merge_params, cluster=ids,
                       seconds=seconds)
        return decision.kind

    # ---------------------------------------------------------------- call log and meta-reward
    async def _chat(self, messages: list[dict[str, str]], params: SamplingParams) -> tuple[Completion, float]:
        """One extractor call and how long the backend took to answer it (seconds, as the call log keeps it)."""
        assert self.extractor is not None
        t0 = time.perf_counter()
        completion = await self.extractor.chat(messages, params)
        return completion, round(time.perf_counter() - t0, 3)

    def _log_call(
        self,
        kind: str,
        messages: list[dict[str, str]],
        completion: Completion,
        ops: list[dict[str, Any]],
        errors: list[str],
        entries: list[int],
        task: str | None,
        call_id: str | None = None,
        params: SamplingParams | None = None,
        **extra: Any,
    ) -> str:
        call_id = call_id or self._new_call_id()
        # the log-probs of the distribution the reply was drawn from, and its temperature (CISPO's old policy)
        temperature = params.temperature if params is not None and params.temperature > 0 else 1.0
        self.calls.write(
            {
                "type": "call", "call_id": call_id, "kind": kind, "time": time.time(), "task": task,
                "messages": messages, "text": completion.text, "token_ids": completion.token_ids,
                "logprobs": completion.logprobs, "prompt_token_ids": completion.prompt_token_ids,
                "sampling_logprobs": completion.sampling_logprobs, "temperature": temperature,
                "model_chosen": completion.model_chosen, "policy_version": completion.policy_version,
                "model": completion.model, "ops": ops, "errors": errors, "entries": entries, **extra,
            }
        )
        return call_id

    def record_outcome(
        self, episode: str, entries: list[ExperienceEntry], success: bool, call_ids: list[str] = ()
    ) -> None:
        """An episode guided by ``entries`` (and answers from ``call_ids``) ended: credit their calls (±1).
        With ``credit_no_ops``, an episode that nothing guided is logged too, as a blind outcome."""
        origins = [e.origin for e in entries if e.origin]
        credited = list(dict.fromkeys([*origins, *call_ids]))
        blind = not entries and not call_ids
        if not credited and not (blind and self.config.credit_no_ops):
            return
        self.calls.write(
            {
                "type": "outcome", "episode": episode, "outcome": 1.0 if success else -1.0,
                "call_ids": credited, "entries": [e.id for e in entries], "time": time.time(),
                **({"blind": True} if blind else {}),
            }
        )

    def training_samples(self, step: int, cooldown: int = 1) -> list[ExtractorSample]:
        """Extractor calls with meta-rewards and count-aware weights, as of training ``step``."""
        return fold_samples(self.calls.records(), self.bank, step, cooldown, self.config.credit_no_ops)

    def meta_rewards(self) -> list[float]:
        """The meta-reward of every extractor call that has one so far (the count-aware weights are not
        needed, so the bank is not read)."""
        return [s.reward for s in fold_samples(self.calls.records(), no_op_reward=self.config.credit_no_ops)
                if s.reward is not None]

    def mark_trained(self, samples: list[ExtractorSample], step: int) -> None:
        """Record that ``samples`` were trained on at ``step`` (entry ``train_count``/``last_trained_step``)."""
        ids = sorted({i for s in samples if s.kind != "answer" for i in s.entries if i in self.bank})
        self.bank.record_training(ids, step)
        self.calls.write({"type": "trained", "call_ids": [s.call_id for s in samples], "step": step, "entries": ids})

    def drop_from_buffer(self, samples: list[ExtractorSample], step: int) -> None:
        """Let ``samples``' pending outcomes go untrained at ``step`` (a bounded training buffer's oldest):
        they leave the buffer until new outcomes credit them; their training counts stay as they are."""
        if samples:
            self.calls.write({"type": "dropped", "call_ids": [s.call_id for s in samples], "step": step})

    def log_offset(self) -> int:
        """Where the call log ends now (a trainer's checkpoint records it for :meth:`rewind_log`)."""
        return self.calls.offset()

    def rewind_log(self, offset: int) -> int:
        """Go back to a checkpoint's :meth:`log_offset`: cut the call log back to it and take back the
        ``train_count`` (and ``last_trained_step``) that the cut ``trained`` records gave entries, so a step
        redone after a kill neither sees its first attempt's calls and outcomes nor counts its training
        twice. Entries that attempt wrote stay in the bank (nothing credits their cut calls). Returns the
        number of records cut."""
        dropped = self.calls.truncate(offset)
        undo: dict[int, int] = {}
        for rec in dropped:
            if rec["type"] == "trained":
                for i in rec.get("entries", ()):
                    undo[int(i)] = undo.get(int(i), 0) + 1
        if undo:
            last: dict[int, int] = {}  # each entry's last training step in the log that is kept
            for rec in self.calls.records():
                if rec["type"] == "trained":
                    for i in rec.get("entries", ()):
                        last[int(i)] = max(last.get(int(i), -1), int(rec["step"]))
            self.bank.set_training({e.id: (max(0, e.train_count - undo[e.id]), last.get(e.id))
                                    for e in self.bank.get_many(sorted(undo))})
        return len(dropped)

    def config_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "k": c.k, "batch_size": c.batch_size, "max_wait_ms": c.max_wait_ms, "merge_every": c.merge_every,
            "merge_threshold": c.merge_threshold, "diversity": c.diversity.__dict__, "bank": self.bank.config(),
            "extractor": self.extractor.config() if self.extractor is not None else None,
        }
