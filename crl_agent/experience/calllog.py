"""The extractor call log: JSONL a trainer folds into CISPO samples with meta-rewards.

Three record types, one JSON object per line, appended (a crash loses at most a torn last line,
which :func:`load_samples` skips):

- ``{"type": "call", "call_id", "kind": "distil"|"merge"|"answer", "messages", "text", "token_ids",
  "logprobs", "sampling_logprobs", "temperature", "prompt_token_ids", "policy_version", "ops", "errors",
  "entries", "task", "trajectory", "time", "seconds"}``: one extractor call (``sampling_logprobs``: of
  the distribution it was sampled from, at ``temperature``; ``policy_version``: the extractor's weights
  that sampled it; ``seconds``: how long the backend took to answer), what it wrote and which entries it
  touched.
- ``{"type": "outcome", "episode", "outcome": +1|-1, "call_ids", "entries"}``: an episode guided by
  entries written by those calls (or by an answer call) ended.
- ``{"type": "trained", "call_ids", "step", "entries"}``: a trainer used those samples at ``step``
  (``entries``: the bank entries whose ``train_count`` it bumped).
- ``{"type": "dropped", "call_ids", "step"}``: a trainer let those calls' pending outcomes go without
  training on them (a bounded training buffer's oldest, dropped to make room); they count as consumed
  evidence, not as training.

A trainer's checkpoint records the log's :meth:`CallLog.offset`; ``--resume`` cuts the log back to it
(:meth:`CallLog.truncate`), so a step redone after a kill starts from the log its checkpoint saw.

Meta-reward of a call = mean outcome (±1) of the distinct episodes it guided (an episode key credited
twice, e.g. by a step redone after a kill, counts once: its last outcome); entries retrieved repeatedly
share their samples.

**The training buffer** (the official code's FIFO ``MemoryTrainingBuffer``): a call is *queued* once an
outcome credits it, and leaves the queue when a trainer trains on it (a ``trained`` record) or drops it (a
``dropped`` record: a bounded buffer's oldest); it returns only with outcomes logged after that record.
Its ``new_reward`` is the meta-reward of those new outcomes alone, so no update sees the same evidence
twice; ``queued_at`` (the log position of its first new outcome) orders the queue, oldest first.
``reward`` stays the meta-reward over every episode the call guided.

Count-aware weight of a call (DESIGN section 7) = mean over the entries it wrote
that are still in the bank of ``w = 0`` if the entry was trained within ``cooldown`` steps, else
``(1 + train_count) ** -0.5``. A call with no live entry (a search-and-ask answer, a write merged away or
deleted, a call that wrote nothing) takes the same rule with its own counts, from the ``trained``
records: ``0`` within ``cooldown`` steps of its last training, else ``(1 + times trained) ** -0.5``, so
it is neither retrained every step nor at full weight for ever on its ageing log-probs.

With ``ManagerConfig.credit_no_ops`` (off by default, as in the paper) episodes that nothing guided are
logged too (``"blind": true`` outcome records, no call ids), and a distillation that wrote nothing is
rewarded with the mean outcome of the next ``NO_OP_WINDOW`` of them: writing nothing is worth what the
actor does without experience.
"""

from __future__ import annotations

import bisect
import io
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl_agent.experience.bank import ExperienceBank, ExperienceEntry
from crl_agent.rl.credit import count_aware_weight, meta_reward

log = logging.getLogger(__name__)

NO_OP_WINDOW = 64  # blind episodes after a call that wrote nothing whose mean outcome is its reward


