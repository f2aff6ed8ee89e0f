"""crl-bench agents: random, oracle, and (later) LLM and Complementary RL agents."""

from __future__ import annotations

__version__ = "0.1.0"
