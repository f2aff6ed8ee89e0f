"""Experience bank and manager speed, each against a baseline measured in the same run.

- search recall@8 and latency p50/p99 through ``ExperienceBank.search_vectors`` (hnswlib, the
  bank's default graph parameters) against exact brute-force numpy, at 1k / 10k / 100k entries of
  a generated corpus of experience-like lessons embedded with the real MiniLM
  (``benchmarks/experience_corpus.py``; the vectors are cached under ``$CRL_CACHE``, the first run
  spends about 10 minutes embedding them). Queries are 1,000 actor-style queries embedded the same
  way. Target at 100k: recall@8 >= 0.99 with p99 <= 1 ms. The same searches within one task (the
  task filter applied inside the index) and the 64 candidates the manager's diversified retrieval
  fetches (k=4 x oversample 16) are measured too. Uniform random 384-d vectors (no structure at
  all, HNSW's worst case) are measured at 10k;
- ``--sweep``: the trade-off table behind the defaults: graph degree ``M``, ``ef_construction``
  and search ``ef`` -> recall@8, p50, p99 and build time at the largest size;
- time to reopen a 100k bank (saved index) against rebuilding its index from SQLite;
- manager throughput (queries/s) with micro-batching (32, 5 ms) against batch size 1, with the
  real MiniLM embedder, 256 distinct concurrent queries (no cache hits).

Latency is given twice: wall-clock, and the CPU time of the searching thread (hnswlib searches
in the calling thread at ``num_threads=1``). On a shared, loaded machine the wall-clock p99 is
mostly time spent preempted; the CPU-time p99 is what the search itself costs.

Recall counts a returned id as right when its exact similarity is at least the k-th best exact
similarity minus 1e-5 (near-identical lessons make exact ties, which either answer satisfies).

Run: ``python benchmarks/experience.py`` (a few minutes on 2 idle cores once the vectors are
cached; ``--sizes 1000,10000`` is quicker; ``--sweep`` builds one 100k index per (M,
ef_construction) pair: 4-8 minutes each on 2 busy cores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# One BLAS thread: the brute-force baseline answers one query at a time, as the bank does, and
# threaded BLAS only adds contention there.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import experience_corpus  # noqa: E402

from crl_agent.experience import ExperienceBank, ExperienceManager, HashingEmbedder, ManagerConfig  # noqa: E402
from crl_agent.experience.index import VectorIndex  # noqa: E402

DIM = 384
TIE = 1e-5


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    """Uniform on the sphere: every pair nearly orthogonal, the hardest case for a graph index."""
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def load_avg() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} on {os.cpu_count()} cores"


class Truth:
    """Exact neighbours of each query among ``vecs`` (rows are ids 0..n-1), for tie-aware recall."""

    def __init__(self, vecs: np.ndarray, qs: np.ndarray, k: int, groups: np.ndarray | None = None,
                 group_of_query: np.ndarray | None = None):
        self.vecs, self.qs, self.k = vecs, qs, k
        self.kth = np.empty(len(qs), dtype=np.float32)
        self.brute_ms = []
        for j, q in enumerate(qs):
            t = time.perf_counter()
            if groups is None:
                sims = vecs @ q
            else:  # what a brute-force search within one task costs: the task's rows, then a product
                rows = np.flatnonzero(groups == group_of_query[j])
                sims = vecs[rows] @ q
            top = np.partition(-sims, k - 1)[:k]
            self.brute_ms.append((time.perf_counter() - t) * 1000)
            self.kth[j] = -top.max()

    def recall(self, j: int, ids) -> float:
        ids = np.fromiter(ids, dtype=np.int64)
        if len(ids) == 0:
            return 0.0
        sims = self.vecs[ids] @ self.qs[j]
        return float(np.sum(sims >= self.kth[j] - TIE)) / self.k


def pct(ms: list[float]) -> tuple[float, float]:
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def fill(bank: ExperienceBank, vecs: np.ndarray, tasks: list[str], chunk: int = 10_000) -> list[int]:
    ids = []
    for s in range(0, len(vecs), chunk):
        n = min(chunk, len(vecs) - s)
        got = bank.add_many([(tasks[s + i], f"entry {s + i}", "benchmark vector", [], None) for i in range(n)],
                            vecs[s : s + n])
        ids += [e.id for e in got]
    return ids


def bank_search(root: Path, name: str, vecs: np.ndarray, tasks: list[str], qs: np.ndarray,
                q_tasks: list[str] | None) -> Path:
    """Build one bank with the default parameters; time and score searches through the bank's API."""
    path = root / f"{name}-{len(vecs)}"
    bank = ExperienceBank(path, embedder=HashingEmbedder(DIM))
    t = time.perf_counter()
    ids = np.array(fill(bank, vecs, tasks))
    build_s = time.perf_counter() - t
    pos = {int(i): p for p, i in enumerate(ids)}
    n = len(vecs)

    def measure(label: str, k: int, task_of: list[str] | None) -> None:
        if task_of is None:
            truth = Truth(vecs, qs, k)
        else:
            g = np.array(tasks)
            truth = Truth(vecs, qs, k, g, np.array(task_of))
        ms, cpu, rec = [], [], []
        for j, q in enumerate(qs):
            t, c = time.perf_counter(), time.thread_time()
            hits = bank.search_vectors(q[None], k, None if task_of is None else task_of[j])[0]
            cpu.append((time.thread_time() - c) * 1000)
            ms.append((time.perf_counter() - t) * 1000)
            rec.append(truth.recall(j, (pos[i] for i, _ in hits)))
        a50, a99 = pct(ms)
        c50, c99 = pct(cpu)
        e50, e99 = pct(truth.brute_ms)
        print(f"{name:>14} {n:>7,} entries (build {build_s:5.1f}s) {label:<22} recall {np.mean(rec):.4f}  "
              f"hnswlib p50 {a50:.3f} ms p99 {a99:.3f} ms (CPU p50 {c50:.3f} p99 {c99:.3f})  "
              f"brute-force p50 {e50:.3f} ms p99 {e99:.3f} ms  speed-up p50 {e50 / a50:5.1f}x", flush=True)

    measure("recall@8", 8, None)
    measure("recall@64 (manager)", 64, None)
    if q_tasks is not None:
        measure("recall@8 in one task", 8, q_tasks)
    bank.close()
    return path


