"""Training checkpoints: trainable weights, optimiser state, step, config and RNG state in one file.

:func:`save_checkpoint` writes atomically: the whole checkpoint goes to a temporary file in the same
folder, which is flushed and fsynced, then renamed over the old one (and the folder fsynced), so a
trainer killed at any moment (even ``kill -9`` mid-write) leaves either the previous checkpoint or
the new one, never a torn file (issue 15, "Bad input and failure").

Weights are what training changes (:func:`crl_agent.rl.lora.trainable_state_dict`): the LoRA adapter
of a ``peft`` model, or the full state of a plain one. Several models can share a checkpoint (the
actor and the extractor), each under its own name with its learner's optimiser state.

:func:`config_diff` names the fields two run configs disagree on, so that ``--resume`` with a
different config can be refused with those names.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from crl_agent.rl.lora import is_lora, load_trainable_state_dict, trainable_state_dict

FORMAT = 1


def _plain(config: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if not isinstance(config, Mapping):
        raise TypeError(f"a config is a dict or a dataclass instance, got {type(config).__name__}")
    try:
        return json.loads(json.dumps(dict(config), sort_keys=True))
    except (TypeError, ValueError) as e:
        raise TypeError(f"the config must hold JSON values only (numbers, strings, lists, dicts): {e}") from e


def config_diff(old: Any, new: Any) -> list[str]:
    """The fields where two configs differ, nested keys dotted (``"lora.r"``), sorted.

    A field present in only one of them counts as differing. Configs are dicts or dataclass instances.
    """
    out: list[str] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                name = f"{prefix}.{key}" if prefix else str(key)
                if key not in a or key not in b:
                    out.append(name)
                else:
                    walk(a[key], b[key], name)
        elif a != b:
            out.append(prefix)

    walk(_plain(old), _plain(new), "")
    return out


def _rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.copy()), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    path: str | os.PathLike,
    *,
    step: int,
    config: Any,
    models: Mapping[str, torch.nn.Module],
    learners: Mapping[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Atomically write a checkpoint to ``path`` (replacing any previous one).

    Args:
        path: the checkpoint file (its folder is created).
        step: the training step just completed.
        config: the run config (a dict or dataclass of JSON values).
        models: name -> model whose trainable weights to save.
        learners: name -> learner (anything with ``state_dict()``, e.g. :class:`PolicyLearner`).
        extra: more JSON-like state (counters, the bank's path, ...).

    Returns:
        ``path`` as a :class:`Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "step": int(step),
        "config": _plain(config),
        "models": {name: {"lora": is_lora(m), "weights": trainable_state_dict(m)} for name, m in models.items()},
        "learners": {name: lr.state_dict() for name, lr in (learners or {}).items()},
        "extra": extra or {},
        "rng": _rng_state(),
    }
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):  # from writers killed mid-write
        leftover.unlink(missing_ok=True)
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


@dataclasses.dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns besides the state it restores in place."""

    step: int
    config: dict[str, Any]
    extra: dict[str, Any]
    path: Path


def load_checkpoint(
    path: str | os.PathLike,
    *,
    models: Mapping[str, torch.nn.Module] | None = None,
    learners: Mapping[str, Any] | None = None,
    restore_rng: bool = True,
) -> Checkpoint:
    """Read a checkpoint and restore, in place, the named models' weights and learners' state.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ValueError: the file is not a checkpoint of this format, or a named model or learner is
            missing from it, or its weights do not fit the model.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise ValueError(f"{path} is not a readable checkpoint: {e}") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a crl-bench checkpoint of format {FORMAT}")
    for name, model in (models or {}).items():
        if name not in payload["models"]:
            raise ValueError(f"checkpoint {path} has no model {name!r} (it has {sorted(payload['models'])})")
        saved = payload["models"][name]
        if saved["lora"] != is_lora(model):
            raise ValueError(
                f"checkpoint model {name!r} is {'a LoRA adapter' if saved['lora'] else 'full weights'} "
                f"but the model given is {'LoRA-wrapped' if is_lora(model) else 'plain'}"
            )
        load_trainable_state_dict(model, saved["weights"])
    for name, learner in (learners or {}).items():
        if name not in payload["learners"]:
            raise ValueError(f"checkpoint {path} has no learner {name!r} (it has {sorted(payload['learners'])})")
        learner.load_state_dict(payload["learners"][name])
    if restore_rng:
        _set_rng_state(payload["rng"])
    return Checkpoint(step=int(payload["step"]), config=payload["config"], extra=payload["extra"], path=path)
