"""The bank folder's files: the exclusive lock, the SQLite connection, leftovers of killed saves.

Every failure here is a :class:`BankError` that says what is wrong with which file and how to fix
it; nothing in the folder is deleted or rewritten to "repair" it, except temporary files of an
index save that a killed process left behind (the index itself is always rebuildable from SQLite).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
from pathlib import Path
from typing import IO


class BankError(RuntimeError, ValueError):
    """The bank cannot be opened or used as asked (the message names the fix).

    It is also a ``ValueError``: a bad ``--bank`` folder is a bad argument, so command lines that
    report bad arguments as usage errors (``python -m eval.run``) print it without a traceback.
    """


LOCK_NAME = ".lock"


def ensure_folder(path: Path) -> None:
    """Create the bank folder, or say why it cannot be one."""
    if path.exists() and not path.is_dir():
        raise BankError(f"bank path {path} is a file, not a folder: pass a folder path (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BankError(f"cannot create the bank folder {path}: {e.strerror or e}; pass a writable path") from e


def _holder(lock_path: Path) -> str:
    try:
        pid = lock_path.read_text().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def lock_folder(path: Path) -> IO[str]:
    """Take the folder's exclusive lock (held until the returned file is closed) and record our pid in it.

    Two processes writing one bank would each keep their own index in memory and the last to save
    would win, so a second opener is refused, naming the holder. The kernel drops the lock when
    its holder dies, even by ``kill -9``.
    """
    lock_path = path / LOCK_NAME
    try:
        f = open(lock_path, "a+")  # noqa: SIM115 - held for the bank's lifetime; "a+" keeps the holder's pid
    except OSError as e:
        raise BankError(
            f"cannot write in the bank folder {path} ({e.strerror or e}): a bank needs a writable folder; "
            "copy it somewhere writable or fix its permissions"
        ) from e
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        f.close()
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise BankError(
                f"bank {path} is open in another process{_holder(lock_path)}: one process writes a bank at a "
                "time; wait for it to finish, stop it, or pass another bank folder"
            ) from e
        raise BankError(
            f"cannot lock the bank folder {path} ({e.strerror or e}): its filesystem does not support flock; "
            "put the bank on a local disk"
        ) from e
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def unlock_folder(f: IO[str] | None) -> None:
    if f is None or f.closed:
        return
    try:
        f.seek(0)
        f.truncate()
        fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        f.close()


def remove_save_leftovers(path: Path) -> None:
    """Delete temporary files of index saves interrupted by a kill (only the lock holder calls this)."""
    for leftover in [*path.glob("index-*.tmp"), path / "index.json.tmp"]:
        leftover.unlink(missing_ok=True)


def sqlite_error(db_path: Path, e: sqlite3.Error) -> BankError:
    """A :class:`BankError` for a SQLite failure on open or write, naming the fix."""
    msg = str(e)
    if "readonly" in msg or "unable to open" in msg or "read-only" in msg:
        return BankError(
            f"cannot write the bank database {db_path} ({msg}): a bank needs a writable folder and file; "
            "copy the folder somewhere writable or fix its permissions"
        )
    if "disk is full" in msg or "disk I/O" in msg:
        return BankError(f"the bank database {db_path} could not be written ({msg}): free disk space and retry")
    return BankError(
        f"the bank database {db_path} is unreadable ({msg}); it was left untouched: move the folder away "
        "(or restore it from a backup) and open the path again to start a fresh bank"
    )


def connect(db_path: Path) -> sqlite3.Connection:
    """Open (or create) the bank's SQLite file in WAL mode; a corrupt or unwritable file is a BankError."""
    db = None
    try:
        db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db
    except sqlite3.Error as e:
        if db is not None:
            db.close()
        raise sqlite_error(db_path, e) from e
