"""Text spaces for LLM environments.

Gymnasium's :class:`gymnasium.spaces.Text` only accepts a fixed charset, so it rejects
spaces, punctuation and unicode. Agents send arbitrary strings, so our spaces accept any
``str`` and bound only its length.
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium.spaces import Space

_SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "


class UnicodeText(Space[str]):
    """Any unicode string of at most ``max_length`` characters.

    Args:
        max_length: the longest string that ``contains`` accepts.
        min_length: the shortest string that ``contains`` accepts.
        seed: seed for :meth:`sample`.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None):
        if max_length < min_length or min_length < 0:
            raise ValueError(f"need 0 <= min_length <= max_length, got {min_length}, {max_length}")
        self.max_length = int(max_length)
        self.min_length = int(min_length)
        super().__init__(shape=None, dtype=str, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random printable string (length at most 64, so samples stay cheap)."""
        hi = min(self.max_length, 64)
        length = int(self.np_random.integers(self.min_length, max(hi, self.min_length) + 1))
        chars = self.np_random.choice(list(_SAMPLE_CHARSET), size=length)
        return "".join(chars)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"UnicodeText(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and other.max_length == self.max_length
            and other.min_length == self.min_length
        )

    def to_jsonable(self, sample_n: list[str]) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: list[str]) -> list[str]:
        return list(sample_n)


