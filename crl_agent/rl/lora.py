"""LoRA adapters through ``peft``, and the trainable state a checkpoint saves.

DESIGN section 9: LoRA (r = 16 on the attention projections) in bf16 is what makes CPU training
fast enough for a learning demo. :func:`add_lora` wraps a causal LM; :func:`trainable_state_dict`
returns only what training changes (the adapter for a LoRA model, every weight otherwise), which is
what :mod:`crl_agent.rl.checkpoint` saves.

When the actor and the extractor share one base model, give each its own adapter (``peft``'s
``add_adapter`` under a different name) and its own optimiser: two optimisers on one set of
weights would silently fight.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def import_peft():
    """The ``peft`` module (an ImportError naming the extra that installs it where it is missing)."""
    try:
        import peft
    except ImportError as e:
        raise ImportError('LoRA needs peft, part of the agent extra: pip install "crl-bench[agent]"') from e
    # peft 0.21 calls a transformers method that transformers 5.24 deprecates: noise on every run, not ours to fix
    warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*", category=FutureWarning)
    return peft


def add_lora(
    model: torch.nn.Module,
    r: int = 16,
    alpha: int | None = None,
    dropout: float = 0.0,
    target_modules: Sequence[str] = DEFAULT_TARGETS,
) -> torch.nn.Module:
    """Wrap ``model`` with a fresh LoRA adapter; only the adapter's weights are trainable.

    Args:
        model: a Hugging Face causal LM.
        r: adapter rank.
        alpha: scaling numerator (default ``2 * r``).
        dropout: adapter dropout (0: recomputed log-probs stay equal to the sampler's).
        target_modules: names of the linear layers that get an adapter.
    """
    peft = import_peft()
    config = peft.LoraConfig(
        r=r,
        lora_alpha=2 * r if alpha is None else alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a ``peft`` model (without importing peft when it is not installed)."""
    return any(cls.__module__.startswith("peft.") for cls in type(model).__mro__)


def trainable_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights training changes: the active LoRA adapter, or the full state of a plain model (CPU copies)."""
    if is_lora(model):
        state = import_peft().get_peft_model_state_dict(model)
    else:
        state = model.state_dict()
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def load_trainable_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load what :func:`trainable_state_dict` returned into a model of the same shape.

    Raises:
        ValueError: keys are missing or unexpected (a LoRA checkpoint into a plain model, or the reverse).
    """
    if is_lora(model):
        result = import_peft().set_peft_model_state_dict(model, state)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        expected = set(import_peft().get_peft_model_state_dict(model))
        missing = sorted(expected - set(state))
    else:
        result = model.load_state_dict(state, strict=False)
        unexpected = list(result.unexpected_keys)
        missing = list(result.missing_keys)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]} "
            "(a LoRA checkpoint into a full model, or the reverse?)"
        )


def export_weights(model: torch.nn.Module, path: str | Path, tokenizer=None) -> Path:
    """Write what training produced where a backend can load it, atomically (a temp folder, then a rename).

    A LoRA model writes its adapter (``peft``'s ``save_pretrained``: ``adapter_config.json`` and the
    weights), loadable with ``adapter=`` (``--agent-arg adapter=PATH`` in ``eval.run``); a fully
    trained model writes a complete model folder (with ``tokenizer``), loadable with ``--model PATH``.
    A reader never sees a half-written folder: the previous export stays until the new one is whole.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        model.save_pretrained(tmp)
        if tokenizer is not None and not is_lora(model):
            tokenizer.save_pretrained(tmp)
        old = path.with_name(f".{path.name}.old")
        if old.exists():
            shutil.rmtree(old)
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
