"""crl-bench agents and training.

- :mod:`crl_agent.agents`: ``random``, ``oracle``, ``llm`` (any backend; scores or generates actions) and
  ``crl`` (the Complementary RL agent with its experience bank);
- :mod:`crl_agent.llm`: the LLM backends (transformers, vllm, openai-compatible) behind one interface;
- :mod:`crl_agent.experience`: the experience bank, its manager and the extractor;
- :mod:`crl_agent.rollout`: episodes as data, the loop evaluation and training share;
- :mod:`crl_agent.rl` and :mod:`crl_agent.train`: the Complementary RL trainer.
"""

from __future__ import annotations

__version__ = "0.1.0"
