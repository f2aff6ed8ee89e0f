"""Experience bank and manager speed, each against a baseline measured in the same run.

- search latency p50/p99 through ``ExperienceBank.search_vectors`` (hnswlib) against exact
  brute-force numpy, with recall@8, at 1k / 10k / 100k random unit vectors (384-d) drawn with a
  32-d latent structure like real sentence embeddings; target: p99 <= 1 ms at 100k. Uniform
  random 384-d vectors (no structure at all, HNSW's worst case) are measured at 10k too;
- time to reopen a 100k bank (saved index) against rebuilding its index from SQLite;
- manager throughput (queries/s) with micro-batching (32, 5 ms) against batch size 1, with the
  real MiniLM embedder, 256 distinct concurrent queries (no cache hits).

Run: ``python benchmarks/experience.py`` (about 2 minutes on 2 cores; ``--sizes 1000,10000`` is quicker).
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
from crl_agent.experience import ExperienceBank, ExperienceManager, HashingEmbedder, ManagerConfig  # noqa: E402

DIM = 384


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    """Uniform on the sphere: every pair nearly orthogonal, the hardest case for a graph index."""
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


LATENT = np.random.default_rng(123).normal(size=(32, DIM)).astype(np.float32)


def structured(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random unit vectors near a 32-d subspace (sentence embeddings have low intrinsic dimension)."""
    x = rng.normal(size=(n, 32)).astype(np.float32) @ LATENT + 1.2 * rng.normal(size=(n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def fill(bank: ExperienceBank, vecs: np.ndarray, chunk: int = 10_000) -> None:
    for s in range(0, len(vecs), chunk):
        n = min(chunk, len(vecs) - s)
        bank.add_many([("bench", f"entry {s + i}", "random vector", [], None) for i in range(n)], vecs[s : s + n])


def pct(ms: list[float]) -> tuple[float, float]:
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def search_latency(
    root: Path, n: int, queries: int, rng: np.random.Generator, data: str = "structured", efs: tuple[int, ...] = (64,)
) -> Path:
    """Build one bank of ``n`` vectors, then time and score searches at each ``ef``."""
    draw = structured if data == "structured" else unit
    vecs, qs = draw(rng, n), draw(rng, queries)
    path = root / f"bank{n}-{data}"
    bank = ExperienceBank(path, embedder=HashingEmbedder(DIM))
    t = time.perf_counter()
    fill(bank, vecs)
    build_s = time.perf_counter() - t
    ids = np.array(bank.ids())
    exact_ms, truth = [], []
    for q in qs:
        t = time.perf_counter()
        sims = vecs @ q
        top = np.argpartition(-sims, 8)[:8]
        top = ids[top[np.argsort(-sims[top])]]
        exact_ms.append((time.perf_counter() - t) * 1000)
        truth.append(set(top.tolist()))
    e50, e99 = pct(exact_ms)
    for ef in efs:
        bank.ef_search = ef
        ann_ms, recall = [], []
        for q, true in zip(qs, truth, strict=True):
            t = time.perf_counter()
            hits = bank.search_vectors(q[None], 8)[0]
            ann_ms.append((time.perf_counter() - t) * 1000)
            recall.append(len({i for i, _ in hits} & true) / 8)
        a50, a99 = pct(ann_ms)
        print(
            f"{data:>10} {n:>7,} entries (build {build_s:5.1f}s) ef={ef:<3}  hnswlib p50 {a50:.3f} ms p99 {a99:.3f} ms"
            f"  brute-force p50 {e50:.3f} ms p99 {e99:.3f} ms  speed-up p50 {e50 / a50:5.1f}x p99 {e99 / a99:5.1f}x"
            f"  recall@8 {np.mean(recall):.3f}",
            flush=True,
        )
    bank.close()
    return path


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
    words = "box wall key door goal corner left right up down push pick potion monster stairs price".split()
    texts = [" ".join(rng.choice(words, size=8)) + f" case {i}" for i in range(queries)]
    embedder.embed(texts[:4])  # warm up
    bank = ExperienceBank(root / "mgr", embedder=embedder)
    fill(bank, unit(rng, 5000))

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000,100000", help="bank sizes for the latency sweep")
    p.add_argument("--queries", type=int, default=500, help="queries per size")
    p.add_argument("--manager-queries", type=int, default=256, help="concurrent queries for the manager test")
    p.add_argument("--no-uniform", action="store_true", help="skip the uniform-random worst case")
    p.add_argument("--no-manager", action="store_true", help="skip the MiniLM manager throughput test")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    root = Path(tempfile.mkdtemp(prefix="crl-bench-experience-"))
    try:
        last = None
        for n in (int(s) for s in args.sizes.split(",")):
            last = search_latency(root, n, args.queries, rng, efs=(64, 128))
        if not args.no_uniform:
            search_latency(root, 10_000, args.queries, rng, data="uniform", efs=(64, 256))
        if last is not None:
            reopen(last)
        if not args.no_manager:
            manager_throughput(root, args.manager_queries, rng)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
