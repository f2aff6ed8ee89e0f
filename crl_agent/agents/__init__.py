"""Agents by name, plus ``module:Class`` for third-party agents."""

from __future__ import annotations

import importlib
import json
from typing import Any

from crl_agent.agents.base import Agent, Policy
from crl_agent.episode import Episode, EpisodeContext, EpisodeResult

BUILTIN = {
    "random": "crl_agent.agents.random:RandomAgent",
    "oracle": "crl_agent.agents.oracle:OracleAgent",
    "llm": "crl_agent.agents.llm:LLMAgent",
    "crl": "crl_agent.agents.crl:CRLAgent",
    "oracle-memory": "crl_agent.agents.notebook:RememberingOracleAgent",
    "notebook": "crl_agent.agents.notebook:NotebookAgent",
    "reflexion": "crl_agent.agents.reflexion:ReflexionAgent",
}

__all__ = ["Agent", "Episode", "EpisodeContext", "EpisodeResult", "Policy", "load_agent_class", "parse_agent_args", "BUILTIN"]


def load_agent_class(name: str) -> type[Agent]:
    """Resolve a built-in agent name or a ``module:Class`` path."""
    path = BUILTIN.get(name, name)
    if ":" not in path:
        raise ValueError(f"unknown agent {name!r}: use one of {sorted(BUILTIN)} or module:Class")
    module, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load agent {path!r}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise ValueError(f"{path!r} is not a subclass of crl_agent.agents.base.Agent")
    return cls


def parse_agent_args(items: list[str]) -> dict[str, Any]:
    """``--agent-arg KEY=VALUE`` strings as constructor arguments (VALUE read as JSON when it parses, else text)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--agent-arg {item!r}: expected KEY=VALUE with KEY a Python identifier")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out

