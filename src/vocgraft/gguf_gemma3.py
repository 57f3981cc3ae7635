"""What transformers' GGUF loader leaves out of a Gemma 3 file's config, set as llama.cpp runs the file.

transformers (5.24) converts a ``gemma3`` GGUF file almost whole: sizes, head_dim, norm epsilon, the rotary base,
the sliding window (its default layer pattern, five sliding layers then one full, is llama.cpp's fixed one); it
subtracts the 1 llama.cpp's files add to Gemma's norm weights, the model class scales the embeddings by
sqrt(hidden) itself, and the tokenizer it builds from the SentencePiece vocabulary and scores gives llama.cpp's
ids (benchmarks/gemma3.py; tests/test_gemma3.py). It does not read, and so silently loses:

- ``gemma3.rope.scaling.type`` / ``.factor``: Gemma 3 4B to 27B rotate their full-attention layers with a linear
  scale of 8; without it every position of those layers is rotated 8 times too far;
- ``gemma3.final_logit_softcapping``;
- the query scale: llama.cpp divides queries by sqrt(head_dim) (sqrt(hidden / heads) for the 62-layer 27B), while
  transformers keeps its default ``query_pre_attn_scalar`` of 256, right only where head_dim is 256.

The packaged Gemma 3 270M needs none of these (no scaling, head_dim 256); other Gemma 3 files, and the ones
``vocgraft export gguf`` writes, can.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _field(reader: Any, key: str):
    found = reader.fields.get(key)
    return None if found is None else found.contents()


def query_scalar(config: Any, head_dim: int) -> float:
    """What llama.cpp divides the queries by the square root of (reading a file here; :mod:`vocgraft.export.gemma3`
    checks a model against it before writing one)."""
    if config.num_hidden_layers == 62:  # the 27B (LLM_TYPE_27B)
        return config.hidden_size / config.num_attention_heads
    return float(head_dim)


def match_llama_cpp(config: Any, gguf_path: str | Path) -> list[str]:
    """Set on a ``gemma3_text`` config converted from ``gguf_path`` what the file says and transformers did not
    read (in place); the names of the settings changed."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    changed = []
    kind, factor = _field(reader, "gemma3.rope.scaling.type"), _field(reader, "gemma3.rope.scaling.factor")
    if kind == "linear" and factor and float(factor) != 1.0:
        full = config.rope_parameters["full_attention"]
        full.update(rope_type="linear", factor=float(factor))
        changed.append("rope_parameters.full_attention")
    cap = _field(reader, "gemma3.final_logit_softcapping")
    if cap:
        config.final_logit_softcapping = float(cap)
        changed.append("final_logit_softcapping")
    scalar = query_scalar(config, config.head_dim)
    if config.query_pre_attn_scalar != scalar:
        config.query_pre_attn_scalar = int(scalar) if float(scalar).is_integer() else scalar
        changed.append("query_pre_attn_scalar")
    return changed
