"""How a chat and a candidate reply become token ids: shared by every backend that holds a tokenizer.

- :func:`render_chat_ids`: the chat template applied with the generation prompt, tokenized as is.
- :func:`find_end_of_turn`: the token(s) the template writes after an assistant reply, found by
  rendering a probe reply (``<|im_end|>`` for ChatML; ``<|eot_id|>`` for Llama 3).
- :func:`candidate_token_ids`: a candidate reply tokenized on its own, with text that looks like a
  special token kept as plain text, followed by the end-of-turn ids.
"""

from __future__ import annotations

from typing import Any

_EOT_PROBE = "crl-end-of-turn-probe"


def render_chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` through the chat template, ready for the assistant's turn."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def find_end_of_turn(tokenizer: Any, eos_ids: frozenset[int] | set[int]) -> list[int]:
    """The ids that close an assistant reply, up to the first end-of-sequence id.

    Raises:
        ValueError: the template ends replies with no EOS token and the tokenizer has none either.
    """
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _EOT_PROBE}], tokenize=False
        )
        ids = list(tokenizer(text[text.rindex(_EOT_PROBE) + len(_EOT_PROBE):], add_special_tokens=False)["input_ids"])
    except Exception:  # noqa: BLE001 - some templates refuse this shape; fall back to the EOS token
        ids = []
    eos = set(eos_ids) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    for j, t in enumerate(ids):
        if t in eos:
            return ids[: j + 1]
    if tokenizer.eos_token_id is not None:
        return [int(tokenizer.eos_token_id)]
    raise ValueError("cannot tell which token ends an assistant turn: the tokenizer has no EOS token")


def candidate_token_ids(tokenizer: Any, text: str, end_of_turn: list[int]) -> list[int]:
    """``text`` tokenized on its own (special-token text as plain text), then ``end_of_turn``."""
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return list(ids) + list(end_of_turn)
