"""Tokenizer stage: auxiliary tokenizer training and vocabulary expansion with real BPE merges.

``train``: :func:`train_tokenizer` (byte-level BPE, SentencePiece BPE or Unigram) and :func:`save_tokenizer`.
``expand``: :func:`rank_new_tokens` and :func:`expand_tokenizer`, which returns an :class:`Expansion`.
``bpe``: :class:`BPEModel`, the pure-Python merge loop expansion plans with.

Names are imported lazily so that ``import vocgraft.tokenization.<module>`` does not load ``transformers``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TOKENIZER_KINDS": "train",
    "train_tokenizer": "train",
    "save_tokenizer": "train",
    "sentencepiece_model_bytes": "train",
    "Expansion": "expand",
    "bpe_family": "expand",
    "expand_tokenizer": "expand",
    "rank_new_tokens": "expand",
    "BPEModel": "bpe",
    "parse_merges": "bpe",
}

__all__ = [
    "TOKENIZER_KINDS",
    "BPEModel",
    "Expansion",
    "bpe_family",
    "expand_tokenizer",
    "parse_merges",
    "rank_new_tokens",
    "save_tokenizer",
    "sentencepiece_model_bytes",
    "train_tokenizer",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
