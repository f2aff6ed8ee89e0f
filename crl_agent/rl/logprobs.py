"""Differentiable log-probs of token sequences and of candidate actions under a Hugging Face causal LM.

What a trainer recomputes, with gradient, for the samples it replays:

- :func:`sequence_logprobs` / :func:`batch_sequence_logprobs`: the per-token log-probs of a
  generated response after its prompt (generate mode), under ``softmax(logits / temperature)``: the
  distribution it was sampled from, so that an importance ratio against the sampler's recorded
  log-probs (:attr:`crl_agent.llm.base.Completion.sampling_logprobs`) starts at 1.
- :func:`candidate_logprobs` / :func:`batch_candidate_logprobs`: the summed (or mean) log-prob of
  each candidate action's tokens after one prompt (score mode). The prompt is encoded once for all
  of a decision's candidates: ``method="packed"`` lays the prompt and every candidate out as one
  sequence with a 4D attention mask (each candidate sees the prompt and itself, and its positions
  restart where the prompt ends), so several decisions batch into one forward; ``method="cache"``
  prefills the prompt, repeats its key-value cache once per candidate and runs the candidates as a
  batched continuation (one decision per forward).
- :func:`action_logprob`: the score-mode policy's log-prob of the chosen action,
  ``log_softmax(candidate_scores / temperature)[chosen]`` (GLAM-style action scoring; DESIGN 9).

Memory (DESIGN section 9; TRL#3678, full-vocabulary logits running out of memory): the model's
output layer is applied only at the positions whose next token is needed, in chunks of rows, and each
chunk's log-prob is ``logit[target] - logsumexp(logits)`` computed in float32. When a gradient is
needed each chunk runs under activation checkpointing, so its ``[chunk, vocab]`` logits are
recomputed in the backward pass instead of being kept: peak memory is one chunk's logits, not
``[tokens, vocab]``.

The hidden states come from ``model.get_decoder()`` and the output layer from
``model.get_output_embeddings()`` (this works through a ``peft`` LoRA wrapper, whose adapters live
inside those modules). A model whose logits are not a plain linear map of the decoder's last hidden
state (with Gemma-2-style soft-capping, which is handled) is detected on first use by comparing
with the model's own forward, and refused.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

NORMS = ("sum", "mean")
METHODS = ("packed", "cache")
# float32 logits per chunk: rows * vocab <= this many elements (64 MiB)
_CHUNK_ELEMENTS = 1 << 24

TokenIds = Sequence[int] | torch.Tensor


@dataclass
class _Head:
    decoder: torch.nn.Module
    head: torch.nn.Module
    softcap: float | None
    vocab: int


_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _parts(model: torch.nn.Module) -> _Head:
    found = _VERIFIED.get(model)
    if found is not None:
        return found
    try:
        decoder = model.get_decoder()
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError) as e:
        raise TypeError(f"{type(model).__name__} is not a Hugging Face causal LM with a decoder and an output layer") from e
    if decoder is None or decoder is model or head is None or getattr(head, "weight", None) is None:
        raise TypeError(f"{type(model).__name__} has no separate decoder and output layer; use a *ForCausalLM model")
    config = getattr(model, "config", None)
    softcap = getattr(config, "final_logit_softcapping", None)
    parts = _Head(decoder=decoder, head=head, softcap=float(softcap) if softcap else None, vocab=head.weight.shape[0])
    _verify(model, parts)
    _VERIFIED[model] = parts
    return parts


def _logits(parts: _Head, hidden: torch.Tensor) -> torch.Tensor:
    logits = parts.head(hidden).float()
    if parts.softcap:
        logits = torch.tanh(logits / parts.softcap) * parts.softcap
    return logits


@torch.no_grad()
def _verify(model: torch.nn.Module, parts: _Head) -> None:
    """Refuse a model whose own logits differ from decoder + output layer (scaled or extra heads)."""
    device = parts.head.weight.device
    probe = torch.tensor([[1 % parts.vocab, 2 % parts.vocab, 3 % parts.vocab]], device=device)
    was_training = model.training
    model.eval()  # dropout would make the two forwards differ
    try:
        theirs = model(input_ids=probe, use_cache=False).logits[0, -1].float()
        hidden = parts.decoder(input_ids=probe, use_cache=False).last_hidden_state[0, -1]
    finally:
        model.train(was_training)
    ours = _logits(parts, hidden)
    if theirs.shape != ours.shape or not torch.allclose(ours, theirs, rtol=1e-2, atol=1e-2 * (1 + theirs.abs().max())):
        raise TypeError(
            f"{type(model).__name__}'s logits are not its output layer applied to its decoder's hidden states "
            "(a logit scale or an extra head?); crl_agent.rl.logprobs does not support it"
        )


def _chunk_logprobs(
    parts: _Head, hidden: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    logits = _logits(parts, hidden)
    if temperature is not None:
        logits = logits / temperature.unsqueeze(-1)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_logprobs(
    model: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    """Log-prob of ``targets[i]`` given the decoder's last hidden state ``hidden[i]``, in chunks.

    Args:
        model: the causal LM the hidden states came from.
        hidden: ``[N, H]`` last-layer hidden states (after the final norm).
        targets: ``[N]`` token ids.
        temperature: ``[N]`` (> 0): row ``i``'s logits are divided by ``temperature[i]`` before the
            softmax (``None``: the unmodified distribution, temperature 1).

    Returns:
        ``[N]`` float32 log-probs, differentiable with respect to ``hidden`` and the output layer.
    """
    parts = _parts(model)
    rows = max(1, _CHUNK_ELEMENTS // parts.vocab)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or parts.head.weight.requires_grad)
    out = []
    for start in range(0, hidden.shape[0], rows):
        h, t = hidden[start : start + rows], targets[start : start + rows]
        temp = None if temperature is None else temperature[start : start + rows]
        if grad:
            out.append(checkpoint(_chunk_logprobs, parts, h, t, temp, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(parts, h, t, temp))
    if not out:
        return hidden.new_zeros(0, dtype=torch.float32)
    return torch.cat(out)


def _ids(x: TokenIds, name: str, vocab: int, *, allow_empty: bool) -> list[int]:
    ids = x.tolist() if isinstance(x, torch.Tensor) else list(x)
    if not allow_empty and not ids:
        raise ValueError(f"{name} is empty")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab:
            raise ValueError(f"{name} holds {t!r}, not a token id in [0, {vocab})")
    return [int(t) for t in ids]


def _device_dtype(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    w = model.get_input_embeddings().weight
    return w.device, w.dtype


def _decode_and_score(model, parts, input_ids, attention, positions, picks, device, temperatures=None) -> torch.Tensor:
    """One decoder pass, then the log-prob of each ``(row, col) -> target`` pick (output layer only there),
    at ``temperatures[i]`` for pick ``i`` (``None``: 1)."""
    rows, cols, targets = picks
    hidden = parts.decoder(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        use_cache=False,
    ).last_hidden_state
    picked = hidden[torch.tensor(rows, device=device), torch.tensor(cols, device=device)]
    temp = None if temperatures is None else torch.tensor(temperatures, dtype=torch.float32, device=device)
    return token_logprobs(model, picked, torch.tensor(targets, device=device), temp)


def batch_sequence_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[TokenIds],
    responses: Sequence[TokenIds],
    temperatures: Sequence[float] | float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of each response after its prompt, in one right-padded forward.

    Args:
        model: a Hugging Face causal LM (optionally ``peft``-wrapped).
        prompts: ``B`` prompt token-id lists (each non-empty).
        responses: ``B`` response token-id lists (an empty response gives an all-masked row).
        temperatures: the temperature each response was sampled at (one for all, or ``B``; each > 0):
            its log-probs are those of ``softmax(logits / temperature)``.

    Returns:
        ``(logp, mask)``: ``[B, R]`` float32 log-probs (0 on padding) and the ``[B, R]`` bool mask of
        real response tokens, ``R`` the longest response.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    temps = [float(temperatures)] * len(prompts) if isinstance(temperatures, numbers.Real) else \
        [float(t) for t in temperatures]
    if len(temps) != len(prompts) or not all(t > 0 for t in temps):
        raise ValueError(f"temperatures must be > 0, one for all or one per response, got {temperatures!r}")
    parts = _parts(model)
    device, _ = _device_dtype(model)
    ps = [_ids(p, "a prompt", parts.vocab, allow_empty=False) for p in prompts]
    rs = [_ids(r, "a response", parts.vocab, allow_empty=True) for r in responses]
    batch = len(ps)
    width = max((len(r) for r in rs), default=0)
    logp = torch.zeros(batch, width, dtype=torch.float32, device=device)
    mask = torch.zeros(batch, width, dtype=torch.bool, device=device)
    if batch == 0 or width == 0:
        return logp, mask
    length = max(len(p) + len(r) for p, r in zip(ps, rs, strict=True))
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    attention = torch.zeros(batch, length, dtype=torch.long)
    rows, cols, targets, pick_temps = [], [], [], []
    for b, (p, r) in enumerate(zip(ps, rs, strict=True)):
        seq = p + r
        input_ids[b, : len(seq)] = torch.tensor(seq)
        attention[b, : len(seq)] = 1
        for j in range(len(r)):
            rows.append(b)
            cols.append(len(p) - 1 + j)  # the position whose next token is response[j]
            targets.append(r[j])
            pick_temps.append(temps[b])
        mask[b, : len(r)] = True
    positions = torch.arange(length).unsqueeze(0).expand(batch, -1)
    scaled = None if all(t == 1.0 for t in temps) else pick_temps
    values = _decode_and_score(model, parts, input_ids, attention, positions, (rows, cols, targets), device, scaled)
    return logp.masked_scatter(mask, values), mask


def sequence_logprobs(
    model: torch.nn.Module, prompt_ids: TokenIds, response_ids: TokenIds, temperature: float = 1.0
) -> torch.Tensor:
    """Per-token log-probs ``[len(response_ids)]`` of one response after its prompt (with gradient), under
    ``softmax(logits / temperature)``."""
    logp, _ = batch_sequence_logprobs(model, [prompt_ids], [response_ids], temperature)
    return logp[0, : len(response_ids)]


def _reduce(per_token: torch.Tensor, norm: str) -> torch.Tensor:
    return per_token.sum() if norm == "sum" else per_token.mean()


def _packed(
    model: torch.nn.Module, parts: _Head, prompts: list[list[int]], candidates: list[list[list[int]]], norm: str
) -> list[torch.Tensor]:
    device, dtype = _device_dtype(model)
    lengths = [len(p) + sum(len(c) for c in cs) for p, cs in zip(prompts, candidates, strict=True)]
    batch, width = len(prompts), max(lengths)
    input_ids = torch.zeros(batch, width, dtype=torch.long)
    positions = torch.zeros(batch, width, dtype=torch.long)
    # allowed[b, i, j]: query i may attend key j. Padding attends itself only (its output is unused).
    allowed = torch.eye(width, dtype=torch.bool).repeat(batch, 1, 1)
    rows, cols, targets = [], [], []
    for b, (p, cs) in enumerate(zip(prompts, candidates, strict=True)):
        n = len(p)
        input_ids[b, :n] = torch.tensor(p)
        positions[b, :n] = torch.arange(n)
        allowed[b, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
        start = n
        for c in cs:
            m = len(c)
            end = start + m
            input_ids[b, start:end] = torch.tensor(c)
            positions[b, start:end] = torch.arange(n, n + m)
            allowed[b, start:end, :n] = True
            allowed[b, start:end, start:end] = torch.ones(m, m, dtype=torch.bool).tril()
            for j in range(m):
                rows.append(b)
                cols.append(n - 1 if j == 0 else start + j - 1)
                targets.append(c[j])
            start = end
    bias = torch.zeros(batch, 1, width, width, dtype=dtype)
    bias.masked_fill_(~allowed.unsqueeze(1), torch.finfo(dtype).min)
    values = _decode_and_score(model, parts, input_ids, bias, positions, (rows, cols, targets), device)
    out, i = [], 0
    for cs in candidates:
        scores = []
        for c in cs:
            scores.append(_reduce(values[i : i + len(c)], norm))
            i += len(c)
        out.append(torch.stack(scores))
    return out


def _cached(model: torch.nn.Module, parts: _Head, prompt: list[int], cands: list[list[int]], norm: str) -> torch.Tensor:
    device, _ = _device_dtype(model)
    n, k = len(prompt), len(cands)
    pre = parts.decoder(input_ids=torch.tensor([prompt], device=device), use_cache=True)
    cache = pre.cache  # transformers 5.x names the key-value cache ``cache`` (``past_key_values`` is deprecated)
    cache.batch_repeat_interleave(k)
    width = max(len(c) for c in cands)
    input_ids = torch.zeros(k, width, dtype=torch.long)
    attention = torch.zeros(k, n + width, dtype=torch.long)
    attention[:, :n] = 1
    for i, c in enumerate(cands):
        input_ids[i, : len(c)] = torch.tensor(c)
        attention[i, n : n + len(c)] = 1
    positions = torch.arange(n, n + width).unsqueeze(0).expand(k, -1)
    hidden = parts.decoder(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        cache=cache,
        use_cache=True,
    ).last_hidden_state
    last = pre.last_hidden_state[0, -1]
    picked, targets = [], []
    for i, c in enumerate(cands):
        picked.append(last.unsqueeze(0))
        if len(c) > 1:
            picked.append(hidden[i, : len(c) - 1])
        targets.extend(c)
    values = token_logprobs(model, torch.cat(picked), torch.tensor(targets, device=device))
    scores, i = [], 0
    for c in cands:
        scores.append(_reduce(values[i : i + len(c)], norm))
        i += len(c)
    return torch.stack(scores)


def batch_candidate_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[TokenIds],
    candidates: Sequence[Sequence[TokenIds]],
    norm: str = "sum",
    method: str = "packed",
) -> list[torch.Tensor]:
    """Score every candidate of several decisions: its tokens' log-probs after the decision's prompt.

    Args:
        model: a Hugging Face causal LM (optionally ``peft``-wrapped).
        prompts: ``B`` prompt token-id lists (each non-empty).
        candidates: for each prompt, its candidates' token-id lists (each non-empty; at least one).
        norm: ``"sum"`` of the candidate's token log-probs, or their ``"mean"``.
        method: ``"packed"`` (one forward for all decisions, 4D mask) or ``"cache"`` (per decision:
            prompt prefill, then the candidates as a batched continuation of its cache).

    Returns:
        ``B`` tensors, the ``i``-th ``[len(candidates[i])]`` float32, differentiable.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if len(prompts) != len(candidates):
        raise ValueError(f"{len(prompts)} prompts but {len(candidates)} candidate lists")
    parts = _parts(model)
    ps = [_ids(p, "a prompt", parts.vocab, allow_empty=False) for p in prompts]
    cs = []
    for group in candidates:
        if len(group) == 0:
            raise ValueError("a decision needs at least one candidate")
        cs.append([_ids(c, "a candidate", parts.vocab, allow_empty=False) for c in group])
    if not ps:
        return []
    if method == "packed":
        return _packed(model, parts, ps, cs, norm)
    return [_cached(model, parts, p, c, norm) for p, c in zip(ps, cs, strict=True)]


