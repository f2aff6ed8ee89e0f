"""LoRA folded into the weights an engine's forwards read.

A ``peft`` LoRA linear layer computes ``base(x) + scale * B(A(x))``: besides the base matmul, two thin
matmuls (in float32: peft keeps a bf16 model's adapter in float32 and casts the input) and their Python
dispatch, in each of a decoder's ~200 projections. py-spy of a training run's actor engine (SmolLM2-135M,
LoRA r16, bf16, 2 CPU cores) put ~24% of its scoring forwards in that branch. Between two weight updates
the adapter is constant, so an engine's forward can read ``W + scale * B @ A`` instead: one matmul per
projection, as a merged model's. Measured on an AMX Xeon (1 thread, beside a training run, so
indicative; ``benchmarks/step_profile.py`` is the measure): a scoring forward of 10 decisions x 160 tokens
took 0.71x peft's time, decoding 8 rows 0.87-0.97x.

:class:`FoldedLoRA` keeps those folded weights (one extra copy of the adapted layers' weights: ~200 MB
for the 135M in bf16) and recomputes them when the adapter or the base weights change (each tensor's
in-place version counter: an optimiser step, a checkpoint load). Its :meth:`~FoldedLoRA.active` block
turns the folded path on for the calling thread only, so a learner that trains the same modules on
another thread, or between two engine batches on the same thread, still runs peft's own forward with
its gradients, its ``disable_adapter()`` and its dropout; a forward with gradient enabled is never folded.

Only plain LoRA linears are folded (no DoRA, no LoRA bias, no ``fan_in_fan_out``, no other variant, no
dropout in training mode); any other layer runs as peft runs it. The folded sum is computed in float32
and rounded once to the weights' dtype. In float32 it equals peft's forward to ~1e-6 (tested); in bf16
the rounding of ``W + delta`` is noise of the size of the weights' own bf16 rounding, the adapter's
change kept in expectation: on the probe above, log-probs moved 0.05-0.06 nats at the median, where
merely batching the same requests differently moves them 0.04. The learner's truncated importance
sampling corrects what remains (its ``is_*`` metrics show it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

_local = threading.local()  # .view: the FoldedLoRA whose weights this thread's forwards read, if any


def _adapters(layer: Any) -> list[str] | None:
    """The active adapters of a foldable peft LoRA linear, or None where it cannot be folded."""
    if getattr(layer, "merged", False) or getattr(layer, "disable_adapters", False):
        return None
    if getattr(layer, "fan_in_fan_out", False) or not isinstance(getattr(layer, "base_layer", None),
                                                                   torch.nn.Linear):
        return None
    names = [a for a in layer.active_adapters if a in layer.lora_A]
    for a in names:
        if getattr(layer, "use_dora", {}).get(a) or getattr(layer, "lora_variant", {}).get(a) is not None:
            return None
        if layer.lora_B[a].bias is not None or layer.lora_A[a].bias is not None:
            return None
        drop = layer.lora_dropout[a]
        if drop.training and getattr(drop, "p", 0.0) > 0:
            return None
    return names


def _lora_linears(model: torch.nn.Module) -> list[Any]:
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # without peft there is no LoRA to fold
        return []
    return [m for m in model.modules() if type(m) is LoraLinear]


def _folded_forward(layer: Any, original):
    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        view = getattr(_local, "view", None)
        # folded only without gradient: a forward that trains must reach the adapter's own parameters
        use = view is not None and not args and not kwargs and not torch.is_grad_enabled()
        weight = view.weights.get(layer) if use else None
        if weight is None or _adapters(layer) is None:
            return original(x, *args, **kwargs)
        out = torch.nn.functional.linear(x if x.dtype == weight.dtype else x.to(weight.dtype), weight,
                                         layer.base_layer.bias)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    return forward


class FoldedLoRA:
    """The folded weights of ``model``'s LoRA linears, for the forwards run inside :meth:`active`.

    ``version``: the backend's policy version, part of what marks the folded weights stale (besides the
    tensors' version counters, which a write through ``.data`` would not bump). ``enabled=False`` makes
    :meth:`active` a no-op (for comparisons)."""

    def __init__(self, model: torch.nn.Module, enabled: bool = True, version: Callable[[], int] | None = None):
        self.model, self.enabled, self.version = model, bool(enabled), version
        self.weights: dict[Any, torch.Tensor] = {}
        self._key: tuple | None = None
        self.refreshes = 0  # how often the folded weights were recomputed (tests read it)

    def _state(self, layers: list[Any]) -> tuple:
        key: list[Any] = [None if self.version is None else self.version()]
        for layer in layers:
            names = _adapters(layer)
            if names is None:
                key.append((id(layer), None))
                continue
            parts = [layer.base_layer.weight]
            for a in names:
                parts += [layer.lora_A[a].weight, layer.lora_B[a].weight]
            key.append((id(layer), tuple(names), tuple(layer.scaling[a] for a in names),
                        tuple((id(p), p._version, p.dtype) for p in parts)))
        return tuple(key)

    @torch.no_grad()
    def sync(self) -> None:
        """Recompute the folded weights if any adapter or base weight changed since the last time."""
        layers = _lora_linears(self.model)
        key = self._state(layers)
        if key == self._key:
            return
        self.weights, self._key = {}, None  # the stale copy goes before the new one is made (peak memory)
        weights: dict[Any, torch.Tensor] = {}
        for layer in layers:
            names = _adapters(layer)
            if names is None:
                continue
            base = layer.base_layer.weight
            total = base.float()
            for a in names:
                total = total + layer.scaling[a] * (layer.lora_B[a].weight.float() @ layer.lora_A[a].weight.float())
            weights[layer] = total.to(base.dtype)
            if not getattr(layer, "_crl_folded", False):  # the instance forward that reads them, installed once
                layer.forward = _folded_forward(layer, layer.forward)
                layer._crl_folded = True
        self.weights, self._key = weights, key
        self.refreshes += 1

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Within the block, this thread's forwards of the model read the folded weights (synced first)."""
        if not self.enabled:
            yield
            return
        self.sync()
        if not self.weights:
            yield
            return
        previous = getattr(_local, "view", None)
        _local.view = self
        try:
            yield
        finally:
            _local.view = previous
