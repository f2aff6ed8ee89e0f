"""Activation recomputation (gradient checkpointing) of a decoder's layers during an update.

A backward pass needs what each layer's forward computed: SmolLM2-135M keeps ~824 KB of activations a
token in bfloat16, 1.7 GB for a 2,048-token micro-batch. Under :func:`recomputed_layers` each decoder
layer keeps only its input and runs its forward again in the backward pass (~189 KB a token, at the
cost of one more forward of the decoder: ~+20% update time on a CPU).

Hugging Face's own switch (``gradient_checkpointing_enable``) acts only on a model in training mode, and
the learner updates in eval mode (dropout off, so the recomputed log-probs are the sampler's). This
wraps the layers' ``forward`` instead, for the duration of a ``with`` block, in any mode:

- a call that reads or writes a key/value cache runs as is (recomputing it would append to the cache a
  second time);
- a call without gradient (scoring, generation) runs as is;
- the recomputation is exact: the same weights and inputs in eval mode give the same activations, so
  gradients agree with the plain backward to rounding (tested).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from torch.utils.checkpoint import checkpoint

_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder's stack of layers: its longest ``ModuleList`` child (``layers`` in Llama, Qwen, Gemma,
    ``h`` in GPT-2).

    Raises:
        TypeError: the model has no decoder with a list of layers.
    """
    try:
        decoder = model.get_decoder()
    except (AttributeError, NotImplementedError):
        decoder = None
    if decoder is None:
        raise TypeError(f"{type(model).__name__} has no decoder (get_decoder()); gradient checkpointing needs one")
    stacks = [m for m in decoder.children() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not stacks:
        raise TypeError(f"{type(decoder).__name__} has no list of layers to checkpoint")
    return max(stacks, key=len)


def _checkpointed(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        cached = kwargs.get("use_cache") or any(kwargs.get(k) is not None for k in _CACHE_KWARGS)
        if cached or not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


@contextlib.contextmanager
def recomputed_layers(model: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, each decoder layer of ``model`` recomputes its activations in the backward pass.

    The backward pass may run inside or after the block (the recomputation holds its own reference to the
    layer's forward). Not re-entrant on the same model from two threads at once: the learner's update is
    the only caller. ``enabled=False`` is a no-op, so callers need no branch.
    """
    if not enabled:
        yield
        return
    layers = list(decoder_layers(model))
    for layer in layers:
        layer.forward = _checkpointed(layer.forward)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # the instance attribute: the class's forward shows through again