def candidate_logprobs(
    model: torch.nn.Module,
    prompt_ids: TokenIds,
    candidate_ids: Sequence[TokenIds],
    norm: str = "sum",
    method: str = "packed",
) -> torch.Tensor:
    """``[K]`` log-probs of each of one prompt's ``K`` candidates (see :func:`batch_candidate_logprobs`)."""
    return batch_candidate_logprobs(model, [prompt_ids], [candidate_ids], norm, method)[0]


def action_logprob(candidate_scores: torch.Tensor, chosen: int, temperature: float = 1.0) -> torch.Tensor:
    """The score-mode policy's log-prob of the chosen action: ``log_softmax(scores / temperature)[chosen]``.

    Args:
        candidate_scores: ``[K]`` candidate log-probs (from :func:`candidate_logprobs`).
        chosen: index of the action taken.
        temperature: > 0; the policy samples from ``softmax(scores / temperature)``.
    """
    if candidate_scores.dim() != 1 or candidate_scores.numel() == 0:
        raise ValueError(f"candidate_scores must be a non-empty [K] tensor, got shape {tuple(candidate_scores.shape)}")
    if isinstance(chosen, bool) or not 0 <= int(chosen) < candidate_scores.numel():
        raise ValueError(f"chosen must index one of the {candidate_scores.numel()} candidates, got {chosen!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.log_softmax(candidate_scores.float() / temperature, dim=-1)[int(chosen)]
