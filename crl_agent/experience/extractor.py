"""The experience extractor's three jobs: prompts to build and lenient parsers for the answers.

- **distil**: a finished trajectory (goal, steps, outcome, the entries it was given) becomes at
  most 3 operations, ``add(entry)``, ``update(target_ids, entry)`` or ``none``.
- **merge**: a cluster of near-duplicate entries becomes ``MERGE`` (one entry replaces all),
  ``REWRITE`` (distinct rewritten entries replace them), ``DISCARD`` (drop the listed ids) or
  ``KEEP``.
- **answer**: a search-and-ask question is answered from retrieved entries.

Replies can be constrained by construction: :func:`distil_schema` and :func:`merge_schema` are the
JSON Schemas of exactly the shapes the prompts show (``SamplingParams.json_schema``; the manager
sends them), so a backend that honours them returns JSON these parsers read; they still check what
it means (a target id must have been shown, a discard must leave one entry). Answers are prose and
stay unconstrained.

Entries are a title plus content written as a generalisable if-then rule. Parsers never raise:
they return what they could use and a list of errors (malformed JSON, unknown op, a target id
that was not shown), so a small or untrained extractor cannot crash the manager or corrupt the
bank. JSON is found in fenced blocks, bare text or after a ``<think>`` section, and repaired
for trailing commas, smart quotes and Python literals.

Hostile output is bounded: only the first ``MAX_REPLY_CHARS`` of a reply are read, at most
``MAX_OPS`` operations are used, and titles and contents are clipped and cleaned of control
characters, NULs and lone surrogates (which SQLite cannot store).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from crl_agent.experience.bank import ExperienceEntry
from crl_agent.experience.lenient_json import extract_json, strip_thinking
from crl_agent.llm.base import Message

MAX_OPS = 3
MAX_TITLE_CHARS = 120
MAX_CONTENT_CHARS = 800
MAX_REPLY_CHARS = 4_000_000
MAX_GOAL_CHARS = 1000


@dataclass
class Trajectory:
    """What the extractor sees of one finished episode.

    Attributes:
        id: a unique trajectory id (e.g. ``"<env_id>#<seed>"`` plus a run tag).
        task: the bank task it belongs to (the env id).
        goal: the goal text (``info["task"]``).
        steps: ``(observation, action)`` pairs in order.
        success: the binary outcome.
        progress: the env's normalised score.
        retrieved: the entries the actor was shown (at the start or through search).
        final_observation: the observation after the last action.
    """

    id: str
    task: str
    goal: str
    steps: list[tuple[str, str]]
    success: bool
    progress: float = 0.0
    retrieved: list[ExperienceEntry] = field(default_factory=list)
    final_observation: str = ""


@dataclass
class EntryDraft:
    title: str
    content: str


@dataclass
class DistilOp:
    """``kind`` is ``"add"``, ``"update"`` or ``"none"``; ``target_ids`` only for updates."""

    kind: str
    entry: EntryDraft | None = None
    target_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.kind}
        if self.entry is not None:
            d.update(title=self.entry.title, content=self.entry.content)
        if self.target_ids:
            d["target_ids"] = self.target_ids
        return d


@dataclass
class MergeDecision:
    """``kind`` is ``"MERGE"``, ``"REWRITE"``, ``"DISCARD"`` or ``"KEEP"`` (also for unusable output)."""

    kind: str
    entries: list[EntryDraft] = field(default_factory=list)
    discard_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.kind,
            "entries": [e.__dict__ for e in self.entries],
            "discard_ids": self.discard_ids,
        }


# ---------------------------------------------------------------------------- prompts
_ENTRY_RULES = (
    "An entry has a short title and a content that is ONE generalisable if-then rule, e.g. "
    '"If a box is against a wall, then never push it along that wall unless the goal is on that wall." '
    "Write rules that transfer to other instances of the task: no coordinates, seeds or object numbers that "
    "only hold in this episode."
)

DISTIL_SYSTEM = f"""You maintain an experience bank for an agent that acts in text environments.
After each episode you turn what happened into reusable lessons. {_ENTRY_RULES}

