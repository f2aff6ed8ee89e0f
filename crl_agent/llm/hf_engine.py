"""The transformers backend's worker-thread side: one batched forward for chats and scores, then decoding.

A batch holds generation requests (:class:`GenRequest`) and scoring requests (:class:`ScoreRequest`)
from any number of episodes. Each request first takes the longest stored prefix of its prompt from
the :class:`~crl_agent.llm.prefix_cache.PrefixCache` (at most all but the last prompt token: the
last one must run to predict what follows). Then one forward pass runs, for every request at once,
the prompt tokens the cache did not hold and, for a scoring request, every candidate after them.

Layout of row ``b`` (one request) in that forward::

    keys/values: [ cached prefix (n_b) | padding to the longest prefix | new tokens | padding ]
    new tokens:  [ prompt suffix | candidate 1 | candidate 2 | ... ]

A 4D attention mask lets the suffix attend causally to the prefix and to itself, and each
candidate to the prefix, the suffix and its own earlier tokens only, never to another candidate;
position ids restart at the prompt's length for every candidate. So each candidate is computed as
if it were alone after the prompt, but the prompt is computed once and all candidates share one
forward (as in DESIGN section 9: 8 MiniHack moves scored in one sequence). The output layer runs
only at the positions whose next token is needed: the last prompt token and each candidate token
but the last, in chunks, so 1,000 candidates never build a 1,000 x vocabulary logits tensor at once.

A forward of generation rows only, with nothing cached and no padding (one row, or rows of equal
length), needs none of that: it runs with no explicit mask, so SDPA applies its own causal mask
(``is_causal``): a 2,111-token distil prompt took 30.5 s instead of 43.4 s on 2 CPU cores
(``benchmarks/causal_prefill.py``). Only a prompt that shares no leading token with a cached one
qualifies: every chat starts with its template's header, so after a backend's first request most
prompts take the masked path from their cached start (a distillation after the first, whose
538-token system prompt is cached, took 17.8 s).

After the forward, each request's prompt keys/values go back into the cache; generation rows then
decode together with a 2D padding mask, leaving the batch (and delivered) as they finish.

Scoring never waits for decoding (continuous batching for scores): a batch's scoring forwards run
before its generations decode and their results are delivered at once, and every
``interleave_steps`` decoding steps the engine takes the scoring requests that arrived since the
batch started (:class:`~crl_agent.llm.batching.BatchWindow`), runs their forwards as a batch of
their own, delivers them, and goes on decoding. A scoring forward builds its own key/value cache, so
the generations' caches and sampling streams are untouched: scores and sampled tokens equal those of
the same requests run alone.

Generations join too (continuous batching, ``join_generations``): at the same points the engine takes
generation requests that arrived, up to ``max_rows`` rows decoding, prefills them in a forward of their
own (their cached prefixes included), and lines their keys/values up with the decoding rows': both are
padded to the longer of the two lengths, the padding masked out, positions explicit, so each row still
attends to its own prompt and tokens only. A joined request samples from its own seeded generator, so it
decodes what it would alone (up to float rounding). A batch takes in at most ``max_rows`` requests, so it
ends, and work that waits for the worker thread between batches (a weight sync) is not starved. An
answer of 33 tokens that waited for a batch of 128-token distillations now decodes beside them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from crl_agent.llm.base import Completion, SamplingParams
from crl_agent.llm.batching import BatchWindow
from crl_agent.llm.constrained import SchemaConstraint, close_reserve
from crl_agent.llm.prefix_cache import PrefixCache

_LOGIT_CHUNK = 256  # rows of vocabulary-sized logits materialised at once


@dataclass
class GenRequest:
    """Sample a reply to ``prompt_ids``."""

    prompt_ids: list[int]
    params: SamplingParams
    max_new: int
    seed: int
    cancelled: bool = False  # set from the event loop when the caller gave up; the decoder drops the row
    constraint: SchemaConstraint | None = None  # params.json_schema's matcher (crl_agent.llm.constrained)


@dataclass
class ScoreRequest:
    """Per-token log-probs of each candidate (token ids) written after ``prompt_ids``."""

    prompt_ids: list[int]
    candidates: list[list[int]]
    cancelled: bool = False


@dataclass
class ScoreOutput:
    token_logprobs: list[list[float]]
    policy_version: int


@dataclass
class PrefillStats:
    """How many forwards ran with the plain causal mask and how many with the explicit 4D mask."""

    causal: int = 0
    masked: int = 0


@dataclass
class _Row:
    req: GenRequest | ScoreRequest
    cached: int  # prompt tokens taken from the prefix cache
    kv: Any  # their keys/values (per layer), or None
    new: list[int] = field(default_factory=list)
    seg: list[int] = field(default_factory=list)  # 0: prompt suffix, k + 1: candidate k
    pos: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # where each candidate starts in ``new``

    @property
    def suffix(self) -> int:
        return len(self.req.prompt_ids) - self.cached


class ForwardEngine:
    """Runs batches of :class:`GenRequest` / :class:`ScoreRequest` on one model (worker thread only).

    Args:
        model: a Hugging Face causal LM in eval mode.
        device: where its tensors live.
        pad_id: token id used for padding (never attended to).
        eos_ids: ids that end a generation.
        cache: the shared prefix cache.
        decode_ids: token ids -> text (for stop strings).
        model_name: stamped into completions.
        policy_version: returns the backend's policy version (stamped into results).
        max_forward_tokens: rows x padded width of one scoring forward; more scoring requests run
            in further forwards (generation requests always share the first).
        causal_prefill: run forwards that need no explicit mask (see the module docstring) with the
            model's own causal mask; False builds the 4D mask for every forward (for comparisons).
        kv_room: decode into key/value buffers with room for the tokens to come
            (:mod:`crl_agent.llm.kv_room`) instead of growing them by a copy every step; False: the plain
            dynamic cache (for comparisons).
        max_rows: most generation rows decoding together once requests join a running batch (the backend's
            ``max_batch_size``).
        join_generations: generation requests that arrive while a batch decodes join it (up to ``max_rows``
            rows, and at most ``max_rows`` joined per batch, so the batch ends and weight syncs get their
            turn); False: they wait for the next batch.
        fold_lora: forwards read LoRA adapters folded into their layers' weights, recomputed after each
            weight change (:mod:`crl_agent.llm.lora_fold`); False: peft's two extra matmuls per layer.
    """

    def __init__(
        self,
        model: Any,
        *,
        device: str,
        pad_id: int,
        eos_ids: frozenset[int],
        cache: PrefixCache,
        decode_ids: Callable[[list[int]], str],
        model_name: str,
        policy_version: Callable[[], int],
        max_forward_tokens: int = 8192,
        interleave_steps: int = 4,
        causal_prefill: bool = True,
        kv_room: bool = True,
        max_rows: int = 8,
        join_generations: bool = True,
        fold_lora: bool = True,
    ):
        import torch
        import transformers

        from crl_agent.llm.lora_fold import FoldedLoRA

        self.torch, self.transformers = torch, transformers
        self.model, self.device, self.pad_id, self.eos_ids = model, device, pad_id, eos_ids
        self.cache, self.decode_ids, self.model_name = cache, decode_ids, model_name
        self.policy_version = policy_version
        self.max_forward_tokens = max_forward_tokens
        self.interleave_steps = int(interleave_steps)
        self.causal_prefill = bool(causal_prefill)
        self.kv_room = bool(kv_room)
        self.max_rows = max(1, int(max_rows))
        self.join_generations = bool(join_generations)
        self.fold = FoldedLoRA(model, enabled=fold_lora, version=policy_version)
        self.joined = 0  # generation requests that joined a decoding batch (tests and benchmarks read it)
        self.decoded_tokens = 0  # tokens generated, joined requests' included (benchmarks read it)
        self.prefills = PrefillStats()
        self.on_decode_step: Callable[[int], None] | None = None  # observer, called after each decoding step
        self.base = model.base_model
        self.head = model.get_output_embeddings()
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        # Slicing keys/values by position is exact only for full-attention layers.
        probe = transformers.DynamicCache(config=model.config)
        self.cacheable = bool(probe.layers) and all(type(x) is transformers.cache_utils.DynamicLayer
                                                    for x in probe.layers)

    # ---------------------------------------------------------------- batches
    def run(self, reqs: list[GenRequest | ScoreRequest], window: BatchWindow | None = None) -> list[Any]:
        """One result per request: a Completion, a ScoreOutput or an exception.

        With a ``window`` (the batcher's), each result is delivered as soon as it is ready (a generation when
        it finishes), and decoding takes in the requests that arrive meanwhile (see the module docstring)."""
        torch = self.torch
        results: list[Any] = [RuntimeError("cancelled before it ran")] * len(reqs)
        live = [i for i, r in enumerate(reqs) if not r.cancelled]
        cache_version = self.cache.version  # before any lookup: entries stored later must be as fresh as those read
        plans = {i: self._plan(reqs[i]) for i in live}
        gens = [i for i in live if isinstance(reqs[i], GenRequest)]
        scores = [i for i in live if isinstance(reqs[i], ScoreRequest)]
        groups: list[list[int]] = []
        for i in scores:  # pack scoring requests by padded width (rows x longest new-token run)
            group = groups[-1] if groups else None
            if group is not None:
                width = max(len(plans[j].new) for j in [*group, i])
                if (len(group) + 1) * width <= self.max_forward_tokens:
                    group.append(i)
                    continue
            groups.append([i])
        if gens:  # after the scores: they are short, and must not wait for decoding
            groups.append(gens)
        with torch.inference_mode(), self.fold.active():
            for group in groups:
                deliver = None if window is None else [lambda res, i=i: window.deliver(i, res) for i in group]
                try:
                    done = self._run_group([plans[i] for i in group], cache_version, window, deliver)
                    for i, res in zip(group, done, strict=True):
                        results[i] = res
                except Exception as e:  # noqa: BLE001 - fails this forward's requests, not the batcher
                    for i in group:
                        results[i] = e
                if window is not None:
                    for i in group:
                        window.deliver(i, results[i])  # a no-op for those delivered already
        return results

    def _take_in(self, window: BatchWindow, gen_room: int = 0) -> list[tuple[GenRequest, Callable[[Any], None]]]:
        """Run the scoring requests that arrived while decoding and deliver their results; return the
        generation requests taken to join the decoding rows (at most ``gen_room``)."""
        room = gen_room

        def accept(req) -> bool:
            nonlocal room
            if isinstance(req, GenRequest):
                if room <= 0 or req.cancelled:
                    return False
                room -= 1
            return True

        late = window.take(accept)
        scores = [(req, resolve) for req, resolve in late if isinstance(req, ScoreRequest)]
        if scores:
            for (_, resolve), res in zip(scores, self.run([req for req, _ in scores]), strict=True):
                resolve(res)
        return [(req, resolve) for req, resolve in late if isinstance(req, GenRequest)]

    def _plan(self, req: GenRequest | ScoreRequest) -> _Row:
        prompt = req.prompt_ids
        if self.cacheable and self.cache.max_bytes:
            cached, kv = self.cache.match(prompt, limit=len(prompt) - 1)
        else:
            cached, kv = 0, None
        row = _Row(req, cached, kv)
        row.new = list(prompt[cached:])
        row.seg = [0] * len(row.new)
        row.pos = list(range(cached, len(prompt)))
        if isinstance(req, ScoreRequest):
            for k, cand in enumerate(req.candidates):
                row.offsets.append(len(row.new))
                row.new += cand
                row.seg += [k + 1] * len(cand)
                row.pos += range(len(prompt), len(prompt) + len(cand))
        return row

    def _forward(self, rows: list[_Row], cache_version: int):
        """The forward of ``rows`` (prompt suffixes and candidates) on their cached prefixes: the last hidden
        states, the key/value cache, each new token's segment, each row's cached length and the padded past."""
        torch, dev = self.torch, self.device
        n_rows, past = len(rows), max(r.cached for r in rows)
        width = max(len(r.new) for r in rows)
        input_ids = torch.full((n_rows, width), self.pad_id, dtype=torch.long)
        positions = torch.zeros((n_rows, width), dtype=torch.long)
        seg = torch.full((n_rows, width), -1, dtype=torch.long)
        cached = torch.tensor([r.cached for r in rows])
        for b, r in enumerate(rows):
            m = len(r.new)
            input_ids[b, :m] = torch.tensor(r.new, dtype=torch.long)
            positions[b, :m] = torch.tensor(r.pos, dtype=torch.long)
            seg[b, :m] = torch.tensor(r.seg, dtype=torch.long)
        kv_cache = self._seed_cache(rows, past)
        input_ids, positions = input_ids.to(dev), positions.to(dev)
        if self._plain_causal(rows, past):
            self.prefills.causal += 1
            hidden = self.base(input_ids=input_ids, position_ids=positions, cache=kv_cache,
                               use_cache=True).last_hidden_state
        else:
            self.prefills.masked += 1
            mask = self._mask(seg, cached, past).to(dev)
            hidden = self.base(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=kv_cache,
                               use_cache=True).last_hidden_state
        self._store_prompts(rows, kv_cache, past, cache_version)
        return hidden, kv_cache, seg, cached, past

    def _start_generations(self, rows: list[_Row], gen_rows: list[int], hidden, kv_cache, seg, cached, past: int):
        """The first next-token logits of the generation rows ``gen_rows`` of a forward, and their decoding
        mask (valid cached prefix and prompt suffix columns); ``kv_cache`` keeps those rows only."""
        torch, dev = self.torch, self.device
        last = torch.tensor([rows[b].suffix - 1 for b in gen_rows], device=dev)
        logits = self._logits(hidden[torch.tensor(gen_rows, device=dev), last]).cpu()
        if len(gen_rows) < len(rows):
            kv_cache.batch_select_indices(torch.tensor(gen_rows, device=dev))
        idx = torch.arange(past)
        past_ok = idx[None, :] < cached[gen_rows][:, None]
        attn = torch.cat([past_ok, seg[gen_rows] == 0], dim=1).long().to(dev)
        return logits, attn

    def _run_group(self, rows: list[_Row], cache_version: int, window: BatchWindow | None = None,
                   deliver: list[Callable[[Any], None]] | None = None) -> list[Any]:
        version = self.policy_version()
        hidden, kv_cache, seg, cached, past = self._forward(rows, cache_version)
        results: list[Any] = [None] * len(rows)
        score_rows = [b for b, r in enumerate(rows) if isinstance(r.req, ScoreRequest)]
        if score_rows:
            for b, lps in zip(score_rows, self._score_logprobs(hidden, [rows[b] for b in score_rows],
                                                                score_rows), strict=True):
                results[b] = ScoreOutput(lps, version)
        gen_rows = [b for b, r in enumerate(rows) if isinstance(r.req, GenRequest)]
        if gen_rows:
            logits, attn = self._start_generations(rows, gen_rows, hidden, kv_cache, seg, cached, past)
            del hidden
            completions = self._decode([rows[b].req for b in gen_rows], kv_cache, logits, attn, version, window,
                                       None if deliver is None else [deliver[b] for b in gen_rows])
            for b, c in zip(gen_rows, completions, strict=True):
                results[b] = c
        return results

    def _join(self, taken: list[tuple[GenRequest, Callable[[Any], None]]], kv_cache, mask, room: int = 0):
        """Prefill the generation requests ``taken`` in mid-decode and line them up with the decoding rows:
        returns the merged cache and mask and the new rows' first logits, or ``None`` for the logits where the
        prefill failed (it resolves the requests with the error; cache and mask are then those given).
        ``room`` > 0 (``kv_room``): the merged keys/values are written once, into buffers with room for that
        many more tokens (:class:`~crl_agent.llm.kv_room.RoomyLayer`), not merged and then copied again."""
        torch = self.torch
        rows = [self._plan(req) for req, _ in taken]
        try:
            hidden, new_kv, seg, cached, past = self._forward(rows, self.cache.version)
            logits, new_mask = self._start_generations(rows, list(range(len(rows))), hidden, new_kv, seg, cached,
                                                       past)
        except Exception as e:  # noqa: BLE001 - fails the joining requests only
            for _, resolve in taken:
                resolve(e)
            return kv_cache, mask, None
        old_len, new_len = mask.shape[1], new_mask.shape[1]
        width = max(old_len, new_len)
        layers = []
        for old, new in zip(kv_cache.layers, new_kv.layers, strict=True):
            kv = []
            for a, b in ((old.keys, new.keys), (old.values, new.values)):
                # the decoding rows' columns, then the new rows' columns; the gap each leaves is masked out
                merged = a.new_empty((a.shape[0] + b.shape[0], a.shape[1], width + room, a.shape[3]))
                merged[:, :, :width].zero_()  # the room after ``width`` is written before it is read
                merged[: a.shape[0], :, : a.shape[2]] = a
                merged[a.shape[0]:, :, : b.shape[2]] = b
                kv.append(merged)
            layers.append(tuple(kv))
        if room > 0:
            from crl_agent.llm.kv_room import RoomyLayer

            merged_cache = self.transformers.DynamicCache(config=self.model.config)
            merged_cache.layers = [RoomyLayer.over(k, v, width) for k, v in layers]
        else:
            merged_cache = self.transformers.DynamicCache(ddp_cache_data=layers, config=self.model.config)
        merged_mask = torch.zeros((mask.shape[0] + new_mask.shape[0], width), dtype=mask.dtype, device=mask.device)
        merged_mask[: mask.shape[0], :old_len] = mask
        merged_mask[mask.shape[0]:, :new_len] = new_mask
        return merged_cache, merged_mask, logits

    def _plain_causal(self, rows: list[_Row], past: int) -> bool:
        """Whether the forward of ``rows`` is plain causal attention: generation rows only (a scoring row's
        candidates must not see each other), nothing cached (no prefix to line up) and no padding (every
        row as long as the others). Then it runs with no explicit mask and SDPA uses ``is_causal``."""
        return (self.causal_prefill and past == 0 and all(isinstance(r.req, GenRequest) for r in rows)
                and len({len(r.new) for r in rows}) == 1)

    def _mask(self, seg, cached, past: int):
        """[rows, 1, width, past + width] additive attention mask (0 where a query may look, dtype min elsewhere)."""
        torch = self.torch
        n_rows, width = seg.shape
        idx = torch.arange(width)
        sq, sk = seg[:, :, None], seg[:, None, :]
        causal = (idx[:, None] >= idx[None, :])[None]
        new = causal & ((sk == 0) | (sq == sk)) & (sq >= 0) & (sk >= 0)
        new |= torch.eye(width, dtype=torch.bool)[None] & (sq < 0)  # padding sees itself: no empty softmax row
        old = (torch.arange(past)[None, None, :] < cached[:, None, None]) & (sq >= 0)
        mask = torch.cat([old, new], dim=2)[:, None]
        # additive, in the model's dtype: CPU sdpa runs about 20% faster with it than with a bool mask,
        # and eager attention needs it anyway
        dtype = self.model.dtype
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)

    def _seed_cache(self, rows: list[_Row], past: int):
        torch, transformers = self.torch, self.transformers
        config = self.model.config
        if past == 0:
            return transformers.DynamicCache(config=config)
        template = next(r.kv for r in rows if r.kv is not None)
        layers = []
        for layer, (k0, v0) in enumerate(template):
            shape = (len(rows), k0.shape[1], past, k0.shape[3])
            keys = torch.zeros(shape, dtype=k0.dtype, device=k0.device)
            values = torch.zeros((len(rows), v0.shape[1], past, v0.shape[3]), dtype=v0.dtype, device=v0.device)
            for b, r in enumerate(rows):
                if r.kv is not None:
                    keys[b, :, : r.cached] = r.kv[layer][0][0]
                    values[b, :, : r.cached] = r.kv[layer][1][0]
            layers.append((keys, values))
        return transformers.DynamicCache(ddp_cache_data=layers, config=config)

    def _store_prompts(self, rows: list[_Row], kv_cache, past: int, cache_version: int) -> None:
        """Put each row's full-prompt keys/values into the prefix cache (copies, not views of the batch)."""
        if not (self.cacheable and self.cache.max_bytes):
            return
        torch = self.torch
        for b, r in enumerate(rows):
            if r.req.cancelled:
                continue
            kv = []
            for layer in kv_cache.layers:
                parts_k, parts_v = [], []
                if r.cached:
                    parts_k.append(layer.keys[b : b + 1, :, : r.cached])
                    parts_v.append(layer.values[b : b + 1, :, : r.cached])
                parts_k.append(layer.keys[b : b + 1, :, past : past + r.suffix])
                parts_v.append(layer.values[b : b + 1, :, past : past + r.suffix])
                kv.append((torch.cat(parts_k, dim=2), torch.cat(parts_v, dim=2)))
            self.cache.put(r.req.prompt_ids, kv, cache_version)

    # ---------------------------------------------------------------- output layer
    def _logits(self, hidden):
        logits = self.head(hidden).float()
        if self.softcap:
            logits = self.torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _score_logprobs(self, hidden, rows: list[_Row], batch_rows: list[int]) -> list[list[list[float]]]:
        """Per row, per candidate, the log-prob of each candidate token."""
        torch = self.torch
        where_b, where_p, targets = [], [], []
        for b, r in zip(batch_rows, rows, strict=True):
            last = r.suffix - 1
            for off, cand in zip(r.offsets, r.req.candidates, strict=True):
                # token t of a candidate is predicted at the position before it: the last prompt token for t == 0
                where_p += [last, *range(off, off + len(cand) - 1)]
                where_b += [b] * len(cand)
                targets += cand
        flat = torch.empty(len(targets))
        b_idx = torch.tensor(where_b, device=hidden.device)
        p_idx = torch.tensor(where_p, device=hidden.device)
        tgt = torch.tensor(targets, dtype=torch.long, device=hidden.device)
        for s in range(0, len(targets), _LOGIT_CHUNK):
            e = s + _LOGIT_CHUNK
            logp = torch.log_softmax(self._logits(hidden[b_idx[s:e], p_idx[s:e]]), dim=-1)
            flat[s:e] = logp.gather(1, tgt[s:e, None])[:, 0].cpu()
        values = flat.tolist()
        out, k = [], 0
        for r in rows:
            per_cand = []
            for cand in r.req.candidates:
                per_cand.append(values[k : k + len(cand)])
                k += len(cand)
            out.append(per_cand)
        return out

    # ---------------------------------------------------------------- decoding
    def _sample(self, logits, params: SamplingParams, gen) -> int:
        torch = self.torch
        if params.temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            sorted_p[(cum - sorted_p) > params.top_p] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        # Inverse-CDF sampling: one uniform draw from the request's own generator (cheaper than multinomial).
        cdf = torch.cumsum(probs, dim=-1)
        u = torch.rand(1, generator=gen, dtype=cdf.dtype) * cdf[-1]
        return int(torch.searchsorted(cdf, u, right=True).clamp(max=cdf.numel() - 1))

    def _sample_constrained(self, logits, req: GenRequest, gen, generated: int) -> tuple[int, bool]:
        """A token the request's schema allows, and whether the model chose it: sampled from the masked
        logits (chosen where the schema allowed more than one token), or, in the last
        :func:`~crl_agent.llm.constrained.close_reserve` tokens, the one that closes the document soonest
        (picked by rule, not chosen)."""
        assert req.constraint is not None
        allowed = req.constraint.allowed()
        choices = int(allowed.sum())
        if not choices:
            raise RuntimeError(f"the schema allows no next token: {req.constraint.error() or 'dead end'}")
        if req.max_new - generated <= close_reserve(req.max_new):
            return req.constraint.closing_token(logits, allowed), False
        return self._sample(logits.masked_fill(~allowed, float("-inf")), req.params, gen), choices > 1

    def _decode(self, reqs: list[GenRequest], kv_cache, logits, mask, version: int,
                window: BatchWindow | None = None,
                deliver: list[Callable[[Any], None]] | None = None) -> list[Completion | Exception]:
        """Decode ``reqs`` together; returns their results. ``deliver`` (one per request) resolves each as it
        finishes. With a ``window``, every ``interleave_steps`` steps the batch takes in the scoring requests
        that arrived (run at once) and, while it has fewer than ``max_rows`` rows and has taken in fewer than
        ``max_rows`` generations, generation requests: they are prefilled, lined up with the decoding rows
        and decode with them from then on (resolved through the window as they finish)."""
        torch, dev = self.torch, self.device
        n = len(reqs)
        reqs = list(reqs)  # joined requests are appended
        resolvers: list[Callable[[Any], None] | None] = list(deliver) if deliver is not None else [None] * n
        if self.kv_room:
            from crl_agent.llm.kv_room import make_room

            make_room(kv_cache, max(r.max_new for r in reqs))
        gens = [torch.Generator().manual_seed(r.seed) for r in reqs]
        next_pos = torch.tensor([[len(r.prompt_ids)] for r in reqs], device=dev)
        active = list(range(n))  # request index of each row still in the batch
        gen_ids: list[list[int]] = [[] for _ in reqs]
        lps: list[list[float]] = [[] for _ in reqs]
        sampled: list[list[float]] = [[] for _ in reqs]  # under the tempered distribution the token came from
        chosen: list[list[bool]] = [[] for _ in reqs]  # whether the model chose each token (Completion.model_chosen)
        finish = ["length"] * n
        stop_at: list[int | None] = [None] * n
        failed: dict[int, Exception] = {}
        results: dict[int, Completion | Exception] = {}
        joined = 0
        steps = 0

        def complete(i: int) -> None:
            r = reqs[i]
            if i in failed:
                res: Completion | Exception = failed[i]
            else:
                text = self.decode_ids(gen_ids[i])
                if stop_at[i] is not None:
                    text = text[: stop_at[i]]
                res = Completion(
                    text=text, token_ids=gen_ids[i], logprobs=lps[i], prompt_token_ids=list(r.prompt_ids),
                    prompt_tokens=len(r.prompt_ids), finish_reason=finish[i], model=self.model_name,
                    policy_version=version, sampling_logprobs=sampled[i], model_chosen=chosen[i],
                )
            results[i] = res
            self.decoded_tokens += len(gen_ids[i])
            resolve = resolvers[i]
            if resolve is not None and not r.cancelled:
                resolve(res)

        while active:
            logprobs = torch.log_softmax(logits, dim=-1)
            keep_rows, feed = [], []
            for row, i in enumerate(active):
                r = reqs[i]
                if r.cancelled:  # nobody waits for this row any more
                    complete(i)
                    continue
                if r.constraint is None:
                    tok, free = self._sample(logits[row], r.params, gens[i]), True
                else:
                    try:
                        tok, free = self._sample_constrained(logits[row], r, gens[i], len(gen_ids[i]))
                    except RuntimeError as e:  # fails this request only
                        failed[i] = e
                        complete(i)
                        continue
                gen_ids[i].append(tok)
                chosen[i].append(free)
                lps[i].append(float(logprobs[row, tok]))
                temperature = r.params.temperature
                sampled[i].append(lps[i][-1] if temperature <= 0 or temperature == 1 else
                                  float(torch.log_softmax(logits[row] / temperature, dim=-1)[tok]))
                done = False
                if r.constraint is not None and not r.constraint.advance(tok) and tok not in self.eos_ids:
                    failed[i] = RuntimeError(f"the schema rejected token {tok}: {r.constraint.error()}")
                    complete(i)
                    continue
                if tok in self.eos_ids:
                    finish[i], done = "stop", True
                elif r.params.stop:
                    text = self.decode_ids(gen_ids[i])
                    hits = [text.find(s) for s in r.params.stop if s and s in text]
                    if hits:
                        finish[i], stop_at[i], done = "stop", min(hits), True
                if not done and len(gen_ids[i]) >= r.max_new:
                    done = True
                if done:
                    complete(i)
                else:
                    keep_rows.append(row)
                    feed.append(tok)
            if not keep_rows:
                break
            if len(keep_rows) < len(active):
                idx = torch.tensor(keep_rows, device=dev)
                kv_cache.batch_select_indices(idx)
                mask, next_pos = mask[idx], next_pos[idx]
                active = [active[row] for row in keep_rows]
            step_ids = torch.tensor(feed, dtype=torch.long, device=dev).unsqueeze(1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = self.model(
                input_ids=step_ids, attention_mask=mask, position_ids=next_pos, cache=kv_cache, use_cache=True,
            )
            logits = out.logits[:, -1, :].float().cpu()  # the model's own forward applies any soft-capping
            next_pos = next_pos + 1
            steps += 1
            if self.on_decode_step is not None:
                self.on_decode_step(steps)
            if window is not None and self.interleave_steps > 0 and steps % self.interleave_steps == 0:
                # rows line up by padding keys/values, which only full-attention layers allow (``cacheable``)
                joins = self.join_generations and self.cacheable
                room = min(self.max_rows - len(active), self.max_rows - joined) if joins else 0
                taken = self._take_in(window, room)
                if taken:
                    joined += len(taken)
                    started = [req for req, _ in taken]
                    to_come = max(r.max_new for r in [*started, *(reqs[i] for i in active)]) if self.kv_room else 0
                    kv_cache, mask, new_logits = self._join(taken, kv_cache, mask, to_come)
                    if new_logits is not None:
                        for req, resolve in taken:
                            active.append(len(reqs))
                            reqs.append(req)
                            resolvers.append(resolve)
                            gens.append(torch.Generator().manual_seed(req.seed))
                            for acc in (gen_ids, lps, sampled, chosen):
                                acc.append([])
                            finish.append("length")
                            stop_at.append(None)
                        new_pos = torch.tensor([[len(req.prompt_ids)] for req in started], device=dev)
                        next_pos = torch.cat([next_pos, new_pos])
                        logits = torch.cat([logits, new_logits])
                        self.joined += len(started)
        return [results[i] for i in range(n)]  # every row was completed as it left the batch
