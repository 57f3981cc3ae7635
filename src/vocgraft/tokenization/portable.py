"""Saving tokenizers so that every supported ``transformers`` version loads them the same way.

transformers 5 writes ``"tokenizer_class": "TokenizersBackend"`` for a tokenizer whose whole pipeline is its
tokenizer.json; that class does not exist in transformers 4 ("Tokenizer class TokenizersBackend does not exist").
``PreTrainedTokenizerFast`` names the same thing in both (in 5 it is an alias), so saved directories say that.
Model-specific classes (``LlamaTokenizer`` ...) are not used either: in transformers 5 they rebuild their pipeline
from vocab and merges and would drop tokenizer.json's normalizer and model flags.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PORTABLE_CLASS = "PreTrainedTokenizerFast"
CONFIG_FILE = "tokenizer_config.json"


def save_portable(tokenizer: Any, folder: str | Path) -> None:
    """``tokenizer.save_pretrained(folder)``, then make its config name a class every version has."""
    folder = Path(folder)
    tokenizer.save_pretrained(folder)
    make_portable(folder)


def make_portable(folder: str | Path) -> None:
    """Point a saved tokenizer's config at ``PreTrainedTokenizerFast`` (the pipeline is tokenizer.json)."""
    path = Path(folder) / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config["tokenizer_class"] = PORTABLE_CLASS
    for key in ("auto_map", "vocab_file", "merges_file", "tokenizer_file"):  # files we do not ship
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