Answer with JSON only, at most {MAX_OPS} operations:
{{"operations": [
  {{"op": "add", "title": "...", "content": "If ..., then ..."}},
  {{"op": "update", "target_ids": [<ids of shown entries>], "title": "...", "content": "If ..., then ..."}},
  {{"op": "none"}}
]}}
- add: a new lesson the bank lacks.
- update: an existing entry (only ids shown to you) was wrong or incomplete; the new entry replaces the targets.
- none: nothing new to learn."""

MERGE_SYSTEM = f"""You keep an experience bank free of duplicates. {_ENTRY_RULES}
You are shown entries that look alike. Answer with JSON only, one of:
{{"op": "MERGE", "title": "...", "content": "..."}}   one entry that keeps everything useful from all of them
{{"op": "REWRITE", "entries": [{{"title": "...", "content": "..."}}, ...]}}   distinct entries that replace them
{{"op": "DISCARD", "target_ids": [...]}}   delete redundant or wrong ones (keep at least one)
{{"op": "KEEP"}}   they are different enough already"""

ANSWER_SYSTEM = """You advise an agent in the middle of a task, using lessons from past episodes.
Answer its question in at most 3 short sentences, using only the lessons that apply.
If none apply, say so in one sentence."""


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` as storable, printable Unicode: lone surrogates become U+FFFD, control characters go."""
    return _CONTROL.sub("", _SURROGATE.sub("\ufffd", str(text)))


def _clip(text: str, limit: int) -> str:
    text = " ".join(clean_text(str(text)[: 20 * limit + 1000]).split())  # bounded work on huge strings
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bounded(text: str, errors: list[str]) -> str:
    if len(text) > MAX_REPLY_CHARS:
        errors.append(f"reply of {len(text)} characters: only the first {MAX_REPLY_CHARS} were read")
        return text[:MAX_REPLY_CHARS]
    return text


def format_entries(entries: list[ExperienceEntry]) -> str:
    """Entries as the extractor and the actor see them: ``#<id> <title>: <content>``."""
    if not entries:
        return "(none)"
    return "\n".join(f"#{e.id} {e.title}: {e.content}" for e in entries)


def format_trajectory(traj: Trajectory, max_chars: int = 8000, obs_chars: int = 600) -> str:
    """Steps as text; the middle is elided when the whole would exceed ``max_chars``."""
    blocks = [
        f"Step {i + 1}\nObservation: {_clip(obs, obs_chars)}\nAction: {_clip(act, 200)}"
        for i, (obs, act) in enumerate(traj.steps)
    ]
    if traj.final_observation:
        blocks.append(f"Final observation: {_clip(traj.final_observation, obs_chars)}")
    if sum(len(b) for b in blocks) <= max_chars:
        return "\n\n".join(blocks)
    head, tail, used = blocks[:2], [], sum(len(b) for b in blocks[:2])
    for b in reversed(blocks[2:]):
        if used + len(b) > max_chars:
            break
        tail.insert(0, b)
        used += len(b)
    omitted = len(blocks) - len(head) - len(tail)
    return "\n\n".join([*head, f"[... {omitted} steps omitted ...]", *tail])


def _distil_user(traj: Trajectory, max_chars: int) -> str:
    outcome = "SUCCESS" if traj.success else "FAILURE"
    return (
        f"Task: {traj.task}\nGoal: {_clip(traj.goal, MAX_GOAL_CHARS)}\n"
        f"Outcome: {outcome} (progress {traj.progress:.2f}, {len(traj.steps)} actions)\n\n"
        f"Entries the agent was given:\n{format_entries(traj.retrieved)}\n\n"
        f"Trajectory:\n{format_trajectory(traj, max_chars)}\n\n"
        f"What should the bank learn from this episode? JSON only, at most {MAX_OPS} operations."
    )


