"""``vllm`` backend: vLLM's offline engine in this process (CUDA GPU only, the ``gpu`` extra).

vLLM is imported lazily, so nothing here costs anything on a CPU install; building the backend
without vLLM or without a CUDA device raises an error that says what to do. Concurrent ``chat``
calls are micro-batched (:class:`~crl_agent.llm.batching.RequestBatcher`) into one
``LLM.generate`` call with per-request sampling params, run in a worker thread. For a
long-running shared server, run ``vllm serve`` and use the ``openai`` backend instead.

Log-probs come from vLLM's ``logprobs=0`` (the sampled token's log-prob; vLLM reports the raw
model distribution by default), aligned with the returned token ids.

Scoring (:meth:`VLLMLLM.score_full`) sends ``prompt + candidate + end-of-turn`` per candidate with
``prompt_logprobs=0`` and ``max_tokens=1`` in the same batched ``generate`` call and sums the
candidate positions' prompt log-probs; pass ``enable_prefix_caching=True`` so the shared prompt is
computed once. (Written against vLLM's documented API; tested only where a GPU is present.)
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_agent.llm.base import (
    LLM,
    Completion,
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

_INSTALL_HINT = 'pip install "crl-bench[gpu]" (vLLM needs a CUDA GPU and pins its own torch)'


def vllm_available() -> tuple[bool, str]:
    """Whether vLLM can run here, and why not."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU visible to torch"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False, f"vllm is not installed: {_INSTALL_HINT}"
    return True, ""


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


def _adapter_rank(path: str) -> int:
    try:
        return int(json.loads((Path(path) / "adapter_config.json").read_text())["r"])
    except (OSError, ValueError, KeyError) as e:
        raise LLMError(f"adapter={path!r} is not a LoRA adapter folder with an adapter_config.json ({e})") from None


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
        model: a local model directory (or any name vLLM resolves locally).
        seed: engine seed; requests without ``SamplingParams.seed`` draw from its stream.
        max_batch_size: most requests per ``generate`` call.
        batch_wait_ms: how long the batcher keeps collecting after the first request.
        adapter: a LoRA adapter folder (``peft`` format) applied to every request; turns on the engine's
            LoRA support (``enable_lora``, ``max_lora_rank`` from the adapter's config).
            :meth:`load_adapter` swaps it (the trainer's weight sync).
        gpu: run the engine on this one GPU (an index among the visible devices; see :func:`only_device`):
            the trainer under ``torchrun`` gives each rank an independent single-GPU engine on its own
            device, so ranks never wait on each other inside vLLM. ``None``: vLLM's default placement.
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
        **engine_kwargs: Any,
    ):
        ok, why = vllm_available()
        if not ok:
            raise LLMError(f"the vllm backend cannot run here: {why}. Use backend='transformers' on CPU, or {_INSTALL_HINT}")
        if not model:
            raise ValueError("the vllm backend needs model=<local model directory>")
        import vllm

        self._vllm = vllm
        self.model_name = str(model)
        self.engine_kwargs = dict(engine_kwargs)
        self._lora: Any = None
        self._lora_ids = 0
        if adapter is not None:
            self.engine_kwargs.setdefault("enable_lora", True)
            self.engine_kwargs.setdefault("max_lora_rank", _adapter_rank(adapter))
        engine_kwargs = self.engine_kwargs
        with only_device(gpu):
            self.engine = vllm.LLM(model=self.model_name, seed=seed, **engine_kwargs)
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
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return await self._batcher.submit(_Request(ids, params))

    async def score_full(self, messages: list[Message], candidates: list[str]) -> ScoreResult:
        messages = validate_messages(messages)
        cands = check_candidates(candidates)
        prompt = render_chat_ids(self.tokenizer, messages)
        unique = list(dict.fromkeys(cands))
        ids = {c: candidate_token_ids(self.tokenizer, c, self.end_of_turn_ids) for c in unique}
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
        vllm = self._vllm
        prompts, sampling, owner = [], [], []
        for i, r in enumerate(reqs):
            if isinstance(r, _ScoreRequest):
                for cand in r.candidates:
                    prompts.append({"prompt_token_ids": r.prompt_ids + cand})
                    sampling.append(vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))
                    owner.append(i)
        gen_reqs = [r for r in reqs if isinstance(r, _Request)]
        outputs = self.engine.generate(
            prompts + [{"prompt_token_ids": r.prompt_ids} for r in gen_reqs],
            sampling + self._sampling(gen_reqs), use_tqdm=False, lora_request=self._lora,
        ) if prompts or gen_reqs else []
        scored: dict[int, list[list[float]]] = {}
        for i, out, prompt in zip(owner, outputs[: len(prompts)], prompts, strict=True):
            r = reqs[i]
            ids = prompt["prompt_token_ids"]
            per_pos = out.prompt_logprobs or []
            start = len(r.prompt_ids)
            scored.setdefault(i, []).append(
                [float(per_pos[j][ids[j]].logprob) for j in range(start, len(ids))]
            )
        completions = iter(self._completions(gen_reqs, outputs[len(prompts):]))
        return [scored[i] if isinstance(r, _ScoreRequest) else next(completions) for i, r in enumerate(reqs)]

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

    async def aclose(self) -> None:
        await self._batcher.aclose()
        self.engine = None
