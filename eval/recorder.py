"""Writes finished episodes to a run folder off the event loop: ``episodes.jsonl`` and the trajectories.

:class:`RunRecorder` turns each :class:`~crl_agent.rollout.Episode` into its ``episodes.jsonl``
record at once (the caller gets it back for progress bars and summaries), and hands the disk work
to one writer thread, so encoding, compressing and fsyncing never stall the episodes in flight.

Order on disk, per batch of queued episodes: the trajectories are appended and fsynced first, then
the ``episodes.jsonl`` lines. A ``kill -9`` can therefore leave a trajectory whose episode was not
recorded (never the reverse); ``--resume`` calls :func:`eval.trajectories.repair`, which drops it,
and plays that episode again. What a kill loses is the episodes in flight and those still queued
(the writer keeps up in milliseconds).
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Any

from crl_agent.episode import Episode
from eval.results import EpisodeLog, episode_record
from eval.trajectories import FILENAME, MODES, encode_member, make_record

_STOP = object()


class RunRecorder:
    """Records episodes of one run; call :meth:`close` (or use ``with``) to drain the queue.

    Args:
        run_dir: the run folder.
        trajectories: ``"text"``, ``"full"`` or ``"none"``.
    """

    def __init__(self, run_dir: Path, trajectories: str = "text"):
        if trajectories not in MODES:
            raise ValueError(f"trajectories must be one of {MODES}, got {trajectories!r}")
        self.log = EpisodeLog(Path(run_dir) / "episodes.jsonl")
        self.mode, self.traj_path = trajectories, Path(run_dir) / FILENAME
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="crl-run-recorder", daemon=True)
        self._thread.start()

    def record(self, episode: Episode, **fields: Any) -> dict[str, Any]:
        """Queue ``episode`` for writing and return its ``episodes.jsonl`` record.

        Raises:
            OSError: a previous write failed (e.g. disk full): the run must stop, not lose episodes.
        """
        self._raise_if_failed()
        record, line = episode_record(episode, **fields)
        self._queue.put((episode, record, line))
        return record

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise OSError(f"could not write episodes to {self.log.path.parent}: {self._error}") from self._error

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            items = [b for b in batch if b is not _STOP]
            if items and self._error is None:
                try:
                    self._write(items)
                except BaseException as e:  # noqa: BLE001 - surfaced to the run by record()/close()
                    self._error = e
            if len(items) < len(batch):
                return

    def _write(self, items: list[tuple[Episode, dict[str, Any], str]]) -> None:
        if self.mode != "none":
            members = b"".join(encode_member(make_record(ep.to_dict(), rec, self.mode)) for ep, rec, _ in items)
            with self.traj_path.open("ab") as f:
                f.write(members)
                f.flush()
                os.fsync(f.fileno())
        with self.log.path.open("a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for _, _, line in items))
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        """Write everything queued, stop the writer thread, and raise if any write failed."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._raise_if_failed()

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