# One worked exchange: small models copy a demonstrated format far more reliably than a described one.
_EXAMPLE = Trajectory(
    id="example", task="crl/Example-Keys-v0", goal="open the locked door and reach the stairs",
    steps=[("You see a door (locked) to the east and a key to the north.", "east"),
           ("The door is locked.", "east"), ("The door is locked.", "north")],
    success=False, progress=0.0,
    retrieved=[ExperienceEntry(3, "crl/Example-Keys-v0", "Doors", "If a door blocks the way, then walk into it.", 0, 0)],
)
_EXAMPLE_ANSWER = json.dumps({"operations": [
    {"op": "update", "target_ids": [3], "title": "Locked doors",
     "content": "If a door is locked and a key is visible, then pick up the key before walking to the door."},
    {"op": "add", "title": "Repeated failures",
     "content": "If the same action fails twice with the same message, then try a different action."},
]})


def distil_messages(traj: Trajectory, max_chars: int = 8000, example: bool = True) -> list[Message]:
    """The distil chat; ``example`` prepends one demonstrated exchange (helps small extractors)."""
    messages: list[Message] = [{"role": "system", "content": DISTIL_SYSTEM}]
    if example:
        messages += [{"role": "user", "content": _distil_user(_EXAMPLE, 1000)},
                     {"role": "assistant", "content": _EXAMPLE_ANSWER}]
    return [*messages, {"role": "user", "content": _distil_user(traj, max_chars)}]


def merge_messages(task: str, cluster: list[ExperienceEntry]) -> list[Message]:
    user = f"Task: {task}\nSimilar entries:\n{format_entries(cluster)}\n\nJSON only."
    return [{"role": "system", "content": MERGE_SYSTEM}, {"role": "user", "content": user}]


def answer_messages(task: str, question: str, entries: list[ExperienceEntry]) -> list[Message]:
    user = f"Task: {task}\nLessons from past episodes:\n{format_entries(entries)}\n\nQuestion: {question}"
    return [{"role": "system", "content": ANSWER_SYSTEM}, {"role": "user", "content": user}]


# ---------------------------------------------------------------------------- schemas
# Strings in schema-constrained replies: by default one line that starts with a visible character (the
# parsers drop blank titles and contents), short enough that MAX_OPS operations fit a 512-token reply.
SCHEMA_TITLE_CHARS = 80
SCHEMA_CONTENT_CHARS = 300


# the default pattern of both: one line that starts with a visible character
LINE_PATTERN = r"^\S.*$"


def _text(max_chars: int, pattern: str = LINE_PATTERN) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_chars, "pattern": pattern}


def _entry(title_pattern: str, content_pattern: str) -> dict[str, Any]:
    return {"title": _text(SCHEMA_TITLE_CHARS, title_pattern), "content": _text(SCHEMA_CONTENT_CHARS, content_pattern)}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _id_list(ids: list[int], max_items: int) -> dict[str, Any]:
    return {"type": "array", "items": {"enum": ids}, "minItems": 1, "maxItems": max_items}


def distil_schema(valid_ids: set[int] | list[int], title_pattern: str = LINE_PATTERN,
                  content_pattern: str = LINE_PATTERN) -> dict[str, Any]:
    """The JSON Schema of a distil reply: the shape :data:`DISTIL_SYSTEM` shows and :func:`parse_distil`
    reads, ``update`` only when entries were shown and only with their ids as targets. An entry's title
    and content match ``title_pattern`` and ``content_pattern`` (regular expressions; e.g.
    ``r"^If .+, then .+$"`` holds contents to the if-then rule the prompt asks for)."""
    ids = sorted({int(i) for i in valid_ids})
    entry = _entry(title_pattern, content_pattern)
    ops = [_object({"op": {"const": "add"}, **entry})]
    if ids:
        ops.append(_object({"op": {"const": "update"}, "target_ids": _id_list(ids, len(ids)), **entry}))
    ops.append(_object({"op": {"const": "none"}}))
    operations = {"type": "array", "items": {"anyOf": ops}, "minItems": 1, "maxItems": MAX_OPS}
    return {"title": "distil_operations", **_object({"operations": operations})}


