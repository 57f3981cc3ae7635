"""How many ids a tokenizer can produce.

``len(tokenizer)`` counts tokens, not ids: a vocabulary with unused ids (GPT-NeoX: 50,409 tokens whose largest id is
50,431) can produce ids past its length. Every id a tokenizer can produce needs an embedding row, so vocabulary
sizes, plans and row counts are taken from one past the largest id, never from the length.
"""

from __future__ import annotations

from typing import Any

from vocgraft.tokenization.spec import tokenizer_spec


def id_range(tokenizer: Any) -> int:
    """One past the largest id the tokenizer has (its model vocabulary and its added tokens)."""
    if getattr(tokenizer, "backend_tokenizer", None) is None:  # a slow tokenizer: ask it (slower)
        return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)
    spec = tokenizer_spec(tokenizer)  # parsed once per tokenizer: get_vocab() builds a dict on every call
    vocab = spec["model"]["vocab"]
    largest = len(vocab) - 1 if isinstance(vocab, list) else max(vocab.values(), default=-1)  # Unigram: a list
    largest = max([largest, *(token["id"] for token in spec.get("added_tokens", []))])
    return max(len(tokenizer), largest + 1)
