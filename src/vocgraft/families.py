"""Source models of the real tokenizer families users bring: the tokenizers in ``../shared/tokenizers`` (one folder
per family, with ``source-model.json``) wrapped in a tiny random causal LM with that family's embedding shape.

    from vocgraft.families import FAMILIES, family_source_dir
    source = family_source_dir("neox", tmp_path_factory.mktemp("neox"))  # a directory from_pretrained loads

New folders in ``../shared/tokenizers`` join ``FAMILIES`` automatically (none where that folder is absent;
``VOCGRAFT_TOKENIZERS`` points elsewhere). The tests' family matrix and the benchmarks both build their models here,
so it is part of the package rather than of tests/.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

SHARED_TOKENIZERS = Path(
    os.environ.get("VOCGRAFT_TOKENIZERS") or Path(__file__).resolve().parents[3] / "shared" / "tokenizers"
)
_FOLDERS = SHARED_TOKENIZERS.iterdir() if SHARED_TOKENIZERS.is_dir() else ()
FAMILIES = sorted(p.name for p in _FOLDERS if (p / "source-model.json").is_file())
LARGE = {"gemma4"}  # vocabularies of 256K+: marked slow where a test builds many models around them


def family_info(name: str) -> dict:
    """``source-model.json`` of a family: model_rows, tie_word_embeddings, bos/eos/unk/pad, chat_template."""
    return json.loads((SHARED_TOKENIZERS / name / "source-model.json").read_text(encoding="utf-8"))


def family_source_dir(name: str, root: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """``root``: the family's tokenizer files plus a random Llama-architecture model with the family's embedding
    rows and tying, saved for ``from_pretrained``. Special-token ids in the config are the tokenizer's."""
    folder = SHARED_TOKENIZERS / name
    info = family_info(name)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for file in folder.iterdir():
        if file.name != "source-model.json":
            shutil.copy(file, root / file.name)
    tokenizer = AutoTokenizer.from_pretrained(root)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=info["model_rows"],
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=2 * hidden,
        tie_word_embeddings=info["tie_word_embeddings"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(root)
    return root
