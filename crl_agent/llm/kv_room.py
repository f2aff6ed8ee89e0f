"""Keys/values that grow in place while a batch decodes.

A ``transformers`` :class:`~transformers.DynamicLayer` appends each decoding step's keys and values with
``torch.cat``, which copies the layer's whole cache every step: for 8 rows on a 1,000-token prompt that copy
was a fifth of a decoding step of SmolLM2-135M on 2 CPU cores (``aten::cat`` 21 of ~88 ms a step), and it
grows with the context. :func:`make_room` swaps every plain dynamic layer of a cache for a
:class:`RoomyLayer` that keeps its keys and values in a buffer with room for the tokens still to come
and writes each step into it; ``keys``/``values`` are views of the filled part, so everything that reads
them (masks, SDPA, ``batch_select_indices``, ``get_seq_length``) sees what a dynamic layer would hold.
A step that needs more than the room left grows the buffer (doubling), so a wrong estimate costs a copy,
never a wrong result.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


class RoomyLayer(DynamicLayer):
    """A dynamic cache layer whose keys and values are the filled prefix of a larger buffer."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int):
        super().__init__()
        self.device, self.is_initialized = keys.device, True
        self._k = self._v = None
        self._n = 0
        self._reserve(keys, values, keys.shape[-2] + max(0, int(room)))
        self._write(keys, values)

    @classmethod
    def over(cls, k_buffer: torch.Tensor, v_buffer: torch.Tensor, filled: int) -> RoomyLayer:
        """A layer over buffers whose first ``filled`` positions already hold the keys/values (no copy: a
        batch that merges rows writes them straight into buffers with room)."""
        layer = cls.__new__(cls)
        DynamicLayer.__init__(layer)
        layer.device, layer.is_initialized = k_buffer.device, True
        layer._k, layer._v, layer._n = k_buffer, v_buffer, int(filled)
        layer._views()
        return layer

    def _reserve(self, like_k: torch.Tensor, like_v: torch.Tensor, capacity: int) -> None:
        b, h, _, d = like_k.shape
        k = like_k.new_empty((b, h, capacity, d))
        v = like_v.new_empty((b, like_v.shape[1], capacity, like_v.shape[3]))
        if self._n:
            k[:, :, : self._n] = self._k[:, :, : self._n]
            v[:, :, : self._n] = self._v[:, :, : self._n]
        self._k, self._v = k, v

    def _write(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        n, m = self._n, keys.shape[-2]
        if n + m > self._k.shape[-2]:
            self._reserve(self._k, self._v, max(n + m, 2 * self._k.shape[-2]))
        self._k[:, :, n : n + m] = keys
        self._v[:, :, n : n + m] = values
        self._n = n + m
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        self._write(key_states, value_states)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices, ...], self._v[indices, ...]
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._k = self._k.repeat_interleave(repeats, dim=0)
        self._v = self._v.repeat_interleave(repeats, dim=0)
        self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count (tokens to remove from the end)")
        self._n = max(0, self._n + tokens_to_remove)
        self._views()

    def reset(self) -> None:
        self._k = self._v = None
        self._n = 0
        super().reset()


def make_room(cache: Any, room: int) -> Any:
    """Give each filled plain dynamic layer of ``cache`` room for ``room`` more tokens (in place; returns it).

    Layers of other kinds (sliding windows, linear attention) and empty ones are left as they are."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys is not None and layer.keys.numel():
            cache.layers[i] = RoomyLayer(layer.keys, layer.values, room)
    return cache
