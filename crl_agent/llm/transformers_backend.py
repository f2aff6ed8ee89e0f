"""``transformers`` backend: a local causal LM on CPU or GPU, with request batching and a prefix cache.

Concurrent :meth:`TransformersLLM.chat` and :meth:`TransformersLLM.score_full` calls are collected
by a :class:`~crl_agent.llm.batching.RequestBatcher` (a few ms, up to ``max_batch_size``) and run
together in a worker thread (:mod:`crl_agent.llm.hf_engine`): one forward computes every prompt's
uncached tokens and every candidate, then generations decode together. Scores never wait for a long
generation (an extractor's distillation): those that arrive while it decodes run between its
decoding steps (``interleave_steps``) and return at once. Chats that arrive meanwhile join the
decoding rows there (``join_generations``: prefilled, lined up with the rows' keys/values, and
returned as each finishes), so a short answer does not wait for a batch of long ones. Each request keeps its own
sampling settings (temperature, top-p, seed, stop strings, max tokens), and rows that finish leave
the batch early.

Prefix cache: the keys/values of every prompt are kept (:mod:`crl_agent.llm.prefix_cache`, LRU,
``prefix_cache_bytes``, default 1 GiB, 0 turns it off), so a conversation's next turn, or a score
of the prompt just chatted, runs only the tokens its prompt adds. Results equal those without the
cache up to float rounding (tests compare greedy text, log-probs and scores).
:meth:`TransformersLLM.bump_policy_version` (after a weight update) clears it.

Scoring: a candidate is tokenized on its own (special-token text as plain text) and followed by the
end-of-turn token, found at load by rendering an assistant reply through the chat template (for
ChatML, ``<|im_end|>``), so ``"north"`` and ``"northeast"`` differ. Candidates are sent in chunks
(at most ``score_chunk`` candidates and ``score_chunk_tokens`` tokens each; chunks after the first
reuse the first one's cached prompt). A candidate longer than half the context is a ``ValueError``;
the prompt gets the context minus the longest candidate and loses old turns as for ``chat``.

dtype: on CPU, ``dtype=None`` times a bf16 and an fp32 matmul at load
(:func:`~crl_agent.llm.cpu_dtype.pick_cpu_dtype`) and takes bf16 only where it is clearly faster
(at least 1.25x: AMX/AVX512-BF16 CPUs); on GPU the default is bf16.

Log-probs are those of the *unmodified* model distribution (temperature 1, no top-p) at each
sampled token, i.e. what a trainer's forward pass over the same tokens computes;
``sampling_logprobs`` are those of the distribution each token was drawn from, ``softmax(logits /
temperature)`` (what :func:`crl_agent.rl.batch_sequence_logprobs` recomputes at that temperature). Token ids
include every generated token, also the end-of-turn token and the tokens that spell a stop
string; ``text`` excludes both.

``max_tokens`` is capped at half the context. A prompt that does not fit the rest of the
context (``max_context`` minus ``max_tokens``) loses its oldest non-system messages first (found
by bisection, so a chat of thousands of turns costs a few renders, not one per turn); a single
message that is still too long keeps its tail. Only a system message too long for the context
is an error (:class:`~crl_agent.llm.base.ContextLengthError`).

``SamplingParams.json_schema``: at every decoding step the tokens that would break the schema are
masked (:mod:`crl_agent.llm.constrained`, llguidance), so the reply is JSON of that schema, closed
before ``max_tokens``; a schema that cannot be compiled is a ``ValueError`` before queueing.

Bad requests (empty or malformed ``messages``, ``max_tokens < 1``, a NaN temperature...) raise
``ValueError`` before they are queued, so they never fail the batch they would have joined.
A ``chat`` cancelled while its batch runs leaves the batch at the next decoding step.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
from collections.abc import Callable
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
from crl_agent.llm.constrained import SchemaCompiler
from crl_agent.llm.hf_engine import ForwardEngine, GenRequest, ScoreOutput, ScoreRequest
from crl_agent.llm.models import resolve_model_path
from crl_agent.llm.prefix_cache import PrefixCache
from crl_agent.memory import bound_onednn_caches, release_free_heap

_TRUNCATION_MARK = "[...] "
_SURROGATE = re.compile("[\ud800-\udfff]")
_ROLES = {"system", "user", "assistant", "tool"}
_DTYPES = ("float32", "bfloat16", "float16")


def _import_torch():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ImportError('the transformers backend needs the agent extra: pip install "crl-bench[agent]"') from e
    return torch, transformers


def validate_messages(messages: list[Message]) -> list[Message]:
    """Check the chat shape; raise ``ValueError`` naming the problem.

    ``content`` is a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts (joined).
    Lone UTF-16 surrogates (which no tokenizer can encode) become U+FFFD.
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
        ):
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str) or m.get("role") not in _ROLES:
            raise ValueError(
                f"messages[{i}] must be a dict with role in {sorted(_ROLES)} and string content, got {str(m)[:200]}"
            )
        if not content.isascii():
            content = _SURROGATE.sub("\ufffd", content)
        out.append({"role": m["role"], "content": content})
    return out