def sweep(vecs: np.ndarray, qs: np.ndarray, ms: list[int], efcs: list[int], efs: list[int]) -> None:
    """Recall@8 and latency per (M, ef_construction, ef), the index driven directly (as the bank does)."""
    truth = Truth(vecs, qs, 8)
    ids = np.arange(len(vecs))
    print(f"\nsweep at {len(vecs):,} entries, {len(qs)} queries, {load_avg()}")
    print(f"{'M':>3} {'ef_c':>5} {'build s':>8} {'ef':>5} {'recall@8':>9} {'p50 ms':>8} {'p99 ms':>8}"
          f" {'CPU p50':>8} {'CPU p99':>8}")
    for m in ms:
        for efc in efcs:
            t = time.perf_counter()
            index = VectorIndex.build(DIM, len(vecs), ((ids[s : s + 10_000], vecs[s : s + 10_000])
                                                       for s in range(0, len(vecs), 10_000)),
                                      m=m, ef_construction=efc)
            build_s = time.perf_counter() - t
            for ef in efs:
                lat, cpu, rec = [], [], []
                for j, q in enumerate(qs):
                    t, c = time.perf_counter(), time.thread_time()
                    labels, _ = index.knn(q[None], 8, ef)
                    cpu.append((time.thread_time() - c) * 1000)
                    lat.append((time.perf_counter() - t) * 1000)
                    rec.append(truth.recall(j, labels[0]))
                a50, a99 = pct(lat)
                c50, c99 = pct(cpu)
                print(f"{m:>3} {efc:>5} {build_s:>8.1f} {ef:>5} {np.mean(rec):>9.4f} {a50:>8.3f} {a99:>8.3f}"
                      f" {c50:>8.3f} {c99:>8.3f}", flush=True)
            del index


