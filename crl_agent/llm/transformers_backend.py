"""``transformers`` backend: a local causal LM on CPU or GPU, with request batching.

Concurrent :meth:`TransformersLLM.chat` calls are collected by a
:class:`~crl_agent.llm.batching.RequestBatcher` (a few ms, up to ``max_batch_size``), left-padded
and decoded together with a KV cache in a worker thread. Each request keeps its own sampling
settings (temperature, top-p, seed, stop strings, max tokens), and rows that finish leave the
batch early.

Log-probs are those of the *unmodified* model distribution (temperature 1, no top-p) at each
sampled token, i.e. what a trainer's forward pass over the same tokens computes. Token ids
include every generated token, also the end-of-turn token and the tokens that spell a stop
string; ``text`` excludes both.

``max_tokens`` is capped at half the context. A prompt that does not fit the rest of the
context (``max_context`` minus ``max_tokens``) loses its oldest non-system messages first (found
by bisection, so a chat of thousands of turns costs a few renders, not one per turn); a single
message that is still too long keeps its tail. Only a system message too long for the context
is an error (:class:`~crl_agent.llm.base.ContextLengthError`).

Bad requests (empty or malformed ``messages``, ``max_tokens < 1``, a NaN temperature...) raise
``ValueError`` before they are queued, so they never fail the batch they would have joined.
A ``chat`` cancelled while its batch runs leaves the batch at the next decoding step.
"""

from __future__ import annotations

import random
import re
import threading
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
    check_sampling_params,
)
from crl_agent.llm.batching import RequestBatcher
from crl_agent.llm.models import resolve_model_path

_TRUNCATION_MARK = "[...] "
_SURROGATE = re.compile("[\ud800-\udfff]")
_ROLES = {"system", "user", "assistant", "tool"}


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


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    max_new: int
    seed: int
    cancelled: bool = False  # set from the event loop when the caller gave up; the decoder drops the row


