"""The experience bank: entries in SQLite (WAL), their vectors in an hnswlib index.

A bank is a folder::

    bank.sqlite        entries, their embeddings and usage stats; a ``meta`` table with the
                       generation counter and the embedder that wrote the vectors
    index.json         which index file matches which generation
    index-<gen>.hnsw   the hnswlib index saved at that generation

SQLite is the source of truth. Every add, update and delete bumps ``generation`` in the same
transaction, so a write is either wholly there or wholly absent after a crash. The index is
saved on :meth:`ExperienceBank.save` / :meth:`ExperienceBank.close`; on open it is loaded only
if its generation equals SQLite's, otherwise it is rebuilt from the stored embeddings. Usage
stats do not change the vectors and do not bump the generation.

One process opens a bank at a time (an advisory ``flock`` on ``.lock``, which holds the owner's
pid; a second opener gets a :class:`BankError` naming it); threads may share one bank. A corrupt
or unwritable SQLite file, a path that is a file, or a bank written by another embedder is a
:class:`BankError` that names the fix, and the folder is left untouched. A missing, stale, torn or
foreign index file is rebuilt from SQLite (with a logged warning).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crl_agent.experience.bankdir import (
    BankError,
    connect,
    ensure_folder,
    lock_folder,
    remove_save_leftovers,
    sqlite_error,
    unlock_folder,
)
from crl_agent.experience.embedder import Embedder, make_embedder
from crl_agent.experience.entry import (
    COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    ExperienceEntry,
    Transaction,
    check_text,
    entry_from_row,
)
from crl_agent.experience.index import VectorIndex

log = logging.getLogger(__name__)
__all__ = ["BankError", "ExperienceBank", "ExperienceEntry", "TaskView"]

class ExperienceBank:
    """Persistent, searchable store of experience entries.

    Args:
        path: the bank folder (created if missing).
        embedder: an :class:`~crl_agent.experience.embedder.Embedder` or a spec for
            :func:`~crl_agent.experience.embedder.make_embedder` (default ``"minilm"``).
        reembed: if the bank was written with another embedder, re-embed every entry instead
            of refusing to open.
        ef_search, m, ef_construction: hnswlib parameters (search breadth, graph degree, build
            breadth). The defaults reach recall@8 0.998 (p99 under 1 ms) at 100k MiniLM vectors of
            lesson-like text, where the old M=16 / ef_construction=200 / ef=64 reached 0.958
            (``benchmarks/experience.py --sweep``); a search asking for ``k`` results searches at least ``2k`` wide (see
            :meth:`VectorIndex.knn`). A saved index keeps the graph it was built with.
        brute_force_below: searches restricted to at most this many entries (a small task)
            skip the graph and score every vector exactly; such a task's vectors are kept as
            one matrix until the task changes (hnswlib hands vectors back one by one, which
            costs far more than the search).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        embedder: Embedder | str | None = "minilm",
        *,
        reembed: bool = False,
        ef_search: int = 128,
        m: int = 32,
        ef_construction: int = 400,
        brute_force_below: int = 2048,
    ):
        self.path = Path(path)
        self.embedder = make_embedder(embedder)
        self.dim = self.embedder.dim
        self.ef_search, self.m, self.ef_construction = ef_search, m, ef_construction
        self.brute_force_below = brute_force_below
        self._lock = threading.RLock()
        self._tasks: dict[int, str] = {}
        self._by_task: dict[str, set[int]] = {}
        self._task_matrix: dict[str, tuple[list[int], np.ndarray]] = {}  # small tasks' (ids, vectors)
        self.rebuilt_index = False
        self._saved_generation = -1
        self._db: sqlite3.Connection | None = None
        self._lockfile = None
        ensure_folder(self.path)
        self._lockfile = lock_folder(self.path)
        try:
            remove_save_leftovers(self.path)
            db_path = self.path / "bank.sqlite"
            self._db = connect(db_path)
            try:
                self._db.executescript(SCHEMA)
                self._check_schema()
                self._check_embedder(reembed)
                for eid, task in self._db.execute("SELECT id, task FROM entries"):
                    self._remember(eid, task)
            except sqlite3.Error as e:
                raise sqlite_error(db_path, e) from e
            self._load_or_rebuild_index()
        except BaseException:
            if self._db is not None:
                self._db.close()
                self._db = None
            unlock_folder(self._lockfile)
            raise

    # ---------------------------------------------------------------- open / save
    def _meta(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    def _set_meta(self, key: str, value: Any) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", (key, str(value)))

    @property
    def generation(self) -> int:
        """Bumped by every add, update and delete."""
        return int(self._meta("generation", "0"))

    def _bump(self) -> None:
        self._db.execute(
            "INSERT INTO meta(key, value) VALUES('generation', '1') "
            "ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1"
        )

    def _check_schema(self) -> None:
        stored = self._meta("schema_version")
        if stored is not None and (not stored.isdigit() or int(stored) > SCHEMA_VERSION):
            raise BankError(
                f"bank {self.path} has schema version {stored}, newer than this crl-bench's {SCHEMA_VERSION}: "
                "upgrade crl-bench to open it"
            )

    def _check_embedder(self, reembed: bool) -> None:
        stored = self._meta("embedder")
        mine = json.dumps({"name": self.embedder.name, "dim": self.dim})
        if stored is None:
            with self._tx():
                self._set_meta("embedder", mine)
                self._set_meta("schema_version", SCHEMA_VERSION)
            stored = mine
        bad = self._db.execute("SELECT count(*) FROM entries WHERE length(embedding) != ?", (4 * self.dim,))
        wrong_size = bad.fetchone()[0]
        if stored == mine and not wrong_size:
            return
        if not reembed:
            why = (f"was written with embedder {stored}, not {mine}: open it with that embedder" if stored != mine
                   else f"has {wrong_size} entries whose stored vectors are not {self.dim}-dimensional")
            raise BankError(f"bank {self.path} {why}, or pass reembed=True to re-embed every entry")
        rows = self._db.execute("SELECT id, title, content FROM entries").fetchall()
        vecs = self.embedder.embed([f"{t}\n{c}" for _, t, c in rows]) if rows else []
        with self._tx():
            for (eid, _, _), v in zip(rows, vecs, strict=True):
                self._db.execute("UPDATE entries SET embedding=? WHERE id=?", (v.tobytes(), eid))
            self._set_meta("embedder", mine)
            self._bump()

    def _tx(self) -> Transaction:
        return Transaction(self._db, self.path / "bank.sqlite")

    def _load_or_rebuild_index(self) -> None:
        gen, count = self.generation, len(self._tasks)
        index = VectorIndex.load(self.path, gen, count, self.dim)
        if index is not None and self._matches_sqlite(index):
            self._index, self._saved_generation = index, gen
            return
        if count or index is not None:
            log.warning("bank %s: the index file is missing, stale or does not match SQLite; rebuilding it "
                        "from the %d stored vectors", self.path, count)
        self.rebuilt_index = True
        self._index = VectorIndex.build(self.dim, count, self._stored_vectors(), m=self.m,
                                        ef_construction=self.ef_construction)

    def _matches_sqlite(self, index: VectorIndex, sample: int = 32) -> bool:
        """Spot-check a loaded index against SQLite: evenly spread ids must be there with their stored vectors."""
        ids = sorted(self._tasks)
        picked = ids[:: max(1, len(ids) // sample)][:sample] + ids[-1:]
        if not picked:
            return True
        rows = self._sql_vectors(picked)
        try:
            got = index.get(picked)
        except RuntimeError:
            return False
        want = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        return bool(np.allclose(got, want, atol=1e-4, equal_nan=True))

    def _sql_vectors(self, ids: list[int]) -> np.ndarray:
        """The vectors SQLite stores for ``ids`` (all must exist), as written (not normalised)."""
        q = f"SELECT id, embedding FROM entries WHERE id IN ({','.join('?' * len(ids))})"
        blobs = dict(self._db.execute(q, ids).fetchall())
        return np.stack([np.frombuffer(blobs[i], dtype=np.float32) for i in ids])

    def _stored_vectors(self):
        cur = self._db.execute("SELECT id, embedding FROM entries")
        while rows := cur.fetchmany(10_000):
            ids = np.array([r[0] for r in rows], dtype=np.int64)
            yield ids, np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), self.dim)

    def save(self) -> None:
        """Write the index for the current generation (atomically; a no-op if already saved)."""
        with self._lock:
            gen = self.generation
            if gen != self._saved_generation:
                self._index.save(self.path, gen, len(self._tasks))
                self._saved_generation = gen

    def close(self) -> None:
        """Save the index and release the bank."""
        if self._db is None:
            return
        with self._lock:
            try:
                self.save()
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:  # a failed save (disk full) still releases the bank; the next open rebuilds the index
                self._db.close()
                self._db = None
                unlock_folder(self._lockfile)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (a closed bank can be neither read nor written)."""
        return self._db is None

    def __enter__(self) -> ExperienceBank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- writes
    def _remember(self, eid: int, task: str) -> None:
        self._task_matrix.pop(task, None)
        self._tasks[eid] = task
        self._by_task.setdefault(task, set()).add(eid)

    def _forget(self, eid: int) -> None:
        task = self._tasks.pop(eid)
        self._task_matrix.pop(task, None)
        self._by_task[task].discard(eid)
        if not self._by_task[task]:
            del self._by_task[task]

    def add(
        self, task: str, title: str, content: str, sources: Iterable[str] = (), origin: str | None = None
    ) -> ExperienceEntry:
        """Store a new entry and index it."""
        return self.add_many([(task, title, content, list(sources), origin)])[0]

    def add_many(
        self,
        items: Sequence[tuple[str, str, str, list[str], str | None]],
        embeddings: np.ndarray | None = None,
    ) -> list[ExperienceEntry]:
        """Store ``(task, title, content, sources, origin)`` tuples in one transaction.

        ``embeddings`` (unit rows) skips the embedder, e.g. for benchmarks with random vectors.
        """
        return self.replace([], items, embeddings)

    def replace(
        self,
        delete_ids: Sequence[int],
        items: Sequence[tuple[str, str, str, list[str], str | None]],
        embeddings: np.ndarray | None = None,
    ) -> list[ExperienceEntry]:
        """Add ``items`` and delete ``delete_ids`` in ONE transaction: after a crash either the
        replacements and no originals are there, or the originals alone."""
        if not items and not delete_ids:
            return []
        if not items:
            self.delete(delete_ids)
            return []
        for task, title, content, _, _ in items:
            check_text(task=task, title=title, content=content)
        vecs = self.embedder.embed([f"{t}\n{c}" for _, t, c, _, _ in items]) if embeddings is None else embeddings
        vecs = np.ascontiguousarray(vecs, dtype=np.float32)
        if vecs.shape != (len(items), self.dim):
            raise ValueError(f"embeddings must have shape {(len(items), self.dim)}, got {vecs.shape}")
        now = time.time()
        with self._lock:
            ids: list[int] = []
            try:
                with self._tx():
                    for (task, title, content, sources, origin), v in zip(items, vecs, strict=True):
                        cur = self._db.execute(
                            "INSERT INTO entries(task, title, content, embedding, created, updated, sources, origin) "
                            "VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                            (task, title.strip(), content.strip(), v.tobytes(), now, now, json.dumps(sources), origin),
                        )
                        ids.append(int(cur.lastrowid))
                    doomed = [int(i) for i in delete_ids if int(i) in self._tasks]
                    self._db.executemany("DELETE FROM entries WHERE id=?", [(i,) for i in doomed])
                    self._bump()
                    self._index.add(vecs, ids)
            except BaseException:
                self._index.mark_deleted(ids)  # the transaction rolled back: drop whatever reached the index
                raise
            self._index.mark_deleted(doomed)
            for eid in doomed:
                self._forget(eid)
            for eid, (task, *_rest) in zip(ids, items, strict=True):
                self._remember(eid, task)
            return self.get_many(ids)

    def update(
        self,
        eid: int,
        title: str | None = None,
        content: str | None = None,
        sources: Iterable[str] = (),
        origin: str | None = None,
    ) -> ExperienceEntry:
        """Rewrite an entry's title and/or content (re-embedded); ``sources`` are appended."""
        old = self.get(eid)
        if old is None:
            raise KeyError(f"no entry {eid} in bank {self.path}")
        title = (title if title is not None else old.title).strip()
        content = (content if content is not None else old.content).strip()
        check_text(title=title, content=content)
        vec = self.embedder.embed([f"{title}\n{content}"])[0].astype(np.float32)
        new_sources = old.sources + [s for s in sources if s not in old.sources]
        with self._lock:
            before = self._index.get([eid]) if eid in self._tasks else None
            try:
                with self._tx():
                    cur = self._db.execute(
                        "UPDATE entries SET title=?, content=?, embedding=?, updated=?, sources=?, origin=? WHERE id=?",
                        (title, content, vec.tobytes(), time.time(), json.dumps(new_sources), origin or old.origin, eid),
                    )
                    if cur.rowcount != 1:
                        raise KeyError(f"entry {eid} was deleted concurrently")
                    self._bump()
                    self._index.add(vec[None], [eid])
            except BaseException:
                if before is not None:  # the transaction rolled back (e.g. disk full): so does the index
                    self._index.add(before, [eid])
                raise
            finally:
                self._task_matrix.pop(old.task, None)
        return self.get(eid)  # type: ignore[return-value]

    def delete(self, ids: Iterable[int]) -> int:
        """Delete entries by id; unknown ids are ignored. Returns how many were deleted."""
        with self._lock:
            ids = [int(i) for i in ids if int(i) in self._tasks]
            if not ids:
                return 0
            with self._tx():
                self._db.executemany("DELETE FROM entries WHERE id=?", [(i,) for i in ids])
                self._bump()
            self._index.mark_deleted(ids)
            for eid in ids:
                self._forget(eid)
            return len(ids)

    def record_retrieval(self, ids: Iterable[int], now: float | None = None) -> None:
        """Usage stats: each id was retrieved once more, at ``now``."""
        now = time.time() if now is None else now
        with self._lock, self._tx():
            self._db.executemany(
                "UPDATE entries SET retrieve_count = retrieve_count + 1, last_retrieved=? WHERE id=?",
                [(now, int(i)) for i in ids],
            )

    def record_training(self, ids: Iterable[int], step: int) -> None:
        """Usage stats: each id's samples were trained on at ``step``."""
        with self._lock, self._tx():
            self._db.executemany(
                "UPDATE entries SET train_count = train_count + 1, last_trained_step=? WHERE id=?",
                [(int(step), int(i)) for i in ids],
            )

    def set_training(self, stats: dict[int, tuple[int, int | None]]) -> None:
        """Usage stats: set each id's ``(train_count, last_trained_step)`` (a trainer going back to a
        checkpoint; ``None``: never trained)."""
        with self._lock, self._tx():
            self._db.executemany(
                "UPDATE entries SET train_count=?, last_trained_step=? WHERE id=?",
                [(int(n), None if last is None else int(last), int(i)) for i, (n, last) in stats.items()],
            )

    # ---------------------------------------------------------------- reads
    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, eid: object) -> bool:
        return eid in self._tasks

    def tasks(self) -> dict[str, int]:
        """Entry count per task."""
        with self._lock:
            return {t: len(s) for t, s in sorted(self._by_task.items())}

    def ids(self, task: str | None = None) -> list[int]:
        with self._lock:
            return sorted(self._tasks if task is None else self._by_task.get(task, ()))

    def get(self, eid: int) -> ExperienceEntry | None:
        got = self.get_many([eid])
        return got[0] if got else None

    def get_many(self, ids: Sequence[int]) -> list[ExperienceEntry]:
        """Entries by id, in the order asked; missing ids are skipped."""
        if not ids:
            return []
        with self._lock:
            by_id: dict[int, ExperienceEntry] = {}
            ids = [int(i) for i in ids]
            for start in range(0, len(ids), 900):  # SQLite's bound-parameter limit
                chunk = ids[start : start + 900]
                q = f"SELECT {COLUMNS} FROM entries WHERE id IN ({','.join('?' * len(chunk))})"
                by_id.update((r[0], entry_from_row(r)) for r in self._db.execute(q, chunk))
        return [by_id[i] for i in ids if i in by_id]

    def entries(self, task: str | None = None) -> list[ExperienceEntry]:
        """All entries (of one task), oldest first."""
        return self.get_many(self.ids(task))

    def embeddings(self, ids: Sequence[int]) -> np.ndarray:
        """The stored (unit) vectors of ``ids``, from the index."""
        with self._lock:
            return self._index.get(list(ids))

    def view(self, task: str) -> TaskView:
        """The entries of one task, with the same read API."""
        return TaskView(self, task)

    def search(self, query: str, k: int = 8, task: str | None = None) -> list[tuple[ExperienceEntry, float]]:
        """Nearest entries to ``query`` by cosine similarity, best first: ``[(entry, similarity)]``."""
        hits = self.search_vectors(self.embedder.embed([query]), k, task)[0]
        entries = self.get_many([i for i, _ in hits])
        sims = dict(hits)
        return [(e, sims[e.id]) for e in entries]

    def search_vectors(self, queries: np.ndarray, k: int, task: str | None = None) -> list[list[tuple[int, float]]]:
        """Batched nearest-neighbour ids with cosine similarities, one list per query row."""
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        with self._lock:
            pool = self._tasks.keys() if task is None else self._by_task.get(task, set())
            k = min(k, len(pool))
            if k <= 0:
                return [[] for _ in range(len(queries))]
            if task is not None and len(pool) <= self.brute_force_below:
                ids, vecs = self._small_task(task)
                return self._exact(queries, ids, k, vecs)
            try:
                labels, sims = self._index.knn(queries, k, self.ef_search, None if task is None else pool)
            except RuntimeError:  # too few reachable nodes (many deletions): score exactly instead
                return self._exact(queries, sorted(pool), k)
        return [[(int(i), float(s)) for i, s in zip(lr, sr, strict=True)] for lr, sr in zip(labels, sims, strict=True)]

    def search_exact(self, queries: np.ndarray, k: int, task: str | None = None) -> list[list[tuple[int, float]]]:
        """:meth:`search_vectors` by scoring every vector (no graph): slow, but the true neighbours."""
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        with self._lock:
            ids = self.ids(task)
            k = min(k, len(ids))
            if k <= 0:
                return [[] for _ in range(len(queries))]
            return self._exact(queries, ids, k)

    def _small_task(self, task: str) -> tuple[list[int], np.ndarray]:
        """A small task's ids and vectors as one matrix, built once per change of the task."""
        got = self._task_matrix.get(task)
        if got is None:
            ids = sorted(self._by_task.get(task, ()))
            got = self._task_matrix[task] = (ids, self._index.get(ids))
        return got

    def _exact(
        self, queries: np.ndarray, ids: list[int], k: int, vecs: np.ndarray | None = None
    ) -> list[list[tuple[int, float]]]:
        vecs = self.embeddings(ids) if vecs is None else vecs
        qn = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
        sims = qn @ vecs.T
        out = []
        for row in sims:
            top = np.argpartition(-row, k - 1)[:k] if k < len(ids) else np.arange(len(ids))
            top = top[np.argsort(-row[top], kind="stable")]
            out.append([(ids[j], float(row[j])) for j in top])
        return out

    def check_consistency(self) -> list[str]:
        """Problems between SQLite and the index (empty when they agree): ids and vectors."""
        problems = []
        with self._lock:
            rows = self._db.execute("SELECT id, embedding FROM entries").fetchall()
            sql_ids = {r[0] for r in rows}
            if sql_ids != set(self._tasks):
                problems.append("in-memory id set differs from SQLite")
            live = self._index.live_ids()
            if live != sql_ids:
                problems.append(f"index has {len(live - sql_ids)} extra and {len(sql_ids - live)} missing ids")
            for eid, blob in rows:
                if eid in live:
                    stored = np.frombuffer(blob, dtype=np.float32)
                    if not np.allclose(self._index.get([eid])[0], stored / np.linalg.norm(stored), atol=1e-5):
                        problems.append(f"entry {eid}: index vector differs from SQLite")
        return problems

    def config(self) -> dict[str, Any]:
        return {"path": str(self.path), "entries": len(self), **self.embedder.config()}


class TaskView:
    """One task's slice of a bank: ``search``, ``entries``, ``ids``, ``len``."""

    def __init__(self, bank: ExperienceBank, task: str):
        self.bank, self.task = bank, task

    def __len__(self) -> int:
        return len(self.bank.ids(self.task))

    def ids(self) -> list[int]:
        return self.bank.ids(self.task)

    def entries(self) -> list[ExperienceEntry]:
        return self.bank.entries(self.task)

    def search(self, query: str, k: int = 8) -> list[tuple[ExperienceEntry, float]]:
        return self.bank.search(query, k, task=self.task)
