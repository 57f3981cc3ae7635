"""Parsing of command-line values shared by the argument checks (:mod:`vocgraft.preflight`) and the pipeline
(:mod:`vocgraft.pipeline`): it imports neither, so both can import it."""

from __future__ import annotations

import re


class ArgumentError(ValueError):
    """An argument that cannot work; the message names the flag and the fix."""


def parse_ints(text: str, name: str) -> list[int]:
    """``50,100,500`` or ``2^10..2^15`` (every power of two in the range); ``name`` is the flag without ``--``."""
    text = text.replace(" ", "")
    span = re.fullmatch(r"2\^(\d+)\.\.2\^(\d+)", text)
    if span:
        low, high = int(span.group(1)), int(span.group(2))
        if low > high:
            raise ArgumentError(f"--{name} {text}: the range is empty.")
        return [2**e for e in range(low, high + 1)]
    try:
        values = [_int(v) for v in text.split(",") if v]
    except ValueError:
        raise ArgumentError(f"--{name} {text!r}: expected integers like 50,100 or a range like 2^10..2^15.") from None
    if not values or any(v <= 0 for v in values):
        raise ArgumentError(f"--{name} {text!r}: expected positive integers.")
    return values


def _int(text: str) -> int:
    return 2 ** int(text[2:]) if text.startswith("2^") else int(text)