def merge_schema(cluster_ids: list[int], title_pattern: str = LINE_PATTERN,
                 content_pattern: str = LINE_PATTERN) -> dict[str, Any]:
    """The JSON Schema of a merge reply (:data:`MERGE_SYSTEM`, :func:`parse_merge`): ``REWRITE`` into at
    most as many entries as the cluster holds, ``DISCARD`` of cluster ids only and never all of them;
    entries as in :func:`distil_schema`."""
    ids = sorted({int(i) for i in cluster_ids})
    entry = _entry(title_pattern, content_pattern)
    rewrite = {"type": "array", "items": _object(entry), "minItems": 1, "maxItems": max(1, len(ids))}
    decisions = [_object({"op": {"const": "MERGE"}, **entry}), _object({"op": {"const": "REWRITE"}, "entries": rewrite})]
    if len(ids) > 1:
        decisions.append(_object({"op": {"const": "DISCARD"}, "target_ids": _id_list(ids, len(ids) - 1)}))
    decisions.append(_object({"op": {"const": "KEEP"}}))
    return {"title": "merge_decision", "anyOf": decisions}


# ---------------------------------------------------------------------------- parsers
def _op_name(d: dict) -> str:
    for key in ("op", "operation", "type", "action", "decision"):
        if isinstance(d.get(key), str):
            return d[key].strip().lower()
    return ""


def _draft(d: dict) -> EntryDraft | None:
    src = d.get("entry") if isinstance(d.get("entry"), dict) else d
    title, content = src.get("title"), src.get("content") or src.get("rule") or src.get("text")
    if not isinstance(title, str) or not isinstance(content, str) or not title.strip() or not content.strip():
        return None
    return EntryDraft(_clip(title, MAX_TITLE_CHARS), _clip(content, MAX_CONTENT_CHARS))


def _ids(value: Any) -> list[int] | None:
    """Ids from ``[12, "#13", "E14"]``, ``12`` or ``"12, 13"``; ``None`` if any is not an id."""
    items = value if isinstance(value, list) else re.split(r"[,\s]+", value.strip()) if isinstance(value, str) else [value]
    out = []
    for v in items:
        if isinstance(v, bool):
            return None
        if isinstance(v, int):
            out.append(v)
            continue
        m = re.fullmatch(r"\s*(?:#|e|id[=:]?\s*)?(\d+)\s*", str(v), re.I)
        if not m:
            return None
        out.append(int(m.group(1)))
    return out


def _op_list(value: Any) -> list | None:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        for key in ("operations", "ops", "actions"):
            if isinstance(value.get(key), list):
                return value[key]
        return [value]
    return None


_IF_THEN = re.compile(r"\b(If\b[^.!?\n{}\[\]]{3,300}?,?\s+then\b[^.!?\n{}\[\]]{3,300}[.!?]?)", re.I)


def if_then_rules(text: str) -> list[EntryDraft]:
    """``If ..., then ...`` sentences found in prose, as entries titled by their first words."""
    out = []
    for m in _IF_THEN.finditer(strip_thinking(text)):
        content = _clip(m.group(1), MAX_CONTENT_CHARS)
        words = re.sub(r"^if\s+", "", content, flags=re.I).split()
        out.append(EntryDraft(_clip(" ".join(words[:6]).rstrip(",.").capitalize(), MAX_TITLE_CHARS), content))
    return out


def parse_distil(text: str, valid_ids: set[int]) -> tuple[list[DistilOp], list[str]]:
    """Operations from a distil completion, and the errors met; never raises.

    Args:
        text: the completion.
        valid_ids: ids of the entries shown in the prompt (the only legal update targets).
    """
    errors: list[str] = []
    text = _bounded(text, errors)
    try:
        ops_raw = _op_list(extract_json(text))
    except ValueError as e:
        rules = if_then_rules(text[:100_000])[:MAX_OPS]
        if rules:  # prose that states rules in the entry format: keep them, still counted as malformed
            return [DistilOp("add", r) for r in rules], [*errors, f"malformed: {e}; kept {len(rules)} if-then sentences"]
        return [], [*errors, f"malformed: {e}"]
    if ops_raw is None:
        return [], [*errors, "malformed: JSON is neither an object nor a list of operations"]
    if len(ops_raw) > MAX_OPS:
        errors.append(f"{len(ops_raw)} operations: only the first {MAX_OPS} are used")
        ops_raw = ops_raw[:MAX_OPS]
    ops: list[DistilOp] = []
    for raw in ops_raw:
        if isinstance(raw, str) and raw.strip().lower() in ("none", "noop"):
            ops.append(DistilOp("none"))
            continue
        if not isinstance(raw, dict):
            errors.append(f"operation is not an object: {str(raw)[:60]!r}")
            continue
        name = _op_name(raw)
        if name in ("none", "noop", "no-op", "skip", "nothing"):
            ops.append(DistilOp("none"))
            continue
        if name not in ("add", "update"):
            errors.append(f"unknown op {name!r}")
            continue
        draft = _draft(raw)
        if draft is None:
            errors.append(f"{name}: missing title or content")
            continue
        if name == "add":
            ops.append(DistilOp("add", draft))
            continue
        raw_ids = next((raw[k] for k in ("target_ids", "targets", "target_id", "target", "ids", "id") if k in raw), None)
        ids = _ids(raw_ids) if raw_ids is not None else None
        if not ids:
            errors.append(f"update: bad or missing target_ids {raw_ids!r}")
            continue
        unknown = [i for i in ids if i not in valid_ids]
        if unknown:
            errors.append(f"update: target ids {unknown} were not among the shown entries {sorted(valid_ids)}")
            continue
        ops.append(DistilOp("update", draft, list(dict.fromkeys(ids))))
    return ops, errors


