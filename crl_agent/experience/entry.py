"""The rows of an experience bank: the SQLite schema, :class:`ExperienceEntry` and write transactions.

:mod:`crl_agent.experience.bank` builds the bank on these; they have no state of their own.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crl_agent.experience.bankdir import sqlite_error

__all__ = ["COLUMNS", "SCHEMA", "SCHEMA_VERSION", "ExperienceEntry", "Transaction", "check_text", "entry_from_row"]

SCHEMA_VERSION = 1
COLUMNS = (
    "id, task, title, content, created, updated, sources, origin, "
    "retrieve_count, train_count, last_retrieved, last_trained_step"
)
SCHEMA = """
CREATE TABLE IF NOT EXISTS entries(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task TEXT NOT NULL,
    title TEXT NOT NULL,
    content TEXT NOT NULL,
    embedding BLOB NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    sources TEXT NOT NULL DEFAULT '[]',
    origin TEXT,
    retrieve_count INTEGER NOT NULL DEFAULT 0,
    train_count INTEGER NOT NULL DEFAULT 0,
    last_retrieved REAL,
    last_trained_step INTEGER
);
CREATE INDEX IF NOT EXISTS entries_task ON entries(task);
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass
class ExperienceEntry:
    """One distilled experience.

    Attributes:
        id: stable integer id (never reused), also the index label.
        task: the task or family it belongs to (an env id or family name).
        title: a short name for the rule.
        content: the generalisable if-then rule.
        created, updated: Unix times.
        sources: ids of the trajectories it was distilled from.
        origin: id of the extractor call that last wrote it (for the meta-reward).
        retrieve_count, train_count, last_retrieved, last_trained_step: usage stats.
    """

    id: int
    task: str
    title: str
    content: str
    created: float
    updated: float
    sources: list[str] = field(default_factory=list)
    origin: str | None = None
    retrieve_count: int = 0
    train_count: int = 0
    last_retrieved: float | None = None
    last_trained_step: int | None = None

    @property
    def text(self) -> str:
        """What gets embedded."""
        return f"{self.title}\n{self.content}"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def entry_from_row(row: tuple) -> ExperienceEntry:
    return ExperienceEntry(*row[:6], json.loads(row[6]), *row[7:])


def check_text(**fields: str) -> None:
    """Entry fields must be non-empty, valid Unicode (SQLite stores UTF-8: no lone surrogates)."""
    for name, value in fields.items():
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"an entry needs a non-empty {name} string, got {str(value)[:40]!r}")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"entry {name} is not valid Unicode (a lone surrogate at position {e.start}); clean it first, "
                "e.g. text.encode('utf-8', 'replace').decode()"
            ) from None


class Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any exception; SQLite failures become BankError."""

    def __init__(self, db: sqlite3.Connection, path: Path):
        self.db, self.path = db, path

    def __enter__(self) -> None:
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise sqlite_error(self.path, e) from e

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc_type is not None:
            self.db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError):
                raise sqlite_error(self.path, exc) from exc
            return
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as e:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise sqlite_error(self.path, e) from e