def reopen(path: Path) -> None:
    t = time.perf_counter()
    bank = ExperienceBank(path, embedder=HashingEmbedder(DIM))
    saved_s = time.perf_counter() - t
    n, rebuilt = len(bank), bank.rebuilt_index
    bank.close()
    (path / "index.json").unlink()
    t = time.perf_counter()
    bank = ExperienceBank(path, embedder=HashingEmbedder(DIM))
    rebuild_s = time.perf_counter() - t
    assert bank.rebuilt_index and not rebuilt
    bank.close()
    print(f"reopen {n:,}-entry bank: saved index {saved_s:.2f}s, rebuilt from SQLite {rebuild_s:.2f}s "
          f"({rebuild_s / saved_s:.1f}x slower)")


def manager_throughput(root: Path, queries: int, rng: np.random.Generator) -> None:
    from crl_agent.experience.embedder import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder()
    texts = experience_corpus.queries(queries, seed=7)
    texts = [f"{t} (case {i})" for i, t in enumerate(texts)]  # distinct: no cache hits
    embedder.embed(texts[:4])  # warm up
    bank = ExperienceBank(root / "mgr", embedder=embedder)
    fill(bank, unit(rng, 5000), ["bench"] * 5000)

    async def serve(batch_size: int) -> float:
        m = ExperienceManager(bank, None, ManagerConfig(k=4, batch_size=batch_size, max_wait_ms=5))
        await m.start()
        t = time.perf_counter()
        await asyncio.gather(*(m.search(q) for q in texts))
        dt = time.perf_counter() - t
        await m.aclose()
        return queries / dt

    unbatched = asyncio.run(serve(1))
    batched = asyncio.run(serve(32))
    bank.close()
    print(f"manager with MiniLM, {queries} concurrent distinct queries: batch 32 {batched:6.1f} q/s, "
          f"batch 1 {unbatched:6.1f} q/s  ({batched / unbatched:.2f}x)")


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000,100000", help="bank sizes for the latency sweep")
    p.add_argument("--queries", type=int, default=1000, help="queries per size")
    p.add_argument("--manager-queries", type=int, default=256, help="concurrent queries for the manager test")
    p.add_argument("--sweep", action="store_true", help="the M / ef_construction / ef trade-off table")
    p.add_argument("--only-sweep", action="store_true", help="the trade-off table alone")
    p.add_argument("--sweep-m", default="16,24,32,48")
    p.add_argument("--sweep-efc", default="200,400")
    p.add_argument("--sweep-ef", default="64,128,256")
    p.add_argument("--no-uniform", action="store_true", help="skip the uniform-random worst case")
    p.add_argument("--no-reopen", action="store_true", help="skip the reopen-vs-rebuild test")
    p.add_argument("--no-manager", action="store_true", help="skip the MiniLM manager throughput test")
    args = p.parse_args()
    sizes = ints(args.sizes)
    if args.only_sweep:
        args.sweep = args.no_uniform = args.no_reopen = args.no_manager = True
    rng = np.random.default_rng(0)
    print(f"experience benchmark: {load_avg()}", flush=True)
    entries, evecs, _, qvecs = experience_corpus.corpus(max(sizes), args.queries)
    tasks = [fam for fam, _, _ in entries]
    q_tasks = [tasks[i] for i in rng.integers(len(tasks), size=len(qvecs))]  # a task per query, by share
    root = Path(tempfile.mkdtemp(prefix="crl-bench-experience-"))
    try:
        last = None
        for n in [] if args.only_sweep else sizes:
            last = bank_search(root, "minilm-corpus", evecs[:n], tasks[:n], qvecs, q_tasks)
        if args.sweep:
            sweep(evecs[: max(sizes)], qvecs, ints(args.sweep_m), ints(args.sweep_efc), ints(args.sweep_ef))
        if not args.no_uniform:
            bank_search(root, "uniform", unit(rng, 10_000), ["bench"] * 10_000, unit(rng, len(qvecs)), None)
        if last is not None and not args.no_reopen:
            reopen(last)
        if not args.no_manager:
            manager_throughput(root, args.manager_queries, rng)
        print(f"done: {load_avg()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
