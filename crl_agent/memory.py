"""The process's memory: its resident size, handing freed heap back to the OS, and bounding oneDNN's caches.

Three things made a training run's resident memory (RSS) climb step after step on CPU, none of them a
Python object that outlives its step (issue 47; measured on the benchmark settings, grpo, SmolLM2-135M
in bf16 on an AMX Xeon):

- **Freed heap that glibc keeps.** An update's micro-batches allocate ~2-3 GB of activations and free
  them; so do the rollouts' forwards. glibc's ``malloc`` keeps freed chunks in its arenas (one per
  thread that allocates: the event loop, the backend's worker, the extractor's) and returns only the
  top of a heap to the OS, so RSS stays at every arena's high-water mark and climbs as later, larger or
  differently interleaved allocations miss the holes: after one update 3.6 GB of a 4.7 GB RSS was
  free heap (``mallinfo2``), live tensors 0.3 GB. :func:`release_free_heap` (``malloc_trim(0)``) hands
  those pages back; the trainer calls it where a phase ends (after each update, after each held-out
  evaluation).
- **oneDNN's caches of compiled kernels.** A bf16 matmul on CPU runs a oneDNN primitive compiled for
  its exact shape, and both oneDNN's primitive cache and ideep's (PyTorch's wrapper) keep up to 1,024 of
  them by default, each with buffers sized to its shape: the engine's forwards have a new token count
  almost every time, so the caches fill with one-off shapes. A ``576 x 1536`` bf16 linear over 1,000
  distinct token counts (1-2,000) kept 0.86 GB after ``malloc_trim`` with the default capacities, 0.26 GB
  with both at 256 and 0.08 GB at 64 (AMX Xeon; ``tests/test_memory_flat.py`` runs a smaller case). 64
  is too few: decoding cycles through ~100 shapes (8 weight shapes x the batch's 1-12 rows), and at 64
  each small matmul took 20% longer (kernels recompiled); at 256 it ran as at 1,024.
  :func:`bound_onednn_caches` sets both capacities
  (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, ``LRU_CACHE_CAPACITY``) unless the user set them; they are read
  when the first bf16 matmul runs, so it must be called before that (the transformers backend calls it
  first thing).
- **A full prefix cache during the update.** The backend's prefix KV cache (1 GiB by default) is
  dropped after every weight update anyway; it is now dropped before the update runs, so the update's
  activations do not sit on top of it (:meth:`crl_agent.llm.TransformersLLM.update_weights`).

:func:`rss_mb` and :func:`peak_rss_mb` read ``/proc/self/status`` (``VmRSS``, ``VmHWM``); the trainer
puts both in every ``metrics.jsonl`` row (``rss_mb``, ``peak_rss_mb``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import resource
import sys

# oneDNN and ideep keep this many compiled kernels each (their default is 1,024): enough for the shapes
# that repeat (decoding steps of 1-12 rows over 8 weight shapes), not for every one-off forward
ONEDNN_CACHE_CAPACITY = 256
_CACHE_VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def rss_mb() -> float:
    """This process's resident memory now, in MB (0.0 where the OS does not say)."""
    now = _status_mb("VmRSS")
    return now if now is not None else 0.0


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (``VmHWM``; ``ru_maxrss`` off Linux)."""
    peak = _status_mb("VmHWM")
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024  # bytes on macOS, kB elsewhere


@functools.lru_cache(maxsize=1)
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only (musl has none)
    except (OSError, AttributeError):
        return None
    return libc


def release_free_heap() -> bool:
    """Hand the heap pages ``malloc`` holds free back to the OS (glibc's ``malloc_trim(0)``, every arena);
    False where there is no glibc. Costs a few milliseconds per GB released."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def memory_row() -> dict[str, float]:
    """This process's resident memory now and its peak so far, in MB (``rss_mb``, ``peak_rss_mb``): each of
    a training run's step and evaluation rows carries them, so a run whose memory climbs shows where."""
    return {"rss_mb": round(rss_mb(), 1), "peak_rss_mb": round(peak_rss_mb(), 1)}


def bound_onednn_caches(capacity: int = ONEDNN_CACHE_CAPACITY) -> dict[str, str]:
    """Cap oneDNN's primitive cache and ideep's kernel cache at ``capacity`` entries each, unless the
    environment already sets them; returns the values in force. Effective only before the process's first
    oneDNN (bf16) matmul: both libraries read the variable once."""
    for name in _CACHE_VARS:
        os.environ.setdefault(name, str(int(capacity)))
    return {name: os.environ[name] for name in _CACHE_VARS}