class TransformersLLM(LLM):
    """A local Hugging Face causal LM behind the async :class:`LLM` interface.

    Args:
        model: a local model directory, or ``None`` for the packaged SmolLM2-135M-Instruct.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or ``"auto"`` (CUDA when available).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``; default fp32 on CPU, bf16 on GPU.
        max_batch_size: most requests decoded together.
        batch_wait_ms: how long the batcher keeps collecting after the first request.
        max_context: context length in tokens (default: the model's ``max_position_embeddings``).
        num_threads: ``torch.set_num_threads`` for CPU decoding (process-wide; default: torch's).
        seed: seeds requests that carry no ``SamplingParams.seed``, in submission order.
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
    ):
        torch, transformers = _import_torch()
        self._torch, self._transformers = torch, transformers
        if num_threads:
            torch.set_num_threads(int(num_threads))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise LLMError(f"device={device!r} but torch sees no CUDA GPU; use device='cpu'")
        self.device = device
        dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
        self.dtype = dtype
        self.model_path, self.model_name = resolve_model_path(model)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_path)
        # Rust tokenizers can fail with "Already borrowed" when threads share one; the event loop,
        # the generation thread and server threads all use it, so every call takes this lock.
        self._tok_lock = threading.RLock()
        if not self.tokenizer.chat_template:
            raise LLMError(f"{self.model_path} has no chat template; use an instruct/chat model")
        self.model = transformers.AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, dtype))
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
        self.seed = seed
        self._rng = random.Random(seed)
        self.max_batch_size = max_batch_size
        self._batcher: RequestBatcher[_Request, Completion] = RequestBatcher(
            self._generate_batch, max_batch_size=max_batch_size, max_wait_s=batch_wait_ms / 1000, thread_name="hf-gen"
        )

    # ------------------------------------------------------------------ public
    @property
    def batch_stats(self):
        """How many batches (``generate`` calls) ran and their sizes."""
        return self._batcher.stats

    async def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Completion:
        params = check_sampling_params(params or SamplingParams())
        messages = validate_messages(messages)
        max_new = min(params.max_tokens, max(1, self.max_context // 2))
        prompt_ids = self.fit_prompt(messages, self.max_context - max_new)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        request = _Request(prompt_ids, params, max_new, int(seed) % 2**64)  # torch seeds are 64-bit
        try:
            return await self._batcher.submit(request)
        except BaseException:
            request.cancelled = True  # cancelled (or the loop is closing): stop spending compute on it
            raise

    def render(self, messages: list[Message]) -> list[int]:
        """Token ids of the chat template applied to ``messages``, ready for the assistant's turn."""
        with self._tok_lock:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

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
            "max_batch_size": self.max_batch_size,
            "max_context": self.max_context,
        }

    async def aclose(self) -> None:
        await self._batcher.aclose()

    # -------------------------------------------------------------- generation
    def _sample(self, logits, params: SamplingParams, gen) -> int:
        torch = self._torch
        if params.temperature <= 0:
            return int(torch.argmax(logits))
        scaled = logits / params.temperature
        probs = torch.softmax(scaled, dim=-1)
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            sorted_p[(cum - sorted_p) > params.top_p] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        # Inverse-CDF sampling: one uniform draw from the request's own generator (cheaper than multinomial).
        cdf = torch.cumsum(probs, dim=-1)
        u = torch.rand(1, generator=gen, dtype=cdf.dtype) * cdf[-1]
        return int(torch.searchsorted(cdf, u, right=True).clamp(max=cdf.numel() - 1))

    def _generate_batch(self, reqs: list[_Request]) -> list[Completion]:
        torch = self._torch
        with torch.inference_mode():
            return self._decode(reqs)

    def _decode(self, reqs: list[_Request]) -> list[Completion]:
        torch, transformers = self._torch, self._transformers
        n = len(reqs)
        width = max(len(r.prompt_ids) for r in reqs)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(reqs):
            input_ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, width - len(r.prompt_ids):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self.device
        input_ids, mask, positions = input_ids.to(dev), mask.to(dev), positions.to(dev)
        gens = [torch.Generator().manual_seed(r.seed) for r in reqs]
        cache = transformers.DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :].float().cpu()
        active = list(range(n))  # request index of each row still in the batch
        gen_ids: list[list[int]] = [[] for _ in reqs]
        lps: list[list[float]] = [[] for _ in reqs]
        finish = ["length"] * n
        stop_at: list[int | None] = [None] * n
        next_pos = positions[:, -1:] + 1
        while active:
            logprobs = torch.log_softmax(logits, dim=-1)
            keep_rows, feed = [], []
            for row, i in enumerate(active):
                r = reqs[i]
                if r.cancelled:  # nobody waits for this row any more
                    continue
                tok = self._sample(logits[row], r.params, gens[i])
                gen_ids[i].append(tok)
                lps[i].append(float(logprobs[row, tok]))
                done = False
                if tok in self.eos_ids:
                    finish[i], done = "stop", True
                elif r.params.stop:
                    text = self._decode_ids(gen_ids[i])
                    hits = [text.find(s) for s in r.params.stop if s and s in text]
                    if hits:
                        finish[i], stop_at[i], done = "stop", min(hits), True
                if not done and len(gen_ids[i]) >= r.max_new:
                    done = True
                if not done:
                    keep_rows.append(row)
                    feed.append(tok)
            if not keep_rows:
                break
            if len(keep_rows) < len(active):
                idx = torch.tensor(keep_rows, device=dev)
                cache.batch_select_indices(idx)
                mask, next_pos = mask[idx], next_pos[idx]
                active = [active[row] for row in keep_rows]
            step_ids = torch.tensor(feed, dtype=torch.long, device=dev).unsqueeze(1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = self.model(
                input_ids=step_ids, attention_mask=mask, position_ids=next_pos, cache=cache, use_cache=True,
            )
            logits = out.logits[:, -1, :].float().cpu()
            next_pos = next_pos + 1
        results = []
        for i, r in enumerate(reqs):
            text = self._decode_ids(gen_ids[i])
            if stop_at[i] is not None:
                text = text[: stop_at[i]]
            results.append(
                Completion(
                    text=text,
                    token_ids=gen_ids[i],
                    logprobs=lps[i],
                    prompt_token_ids=list(r.prompt_ids),
                    prompt_tokens=len(r.prompt_ids),
                    finish_reason=finish[i],
                    model=self.model_name,
                )
            )
        return results
