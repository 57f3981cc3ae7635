"""A fast tokenizer's ``tokenizer.json`` as a dict, and the tokenizer family it describes.

Parsing tokenizer.json costs ~0.1 s for a 50K vocabulary and ~1 s for Gemma's 262K; every question about a
tokenizer (its family, its merges, its pre-tokenizer) used to parse it again. :func:`tokenizer_spec` parses it
once per tokenizer object (again only after tokens were added) and hands out that one dict: treat it as
read-only (copy it before editing, as expansion does).
"""

from __future__ import annotations

import json
import weakref
from typing import Any

_SPECS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def backend_of(tokenizer: Any, role: str = "the"):
    """The ``tokenizers`` backend of a fast tokenizer; ValueError naming the fix for a slow one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"{role} tokenizer is a slow tokenizer ({type(tokenizer).__name__}); vocgraft reads and edits "
            "tokenizer.json, so load it as a fast tokenizer (AutoTokenizer.from_pretrained(..., use_fast=True))."
        )
    return backend


def tokenizer_spec(tokenizer: Any, role: str = "the") -> dict:
    """The parsed tokenizer.json (cached; read-only)."""
    backend = backend_of(tokenizer, role)
    key = (id(backend), len(tokenizer))
    try:
        cached = _SPECS.get(tokenizer)
    except TypeError:  # not weak-referenceable: no caching
        return json.loads(backend.to_str())
    if cached is None or cached[0] != key:
        cached = (key, json.loads(backend.to_str()))
        _SPECS[tokenizer] = cached
    return cached[1]


def find_node(node: Any, type_name: str) -> dict | None:
    """The first node of ``type_name`` in a tokenizer.json component tree (None when there is none)."""
    if isinstance(node, dict):
        if node.get("type") == type_name:
            return node
        children = node.values()
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        found = find_node(child, type_name)
        if found is not None:
            return found
    return None


def is_bytelevel(spec: dict) -> bool:
    """A BPE over GPT-2's byte alphabet (a ByteLevel pre-tokenizer or decoder)."""
    return spec["model"].get("type") == "BPE" and (
        find_node(spec.get("pre_tokenizer"), "ByteLevel") is not None
        or find_node(spec.get("decoder"), "ByteLevel") is not None
    )


def family_of_spec(spec: dict) -> str:
    """byte-level-bpe, sentencepiece-bpe, unigram, wordpiece, or ``other (<model type>)``."""
    model_type = spec["model"].get("type")
    if model_type == "BPE":
        return "byte-level-bpe" if is_bytelevel(spec) else "sentencepiece-bpe"
    return {"Unigram": "unigram", "WordPiece": "wordpiece"}.get(model_type, f"other ({model_type})")


def tokenizer_family(tokenizer: Any) -> str:
    """The family of a tokenizer: ``family_of_spec`` of its tokenizer.json, or ``other (<class>, slow
    tokenizer)`` for one without."""
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        return f"other ({type(tokenizer).__name__}, slow tokenizer)"
    return family_of_spec(tokenizer_spec(tokenizer))
