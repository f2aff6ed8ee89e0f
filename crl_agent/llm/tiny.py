"""Tiny random chat models built in code, for fast tests of anything that needs an LLM.

:func:`build_tiny_chat_model` writes a randomly initialised Llama (or Qwen2) with a byte-level
tokenizer and a ChatML chat template to a directory that every local backend loads like a real
model. It needs no download and decodes a few hundred tokens per second on one CPU core. Its
output is noise, so use it to test plumbing (batching, stop strings, log-probs, parsing, the
harness), not behaviour.
"""

from __future__ import annotations

from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def build_byte_tokenizer():
    """A byte-level tokenizer (256 byte tokens, no merges) with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {**specials, **{ch: len(specials) + i for i, ch in enumerate(alphabet)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_chat_model(
    path: str | Path,
    *,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    max_context: int = 2048,
    seed: int = 0,
) -> Path:
    """Save a tiny random chat model to ``path`` and return it.

    Args:
        path: output directory (created).
        arch: ``"llama"`` or ``"qwen2"``.
        hidden_size: model width (4 attention heads, 2 key-value heads).
        num_layers: decoder layers.
        max_context: ``max_position_embeddings``.
        seed: torch seed for the random weights.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_byte_tokenizer()
    kinds = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in kinds:
        raise ValueError(f"arch must be one of {sorted(kinds)}, got {arch!r}")
    config_cls, model_cls = kinds[arch]
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_context,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
