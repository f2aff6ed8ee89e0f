"""Every prompt the ``llm`` agent sends, in one readable place.

The agent's chat is: one system message (family instructions + the action format), then the
last few turns as alternating user (observation) / assistant (reply) messages, then the
current user message (goal, observation, admissible actions, feedback on the last reply).
Subclasses add text to the system message through ``LLMPolicy.system_prompt``.

The action format is the same for every family: brief reasoning, then exactly one
``<action>...</action>``. :mod:`crl_agent.agents.llm` documents the lenient parser.
"""

from __future__ import annotations

import re

ACTION_FORMAT = (
    "Respond in this format: at most a few sentences of reasoning, then exactly one action "
    "inside tags, e.g. <action>{example}</action>. Write nothing after </action>."
)

FAMILY_PROMPTS: dict[str, tuple[str, str]] = {
    # family: (instructions, example action)
    "Sokoban": (
        "You are playing Sokoban on a small grid. Push every box ($) onto a target (.). You (@) move "
        "one cell per action: up, down, left or right. Walking into a box pushes it one cell if the "
        "cell behind it is free; you cannot pull boxes, so a box pushed into a corner is stuck for "
        "good. Plan a few pushes ahead before moving.",
        "left",
    ),
    "MiniHack": (
        "You are playing a MiniHack (NetHack) task through a text rendering of the map. @ is you, "
        "> is the staircase down, walls are | and -, doors are + or |/- gaps. Move with compass "
        "directions (north, east, south, west, northeast, ...). Use the legend to identify "
        "symbols. When the game asks a question, answer it with one of the offered letters or "
        "a direction.",
        "north",
    ),
    "WebShop": (
        "You are shopping on a website for the product the instruction describes. Use "
        "search[keywords] on the search page, then click[...] on one of the clickable items shown "
        "in the observation (a product, an option value, < Prev, Next >, Back to Search, "
        "Buy Now). Pick the options the instruction asks for before clicking Buy Now, and respect "
        "the price limit.",
        "search[red cotton t-shirt]",
    ),
    "ALFWorld": (
        "You are a household robot in a text world. Complete the task with text commands such as "
        "'go to countertop 1', 'open fridge 1', 'take apple 1 from countertop 1', 'move apple 1 to "
        "fridge 1', 'heat apple 1 with microwave 1', 'clean cup 1 with sinkbasin 1', 'cool X with "
        "fridge 1', 'use desklamp 1', 'examine X', 'inventory' and 'look'. Objects have numbers; "
        "use the exact names from the observation. Search the likely places first.",
        "go to countertop 1",
    ),
    "SWE": (
        "You are a software engineer fixing an issue in a Python repository. Each action is one "
        "shell command run in the repository (e.g. grep, sed, cat, python, pytest); its output "
        "comes back as the next observation. Find the cause, edit the code to fix it, run the "
        "relevant tests, and then send the single action 'submit'.",
        "grep -rn \"def parse\" src/",
    ),
    "generic": (
        "You are an agent acting in a text environment. Read the goal and the observation, and "
        "choose the next action. When a list of valid actions is given, answer with one of them, "
        "spelled exactly.",
        "look",
    ),
}

SCORE_FORMAT = "Reply with exactly one of the valid actions, spelled as listed, and nothing else."
AUTO_FORMAT = (
    "When valid actions are listed, reply with exactly one of them, spelled as listed, and nothing else. "
    "Otherwise write at most a few sentences of reasoning, then exactly one action inside tags, e.g. "
    "<action>{example}</action>."
)

NO_TAG_FEEDBACK = (
    "Your last reply had no <action>...</action> tag, so it was sent to the environment as is. "
    "End every reply with exactly one action inside <action></action>."
)
TRUNCATED_FEEDBACK = "Your last reply was cut off at the length limit before its action; keep the reasoning short."

_FAMILY_RE = re.compile(r"^crl/([A-Za-z]+)-")


def family_of_env_id(env_id: str) -> str:
    """The prompt family for an env id: ``crl/<Family>-...`` for built-ins, else ``"generic"``."""
    m = _FAMILY_RE.match(env_id)
    return m.group(1) if m and m.group(1) in FAMILY_PROMPTS else "generic"


def system_prompt(family: str, action_mode: str = "generate") -> str:
    """Instructions for a family plus the reply format of ``action_mode`` (generate, score or auto)."""
    instructions, example = FAMILY_PROMPTS.get(family, FAMILY_PROMPTS["generic"])
    fmt = {"score": SCORE_FORMAT, "auto": AUTO_FORMAT}.get(action_mode, ACTION_FORMAT)
    return f"{instructions}\n\n{fmt.format(example=example)}"


def format_actions(actions: list[str] | None, limit: int = 60) -> str:
    """The admissible-actions block, or ``""`` where the env cannot enumerate them."""
    if not actions:
        return ""
    shown = ", ".join(actions[:limit])
    more = f", ... ({len(actions) - limit} more)" if len(actions) > limit else ""
    return f"Valid actions: {shown}{more}"


def turn_message(
    observation: str,
    *,
    goal: str = "",
    actions: list[str] | None = None,
    feedback: str = "",
    step: int | None = None,
) -> str:
    """The user message for the current turn.

    The goal and the action list are left out when the observation already shows them.
    """
    parts = []
    if feedback:
        parts.append(f"Note: {feedback}")
    if goal and goal not in observation:
        parts.append(f"Goal: {goal}")
    header = f"Observation (step {step}):" if step is not None else "Observation:"
    parts.append(f"{header}\n{observation.strip()}")
    block = format_actions(actions)
    if block and ", ".join(actions or []) not in observation:
        parts.append(block)
    parts.append("What is your next action?")
    return "\n\n".join(parts)


def compact_history_message(step: int, valid: bool | None) -> str:
    """A past turn in compact history: its step and whether the env accepted its action."""
    return f"Step {step}." if valid is not False else f"Step {step}. (That action was invalid.)"


def history_message(observation: str, step: int) -> str:
    """A past observation as it appears in the bounded history."""
    return f"Observation (step {step}):\n{observation.strip()}"
