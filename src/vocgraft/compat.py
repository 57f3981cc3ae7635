"""The transformers API spellings that differ between the versions vocgraft runs with (4.x and 5.x).

One place for them, so the rest of the code calls one function instead of testing versions. Whether *outputs*
load in older versions is a different matter: see :mod:`vocgraft.tokenization.portable`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def transformers_version() -> tuple[int, int]:
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int(minor)


# GGUF tokenizers: before 5.18 transformers converts SmolLM2's with eos <|im_start|> (the file says <|im_end|>, id 2),
# no pad, and (before 5.12) a BOS added to every encoding and decoding that drops it: 0/500 lines round-trip
GGUF_TOKENIZER_FIXED = (5, 18)


def gguf_conversion_problem() -> str | None:
    """Why this transformers cannot convert GGUF files correctly, or None when it can."""
    if transformers_version() >= GGUF_TOKENIZER_FIXED:
        return None
    import transformers

    return (
        f"transformers {transformers.__version__} converts GGUF tokenizers with wrong special tokens (eos, pad, an "
        "added BOS); converting a GGUF file needs transformers >= 5.18: pip install -U 'transformers>=5.18', or give "
        "a Hugging Face model directory or hub id instead"
    )


def dtype_kwargs(dtype: Any) -> dict[str, Any]:
    """``from_pretrained`` keyword for the weights' dtype: ``dtype`` from 4.56 on, ``torch_dtype`` before."""
    return {"dtype": dtype} if transformers_version() >= (4, 56) else {"torch_dtype": dtype}


@lru_cache(maxsize=1)
def no_hub_kernels() -> dict[str, Any]:
    """``from_pretrained`` keyword that keeps the model's own torch layers: transformers >= 5.25 turns on the
    `kernels` integration by default, which refuses a model built on the meta device (vocgraft's sharded path) and
    would swap layers for downloaded kernels, so results would depend on the hub. Older versions have no such flag."""
    import inspect

    from transformers import PreTrainedModel

    return {"use_kernels": False} if "use_kernels" in inspect.getsource(PreTrainedModel.from_pretrained) else {}


def add_extra_special_tokens(tokenizer: Any, tokens: list[str]) -> int:
    """Add ``tokens`` as special tokens, keeping the ones the tokenizer already lists as extra special tokens
    (the keep-them flag is ``replace_extra_special_tokens`` in 5.x, ``replace_additional_special_tokens`` in 4.x)."""
    if transformers_version() >= (5, 0):
        return tokenizer.add_special_tokens({"additional_special_tokens": tokens}, replace_extra_special_tokens=False)
    return tokenizer.add_special_tokens({"additional_special_tokens": tokens}, replace_additional_special_tokens=False)


def gguf_dequantize_kwargs() -> dict[str, Any]:
    """``from_pretrained(..., gguf_file=...)`` keywords that load a GGUF file as a plain float model: transformers 5
    keeps GGUF blocks unless told ``GgufConfig(dequantize=True)``; 4.x always dequantizes and has no GgufConfig."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}