def load_adapter(model, path: Path):
    """``model`` with the ``peft`` LoRA adapter in ``path`` merged into its weights."""
    if not (path / "adapter_config.json").is_file():
        raise LLMError(f"adapter={str(path)!r} is not a LoRA adapter folder (it has no adapter_config.json); "
                       "the trainer writes one to <run>/adapters/actor")
    try:
        from crl_agent.rl.lora import import_peft

        peft = import_peft()
    except ImportError as e:
        raise LLMError('a LoRA adapter needs peft, part of the agent extra: pip install "crl-bench[agent]"') from e
    try:
        return peft.PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    except (ValueError, RuntimeError, KeyError) as e:
        raise LLMError(f"adapter {path} does not fit this model ({type(e).__name__}: {str(e)[:300]}); "
                       "was it trained on another base model?") from e


class TransformersLLM(LLM):
    """A local Hugging Face causal LM behind the async :class:`LLM` interface.

    Args:
        model: a local model directory, or ``None`` for the packaged SmolLM2-135M-Instruct.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or ``"auto"`` (CUDA when available).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``; ``None``/``"auto"``: bf16 on GPU, and on
            CPU bf16 only where a quick matmul probe finds it clearly faster than fp32.
        max_batch_size: most requests (chats and scores) run together.
        batch_wait_ms: how long the batcher keeps collecting after the first request.
        max_context: context length in tokens (default: the model's ``max_position_embeddings``).
        num_threads: ``torch.set_num_threads`` for CPU decoding (process-wide; default: torch's).
        seed: seeds requests that carry no ``SamplingParams.seed``, in submission order.
        prefix_cache_bytes: memory budget of the prefix KV cache; 0 turns it off.
        adapter: a LoRA adapter folder saved by ``peft`` (``save_pretrained``; the trainer writes
            ``adapters/actor`` and ``adapters/extractor`` in its run folder), merged into the weights
            at load so inference runs at the base model's speed.
        score_chunk: most candidates per scoring request sent to the batcher.
        score_chunk_tokens: most candidate tokens per scoring request sent to the batcher.
        max_forward_tokens: rows x padded width of one scoring forward pass.
        interleave_steps: while generations decode, run the scoring requests that arrived since their
            batch started every this many decoding steps (:mod:`crl_agent.llm.hf_engine`); 0: scores
            wait for the batch that is running to finish, as before.
        kv_room: decode into key/value buffers that have room for the tokens to come
            (:mod:`crl_agent.llm.kv_room`); False: the copying dynamic cache (for comparisons).
        join_generations: a chat that arrives while a batch decodes joins it at the next interleave point
            (up to ``max_batch_size`` rows) instead of waiting for the whole batch; needs ``interleave_steps``.
        fold_lora: a LoRA adapter that a trainer puts on the model (in place, as ``add_lora``) is read
            folded into the weights by the engine's forwards, refolded after each update
            (:mod:`crl_agent.llm.lora_fold`); False: peft's own forward (for comparisons).
    """

    name = "transformers"

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        device: str = "cpu",
        dtype: str | None = None,
        max_batch_size: int = 8,
        batch_wait_ms: float = 5.0,
        max_context: int | None = None,
        num_threads: int | None = None,
        seed: int = 0,
        prefix_cache_bytes: int = 2**30,
        score_chunk: int = 64,
        score_chunk_tokens: int = 1024,
        max_forward_tokens: int = 8192,
        adapter: str | Path | None = None,
        interleave_steps: int = 4,
        kv_room: bool = True,
        join_generations: bool = True,
        fold_lora: bool = True,
    ):
        torch, transformers = _import_torch()
        # before the first bf16 matmul (the dtype probe below): oneDNN reads its cache sizes once
        bound_onednn_caches()
        self._torch, self._transformers = torch, transformers
        if num_threads:
            torch.set_num_threads(int(num_threads))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise LLMError(f"device={device!r} but torch sees no CUDA GPU; use device='cpu'")
        self.device = device
        if dtype in (None, "auto"):
            from crl_agent.llm.cpu_dtype import pick_cpu_dtype

            dtype = pick_cpu_dtype() if device == "cpu" else "bfloat16"
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES} or None/'auto', got {dtype!r}")
        if min(score_chunk, score_chunk_tokens, max_forward_tokens) < 1:
            raise ValueError("score_chunk, score_chunk_tokens and max_forward_tokens must be >= 1")
        self.dtype = dtype
        self.model_path, self.model_name = resolve_model_path(model)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_path)
        # Rust tokenizers can fail with "Already borrowed" when threads share one; the event loop,
        # the generation thread and server threads all use it, so every call takes this lock.
        self._tok_lock = threading.RLock()
        if not self.tokenizer.chat_template:
            raise LLMError(f"{self.model_path} has no chat template; use an instruct/chat model")
        config = transformers.AutoConfig.from_pretrained(self.model_path)
        quant = getattr(config, "quantization_config", None)
        if isinstance(quant, dict) and quant.get("quant_method") == "gguf" and not any(self.model_path.glob("*.gguf")):
            # caches converted before the converter dropped it: the weights there are plain floats
            del config.quantization_config
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            self.model_path, config=config, dtype=getattr(torch, dtype)
        )
        self.adapter = None if adapter is None else str(Path(adapter).expanduser().resolve())
        if self.adapter is not None:
            self.model = load_adapter(self.model, Path(self.adapter))
        self.model.to(device).eval()
        cfg_ctx = int(getattr(self.model.config, "max_position_embeddings", 0) or 4096)
        self.max_context = int(max_context or cfg_ctx)
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids) if self.eos_ids else 0)
        try:
            self.end_of_turn_ids = find_end_of_turn(self.tokenizer, self.eos_ids)
        except ValueError as e:
            raise LLMError(f"{self.model_path}: {e}") from None
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.seed = seed
        self._rng = random.Random(seed)
        self.max_batch_size = max_batch_size
        self.score_chunk, self.score_chunk_tokens = int(score_chunk), int(score_chunk_tokens)
        self.prefix_cache = PrefixCache(int(prefix_cache_bytes))
        self._schemas = SchemaCompiler(self.tokenizer, self.vocab_size, self.eos_ids, self._tok_lock)
        self._engine = ForwardEngine(
            self.model, device=device, pad_id=self.pad_id, eos_ids=self.eos_ids, cache=self.prefix_cache,
            decode_ids=self._decode_ids, model_name=self.model_name, policy_version=lambda: self.policy_version,
            max_forward_tokens=int(max_forward_tokens), interleave_steps=int(interleave_steps), kv_room=kv_room,
            max_rows=max_batch_size, join_generations=join_generations, fold_lora=fold_lora,
        )
        self.interleave_steps = int(interleave_steps)
        self._batcher: RequestBatcher[GenRequest | ScoreRequest, Completion | ScoreOutput] = RequestBatcher(
            self._engine.run, max_batch_size=max_batch_size, max_wait_s=batch_wait_ms / 1000, thread_name="hf-gen",
            interleave=(lambda r: join_generations or isinstance(r, ScoreRequest)) if self.interleave_steps > 0
            else None,
        )

    # ------------------------------------------------------------------ public
    @property
    def eos_ids(self) -> frozenset[int]:
        """Token ids that end a generation (settable, e.g. to an empty set for fixed-length benchmarks)."""
        return self._eos_ids

    @eos_ids.setter
    def eos_ids(self, ids) -> None:
        self._eos_ids = frozenset(int(i) for i in ids)
        if getattr(self, "_engine", None) is not None:
            self._engine.eos_ids = self._eos_ids

    @property
    def batch_stats(self):
        """How many batches ran and their sizes."""
        return self._batcher.stats

    async def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Completion:
        params = check_sampling_params(params or SamplingParams())
        messages = validate_messages(messages)
        max_new = min(params.max_tokens, max(1, self.max_context // 2))
        prompt_ids = self.fit_prompt(messages, self.max_context - max_new)
        return await self.complete_ids(prompt_ids, params)

    async def complete_ids(self, prompt_ids: list[int], params: SamplingParams | None = None) -> Completion:
        """Sample a continuation of raw prompt token ids (no chat template; the prompt is not fitted).

        Raises:
            ValueError: empty ids, ids outside the vocabulary, or a prompt plus ``max_tokens`` over the context.
        """
        params = check_sampling_params(params or SamplingParams())
        prompt_ids = self._check_ids(prompt_ids, "prompt")
        max_new = min(params.max_tokens, max(1, self.max_context // 2))
        if len(prompt_ids) + max_new > self.max_context:
            raise ContextLengthError(f"{len(prompt_ids)} prompt tokens + max_tokens {max_new} is over the context "
                                     f"of {self.max_context} tokens")
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        constraint = None
        if params.json_schema is not None:  # compiled here: a bad schema fails before it is queued
            constraint = await asyncio.to_thread(self._schemas.constraint, params.json_schema)
        request = GenRequest(prompt_ids, params, max_new, int(seed) % 2**64, constraint=constraint)  # 64-bit seeds
        return await self._submit(request)

    async def score_full(self, messages: list[Message], candidates: list[str]) -> ScoreResult:
        messages = validate_messages(messages)
        cands = check_candidates(candidates)
        unique = list(dict.fromkeys(cands))  # duplicates are scored once
        ids = [self.candidate_ids(c) for c in unique]
        cap = self.max_context // 2
        for text, cid in zip(unique, ids, strict=True):
            if len(cid) > cap:
                i = cands.index(text)
                raise ValueError(f"candidates[{i}] is {len(cid)} tokens; at most {cap} (half the model's context of "
                                 f"{self.max_context}) can be scored: shorten it or use action_mode=generate")
        prompt_ids = self.fit_prompt(messages, self.max_context - max(len(c) for c in ids))
        result = await self.score_ids(prompt_ids, ids)
        where = {text: k for k, text in enumerate(unique)}
        order = [where[c] for c in cands]
        return ScoreResult(
            logprobs=[result.logprobs[k] for k in order],
            token_counts=[result.token_counts[k] for k in order],
            prompt_token_ids=result.prompt_token_ids,
            candidate_token_ids=[list(result.candidate_token_ids[k]) for k in order],
            token_logprobs=[list(result.token_logprobs[k]) for k in order],
            model=self.model_name,
            policy_version=result.policy_version,
        )

    async def score_ids(self, prompt_ids: list[int], candidate_ids: list[list[int]]) -> ScoreResult:
        """Log-probs of token-id continuations of a token-id prompt (no template, no end-of-turn added).

        The token-level form of :meth:`score_full`, for callers that hold ids (a trainer, the
        server's ``echo``). Candidates go to the batcher in chunks; the first chunk's prompt is
        cached, so later chunks run only their candidates.

        Raises:
            ValueError: empty prompt, an empty candidate list or candidate, ids outside the vocabulary.
            ContextLengthError: the prompt plus the longest candidate is over the context.
        """
        prompt_ids = self._check_ids(prompt_ids, "prompt")
        if not isinstance(candidate_ids, (list, tuple)) or not candidate_ids:
            raise ValueError("candidate_ids must be a non-empty list of token-id lists")
        cands = [self._check_ids(c, f"candidate_ids[{i}]") for i, c in enumerate(candidate_ids)]
        if len(prompt_ids) + max(len(c) for c in cands) > self.max_context:
            raise ContextLengthError(f"{len(prompt_ids)} prompt tokens + the longest candidate "
                                     f"({max(len(c) for c in cands)}) is over the context of {self.max_context}")
        chunks, cur, cur_tokens = [], [], 0
        for c in cands:
            if cur and (len(cur) >= self.score_chunk or cur_tokens + len(c) > self.score_chunk_tokens):
                chunks.append(cur)
                cur, cur_tokens = [], 0
            cur.append(c)
            cur_tokens += len(c)
        chunks.append(cur)
        first = await self._submit(ScoreRequest(prompt_ids, chunks[0]))
        rest = await asyncio.gather(*(self._submit(ScoreRequest(prompt_ids, ch)) for ch in chunks[1:]))
        token_lps = [lp for out in [first, *rest] for lp in out.token_logprobs]
        return ScoreResult(
            logprobs=[float(sum(lps)) for lps in token_lps],
            token_counts=[len(c) for c in cands],
            prompt_token_ids=list(prompt_ids),
            candidate_token_ids=cands,
            token_logprobs=token_lps,
            model=self.model_name,
            policy_version=min(out.policy_version for out in [first, *rest]),
        )

    def candidate_ids(self, text: str) -> list[int]:
        """The ids scored for candidate ``text``: its tokens on their own, then the end-of-turn token."""
        with self._tok_lock:
            return candidate_token_ids(self.tokenizer, text, self.end_of_turn_ids)

    async def update_weights(self, fn: Callable[[object], None]) -> int:
        """Run ``fn(model)`` on the worker thread between batches, then bump the policy version.

        The safe way to change weights in place (e.g. load a trainer's state dict): no batch runs
        while ``fn`` does, and the prefix cache is cleared before the next one. Returns the new version.

        The prefix cache is dropped before ``fn`` runs too (it is stale after it anyway), so a trainer's
        activations do not sit on top of a full cache, and the heap ``fn`` freed goes back to the OS
        after it (:func:`crl_agent.memory.release_free_heap`): without both, a training run's resident
        memory climbed by gigabytes a step (issue 47).
        """

        def exclusive() -> None:
            self.prefix_cache.clear()
            try:
                fn(self.model)
            finally:
                release_free_heap()

        await self._batcher.run_exclusive(exclusive)
        return self.bump_policy_version()

    def _weights_changed(self) -> None:
        self.prefix_cache.clear()

    async def _submit(self, request: GenRequest | ScoreRequest):
        try:
            return await self._batcher.submit(request)
        except BaseException:
            request.cancelled = True  # cancelled (or the loop is closing): stop spending compute on it
            raise

    def _check_ids(self, ids: object, what: str) -> list[int]:
        if not isinstance(ids, (list, tuple)) or not ids:
            raise ValueError(f"{what} must be a non-empty list of token ids")
        out = []
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise ValueError(f"{what} holds {t!r}, not a token id in [0, {self.vocab_size})")
            out.append(int(t))
        return out

    def render(self, messages: list[Message]) -> list[int]:
        """Token ids of the chat template applied to ``messages``, ready for the assistant's turn."""
        with self._tok_lock:
            return render_chat_ids(self.tokenizer, messages)

    def fit_prompt(self, messages: list[Message], budget: int) -> list[int]:
        """Render ``messages`` within ``budget`` tokens, dropping the oldest turns first.

        The system message is always kept; when only one other message is left and it is still
        too long, its content keeps its last tokens behind a ``[...]`` mark.

        Raises:
            ContextLengthError: when even the system message plus a truncated last message cannot fit.
        """
        ids = self.render(messages)
        if len(ids) <= budget:
            return ids
        system = [m for m in messages[:1] if m["role"] == "system"]
        rest = list(messages[len(system):])

        def kept(dropped: int) -> list[Message]:
            # a kept history never opens with an assistant turn (unless it is the last message)
            if dropped < len(rest) - 1 and rest[dropped]["role"] == "assistant":
                dropped += 1
            return rest[dropped:]

        # Fewest dropped turns that fit, by bisection: the rendered length shrinks as turns are dropped.
        lo, hi = 1, len(rest) - 1
        best: list[int] | None = None
        while lo <= hi:
            mid = (lo + hi) // 2
            cand = self.render(system + kept(mid))
            if len(cand) <= budget:
                best, hi = cand, mid - 1
            else:
                lo = mid + 1
        if best is not None:
            return best
        rest = rest[-1:]
        ids = self.render(system + rest)
        if len(ids) <= budget:
            return ids
        last = rest[-1]
        content_ids = self._encode(last["content"])
        overhead = len(ids) - len(content_ids) + 8
        keep = budget - overhead
        while keep > 0:
            content = _TRUNCATION_MARK + self._decode_ids(content_ids[-keep:])
            ids = self.render(system + [{"role": last["role"], "content": content}])
            if len(ids) <= budget:
                return ids
            keep -= max(8, len(ids) - budget)
        raise ContextLengthError(
            f"the prompt cannot fit the model's context ({self.max_context} tokens, {budget} left for the prompt "
            "after max_tokens): shorten the system message, lower max_tokens, or raise max_context"
        )

    def _encode(self, text: str) -> list[int]:
        with self._tok_lock:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _decode_ids(self, ids: list[int]) -> str:
        with self._tok_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def count_tokens(self, text: str) -> int:
        return len(self._encode(text))

    def encode(self, text: str) -> list[int]:
        """Token ids of plain ``text`` (no special tokens added)."""
        return self._encode(text)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens included."""
        with self._tok_lock:
            return self.tokenizer.decode(ids)

    def token_strings(self, token_ids: list[int]) -> list[str]:
        """The text of each token on its own (for OpenAI-style ``logprobs.content``)."""
        with self._tok_lock:
            return [self.tokenizer.decode([t]) for t in token_ids]

    def config(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.model_name,
            "model_path": str(self.model_path),
            "device": self.device,
            "dtype": self.dtype,
            "adapter": self.adapter,
            "max_batch_size": self.max_batch_size,
            "max_context": self.max_context,
            "prefix_cache_bytes": self.prefix_cache.max_bytes,
            "interleave_steps": self.interleave_steps,
            "join_generations": self._engine.join_generations,
            "end_of_turn_ids": list(self.end_of_turn_ids),
        }

    async def aclose(self) -> None:
        await self._batcher.aclose()
