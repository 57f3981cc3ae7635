"""The pre-tokenizer llama.cpp runs for a GGUF file's ``tokenizer.ggml.pre`` type, where transformers' GGUF
conversion leaves it out.

transformers (5.24) knows the split regexes of llama3, qwen2, tekken, gpt-4o and a few more; for any other type it
gives plain GPT-2 byte-level splitting. llama.cpp's ``smollm`` type (the label its convert_hf_to_gguf.py gives
SmolLM's tokenizer, and what the packaged SmolLM2 GGUF carries; src/llama-vocab.cpp runs the same regex list for
starcoder, refact, command-r, codeshell and exaone) first isolates every ``\\p{N}`` character, then applies the
GPT-2 regex to each stretch between them: in tokenizers' terms ``Sequence[Digits(individual_digits),
ByteLevel(use_regex)]``, the SmolLM/StarCoder tokenizer.json pre-tokenizer. SmolLM2's vocabulary has no token with
two digits either way; what the digit split changes is the whitespace run before a digit, which GPT-2's
``\\s+(?!\\S)`` cuts one character short: without it "\\n\\n1." is ``Ċ Ċ 1 .`` where llama.cpp gives ``ĊĊ 1 .``
(2 of 200 English held-out paragraphs of 5 lines differ), and a tokenizer trained with the source's
pre-tokenizer (replace) learns multi-digit tokens SmolLM2 never had.
"""

from __future__ import annotations

from pathlib import Path

# tokenizer.ggml.pre -> tokenizers' pre_tokenizer JSON; only types that transformers converts wrongly
LLAMA_CPP_PRE_TOKENIZERS: dict[str, dict] = {
    "smollm": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    },
}


def gguf_pre_type(gguf_path: str | Path) -> str | None:
    """The file's ``tokenizer.ggml.pre`` string, or None when it has none."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.ggml.pre")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def match_llama_cpp(tokenizer, pre_type: str | None):
    """Give a tokenizer converted from a GGUF file the pre-tokenizer llama.cpp uses for ``pre_type`` (in place;
    returned). Types transformers already converts right are left as they are."""
    from vocgraft.tokenization.train import _component

    spec = LLAMA_CPP_PRE_TOKENIZERS.get(pre_type or "")
    if spec is not None:
        tokenizer.backend_tokenizer.pre_tokenizer = _component("pre_tokenizer", spec)
    return tokenizer