class CallLog:
    """Thread-safe JSONL appender.

    Args:
        path: the log file (parents created); ``None`` keeps records in memory only.
    """

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._file = None
        self.memory: list[dict[str, Any]] = []
        # what records() has read of the file: the records of its complete lines up to byte _read_end, so each
        # call reads only what was written since
        self._read: list[dict[str, Any]] = []
        self._read_end = 0
        self._read_file: tuple[int, int] | None = None  # the file read (device, inode)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            torn = self._ends_torn(self.path)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            if torn:  # a killed writer's half line: end it, or our first record would be glued to it and lost
                self._file.write("\n")
                self._file.flush()

    @staticmethod
    def _ends_torn(path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                if f.tell() == 0:
                    return False
                f.seek(-1, os.SEEK_END)
                return f.read(1) != b"\n"
        except FileNotFoundError:
            return False

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, default=str)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates (e.g. from a server's JSON): escaped, still valid JSON
            line = json.dumps(record, ensure_ascii=True, default=str)
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()
            else:
                self.memory.append(record)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None

    def records(self) -> list[dict[str, Any]]:
        """Every record written so far (file-backed: the lines written since the last call are read and
        added to those read before)."""
        if self.path is None:
            with self._lock:
                return list(self.memory)
        with self._lock:
            if self._file is not None:
                self._file.flush()
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                if (stat.st_dev, stat.st_ino) != self._read_file or stat.st_size < self._read_end:
                    self._read, self._read_end = [], 0  # replaced or cut by another hand: read it anew
                    self._read_file = (stat.st_dev, stat.st_ino)
                f.seek(self._read_end)
                new = f.read()
            whole = new.rfind(b"\n") + 1  # a last line without its newline may still be being written
            self._read.extend(_parse(_lines(new[:whole])))
            self._read_end += whole
            return self._read + _parse(_lines(new[whole:]))

    def offset(self) -> int:
        """Where the log ends now: its size in bytes (its number of records when kept in memory)."""
        with self._lock:
            if self.path is None:
                return len(self.memory)
            if self._file is not None:
                self._file.flush()
            return os.path.getsize(self.path)

    def truncate(self, offset: int) -> list[dict[str, Any]]:
        """Cut the log back to ``offset`` (an earlier :meth:`offset`); returns the records cut off.

        A log that no longer reaches ``offset``, or whose ``offset`` is not the end of a record (the
        file was replaced or lost its tail), is left as it is, with a warning.
        """
        with self._lock:
            if self.path is None:
                dropped, self.memory[offset:] = self.memory[offset:], []
                return dropped
            if self._file is not None:
                self._file.flush()
            with open(self.path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                before = b"\n"
                if 0 < offset <= size:
                    f.seek(offset - 1)
                    before = f.read(1)
                tail = f.read() if offset <= size else b""
            if offset > size or before != b"\n":
                log.warning("%s does not end a record at byte %d (%d bytes): left uncut", self.path, offset, size)
                return []
            os.truncate(self.path, offset)  # the append-mode handle writes at the new end
            self._read, self._read_end = [], 0
        return _parse(tail.decode("utf-8", errors="replace").splitlines())


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a call log; torn or foreign lines are skipped."""
    with open(path, encoding="utf-8") as f:
        return _parse(f)


def _lines(data: bytes) -> list[str]:
    """``data``'s lines as a text-mode file iterates them (universal newlines)."""
    return io.StringIO(data.decode("utf-8"), newline=None).readlines()


def _parse(lines) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "type" in rec:
            out.append(rec)
    return out


@dataclass
class ExtractorSample:
    """One extractor call ready for CISPO.

    Attributes:
        call_id, kind: which call.
        messages, prompt_token_ids, token_ids, logprobs: the sampled completion; ``logprobs`` are those of
            the distribution it was drawn from, ``softmax(logits / temperature)`` (CISPO's old policy).
        reward: meta-reward, mean ±1 outcome of guided episodes (``None``: none guided yet).
        episodes: how many guided episodes the reward averages.
        weight: count-aware weight.
        entries: ids of the entries the call wrote (or, for answers, read).
        policy_version: the extractor's policy version (its learner's updates) when it made the call.
        temperature: the temperature of ``logprobs``: the sampling temperature where the backend reported
            the sampled distribution's log-probs, else 1 (the unmodified model's, as older logs hold).
        new_reward: meta-reward of the outcomes logged since the call was last trained (``None``: none, so
            it is not in the training buffer; see the module docstring).
        new_episodes: how many episodes ``new_reward`` averages.
        queued_at: the log position (record index) of its first outcome since it was last trained: the
            buffer's FIFO order (``-1``: not queued).
        model_chosen: per token, whether the model chose it (``Completion.model_chosen``; empty: unknown,
            every token counts).
    """

    call_id: str
    kind: str
    messages: list[dict[str, str]]
    prompt_token_ids: list[int] | None
    token_ids: list[int]
    logprobs: list[float]
    reward: float | None
    episodes: int
    weight: float
    entries: list[int] = field(default_factory=list)
    policy_version: int = 0
    temperature: float = 1.0
    new_reward: float | None = None
    new_episodes: int = 0
    queued_at: int = -1
    model_chosen: list[bool] = field(default_factory=list)

    @property
    def queued(self) -> bool:
        """Whether the call is in the training buffer: it has outcomes no update has trained on."""
        return self.new_reward is not None


def entry_weight(entry: ExperienceEntry, step: int, cooldown: int = 1) -> float:
    """``0`` if trained within the last ``cooldown`` steps, else ``(1 + train_count) ** -0.5``.

    The rule is :func:`crl_agent.rl.credit.count_aware_weight`.
    """
    return count_aware_weight(entry.train_count, entry.last_trained_step, step, cooldown)


def fold_samples(
    records: list[dict[str, Any]], bank: ExperienceBank | None = None, step: int = 0, cooldown: int = 1,
    no_op_reward: bool = False,
) -> list[ExtractorSample]:
    """Turn call-log records into samples with meta-rewards and count-aware weights (see the module
    docstring; ``bank=None``: every call weighs by its own training counts). ``no_op_reward``: a distil
    call that wrote no entry is rewarded with the mean outcome of the next :data:`NO_OP_WINDOW` blind
    episodes (``"blind"`` outcome records: nothing guided them) logged after it."""
    outcomes: dict[str, dict[str, tuple[int, float]]] = {}  # call id -> episode key -> (record index, outcome)
    trained: dict[str, tuple[int, int]] = {}  # call id -> (times trained, the last step)
    trained_at: dict[str, int] = {}  # call id -> record index of its last ``trained`` record
    blind: list[tuple[int, str, float]] = []  # (record index, episode key, outcome) of unguided episodes
    for n, rec in enumerate(records):
        if rec["type"] == "outcome":
            episode = str(rec.get("episode") or f"#record{n}")
            if rec.get("blind"):
                blind.append((n, episode, float(rec["outcome"])))
            for cid in set(rec.get("call_ids", ())):
                mine = outcomes.setdefault(cid, {})
                mine.pop(episode, None)  # the last credit of an episode counts, at its place in the log
                mine[episode] = (n, float(rec["outcome"]))
        elif rec["type"] == "trained":
            for cid in set(rec.get("call_ids", ())):
                count, last = trained.get(cid, (0, -1))
                trained[cid] = (count + 1, max(last, int(rec["step"])))
                trained_at[cid] = n
        elif rec["type"] == "dropped":
            for cid in rec.get("call_ids", ()):
                trained_at[cid] = n
    samples = []
    for n, rec in enumerate(records):
        if rec["type"] != "call":
            continue
        credited = list(outcomes.get(rec["call_id"], {}).values())  # (record index, outcome), in log order
        entries = [int(i) for i in rec.get("entries", [])]
        if no_op_reward and rec["kind"] == "distil" and not entries and not credited:
            first = bisect.bisect_right(blind, (n, "", 0.0))  # the first blind episode logged after the call
            after = {key: (i, o) for i, key, o in blind[first:first + NO_OP_WINDOW]}  # an episode twice: once
            credited = sorted(after.values())
        got = [o for _, o in credited]
        fresh = [(i, o) for i, o in credited if i > trained_at.get(rec["call_id"], -1)]
        live = []
        if bank is not None and rec["kind"] != "answer":
            live = [e for e in bank.get_many(entries) if e.origin == rec["call_id"]]
        if live:
            weight = sum(entry_weight(e, step, cooldown) for e in live) / len(live)
        else:
            weight = count_aware_weight(*trained.get(rec["call_id"], (0, None)), step, cooldown)
        logprobs, temperature = rec.get("logprobs", []), 1.0
        if rec.get("sampling_logprobs") and float(rec.get("temperature") or 0) > 0:
            logprobs, temperature = rec["sampling_logprobs"], float(rec["temperature"])
        samples.append(
            ExtractorSample(
                call_id=rec["call_id"],
                kind=rec["kind"],
                messages=rec["messages"],
                prompt_token_ids=rec.get("prompt_token_ids"),
                token_ids=rec.get("token_ids", []),
                logprobs=logprobs,
                reward=meta_reward(got),
                episodes=len(got),
                weight=weight,
                entries=entries,
                policy_version=int(rec.get("policy_version", 0)),
                temperature=temperature,
                new_reward=meta_reward(o for _, o in fresh),
                new_episodes=len(fresh),
                queued_at=fresh[0][0] if fresh else -1,
                model_chosen=[bool(x) for x in rec.get("model_chosen") or ()],
            )
        )
    return samples


def training_buffer(samples: list[ExtractorSample]) -> list[ExtractorSample]:
    """The calls in the training buffer (outcomes no update has trained on), oldest first."""
    return sorted((s for s in samples if s.queued), key=lambda s: s.queued_at)


def load_samples(
    path: str | os.PathLike, bank: ExperienceBank | None = None, step: int = 0, cooldown: int = 1
) -> list[ExtractorSample]:
    """Read a call-log file and fold it (see :func:`fold_samples`)."""
    return fold_samples(read_records(path), bank, step, cooldown)
