"""Tokenizer fertility: tokens per line, characters and UTF-8 bytes per token, and the speedup proxy."""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence


def encode_lines(tokenizer, lines: Sequence[str]) -> list[list[int]]:
    """Token ids of each line, without special tokens (batched through the fast tokenizer)."""
    return tokenizer(list(lines), add_special_tokens=False)["input_ids"]


def fertility(token_ids: Sequence[Sequence[int]], lines: Sequence[str]) -> dict:
    counts = [len(ids) for ids in token_ids]
    tokens = sum(counts)
    chars = sum(len(line) for line in lines)
    nbytes = sum(len(line.encode("utf-8")) for line in lines)
    return {
        "lines": len(lines),
        "tokens": tokens,
        "chars": chars,
        "bytes": nbytes,
        "tokens_per_line_mean": tokens / len(lines),
        "tokens_per_line_median": statistics.median(counts),
        "chars_per_token": chars / tokens,
        "bytes_per_token": nbytes / tokens,
    }


def speedup(baseline_tokens_per_line: float, tokens_per_line: float) -> float:
    """The papers' inference-speedup proxy: how many times fewer tokens the adapted tokenizer needs."""
    return baseline_tokens_per_line / tokens_per_line


def new_tokens_used_share(token_ids: Sequence[Sequence[int]], new_ids: Collection[int]) -> float:
    """Share of the ``new_ids`` that occur at least once in the tokenized text (0 when there are none)."""
    new = set(new_ids)
    used = {t for ids in token_ids for t in ids} & new
    return len(used) / len(new) if new else 0.0


def tokens_per_byte(tokenizer, lines: Sequence[str]) -> float:
    """Tokens per UTF-8 byte of ``lines`` (no special tokens): the number of decoding steps a text of that kind
    costs per byte, comparable across tokenizers (held-out text: the text-independent side of a speedup)."""
    result = fertility(encode_lines(tokenizer, lines), lines)
    return result["tokens"] / result["bytes"]
