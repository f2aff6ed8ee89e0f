"""The experience side of Complementary RL: a persistent bank, an async manager, the extractor.

Typical use::

    from crl_agent.experience import ExperienceBank, ExperienceManager, Trajectory

    bank = ExperienceBank("runs/x/bank", embedder="minilm")      # or "hash", or any ST model
    manager = ExperienceManager(bank, extractor=llm, log_path="runs/x/extractor_calls.jsonl")
    entries = await manager.search("push the box onto the goal", task="crl/Sokoban-6x6-2-v0")
    manager.submit(Trajectory(...))                               # distilled in the background
    await manager.flush(); await manager.aclose(); bank.close()
"""

from __future__ import annotations

from crl_agent.experience.bank import BankError, ExperienceBank, ExperienceEntry, TaskView
from crl_agent.experience.calllog import ExtractorSample, load_samples
from crl_agent.experience.embedder import Embedder, HashingEmbedder, SentenceTransformerEmbedder, make_embedder
from crl_agent.experience.extractor import Trajectory
from crl_agent.experience.manager import AskResult, ExperienceManager, ManagerConfig
from crl_agent.experience.retrieval import DiversityConfig, Retriever, diversify

__all__ = [
    "AskResult",
    "BankError",
    "DiversityConfig",
    "Embedder",
    "ExperienceBank",
    "ExperienceEntry",
    "ExperienceManager",
    "ExtractorSample",
    "HashingEmbedder",
    "ManagerConfig",
    "Retriever",
    "SentenceTransformerEmbedder",
    "TaskView",
    "Trajectory",
    "diversify",
    "load_samples",
    "make_embedder",
]