def parse_merge(text: str, cluster_ids: list[int]) -> tuple[MergeDecision, list[str]]:
    """A merge decision; unusable output becomes ``KEEP`` with errors (the cluster is left alone)."""
    clipped: list[str] = []
    try:
        value = extract_json(_bounded(text, clipped))
    except ValueError as e:
        return MergeDecision("KEEP"), [*clipped, f"malformed: {e}"]
    if isinstance(value, list) and value and isinstance(value[0], dict):
        value = value[0]
    if not isinstance(value, dict):
        return MergeDecision("KEEP"), ["malformed: expected a JSON object"]
    name = _op_name(value).upper()
    if name in ("KEEP", "NONE", "NOOP"):
        return MergeDecision("KEEP"), []
    if name == "MERGE":
        draft = _draft(value)
        if draft is None and isinstance(value.get("entries"), list) and value["entries"]:
            first = value["entries"][0]
            draft = _draft(first) if isinstance(first, dict) else None
        return (MergeDecision("MERGE", [draft]), []) if draft else (MergeDecision("KEEP"), ["MERGE without an entry"])
    if name == "REWRITE":
        raw = value.get("entries")
        drafts = [d for d in (_draft(x) for x in raw if isinstance(x, dict))] if isinstance(raw, list) else []
        good = [d for d in drafts if d is not None]
        if not good:
            return MergeDecision("KEEP"), ["REWRITE without valid entries"]
        errors = [f"REWRITE: {len(good)} entries for {len(cluster_ids)} originals; extra dropped"] if len(good) > len(cluster_ids) else []
        return MergeDecision("REWRITE", good[: len(cluster_ids)]), errors
    if name == "DISCARD":
        raw_ids = next((value[k] for k in ("target_ids", "ids", "targets", "discard") if k in value), None)
        ids = _ids(raw_ids) if raw_ids is not None else None
        if not ids:
            return MergeDecision("KEEP"), [f"DISCARD: bad or missing target_ids {raw_ids!r}"]
        unknown = [i for i in ids if i not in cluster_ids]
        if unknown:
            return MergeDecision("KEEP"), [f"DISCARD: ids {unknown} are not in the cluster {cluster_ids}"]
        ids = list(dict.fromkeys(ids))
        if len(ids) >= len(cluster_ids):
            return MergeDecision("KEEP"), ["DISCARD would delete the whole cluster"]
        return MergeDecision("DISCARD", discard_ids=ids), []
    return MergeDecision("KEEP"), [f"unknown merge op {name!r}"]


def parse_answer(text: str, max_chars: int = 600) -> str:
    """The answer text without thinking, fences or ``<answer>`` tags, clipped (may be empty)."""
    text = strip_thinking(text[:MAX_REPLY_CHARS])
    m = re.search(r"<answer>(.*?)(?:</answer>|$)", text, re.S | re.I)
    if m:
        text = m.group(1)
    text = text.replace("```", "").strip()
    return _clip(text, max_chars) if text else ""
