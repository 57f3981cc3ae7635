"""Parsing of command-line values shared by the argument checks (:mod:`vocgraft.preflight`) and the pipeline
(:mod:`vocgraft.pipeline`): it imports neither, so both can import it."""

from __future__ import annotations

import re

from vocgraft.errors import UserError


class ArgumentError(UserError, ValueError):
    """An argument that cannot work; the message names the flag and the fix."""


# a count of tokens or lines past an int32 is a typo; `2^0..2^100000000` asked for 10^8 settings (a list that never
# finished building) and `2^100000` crashed deep in the pipeline
MAX_VALUE = (1 << 31) - 1
MAX_EXPONENT = 30


def parse_ints(text: str, name: str) -> list[int]:
    """``50,100,500`` or ``2^10..2^15`` (every power of two in the range); ``name`` is the flag without ``--``."""
    text = text.replace(" ", "")
    span = re.fullmatch(r"2\^(\d+)\.\.2\^(\d+)", text)
    if span:
        low, high = (_exponent(group, text, name) for group in span.groups())
        if low > high:
            raise ArgumentError(f"--{name} {text}: the range is empty.")
        return [2**e for e in range(low, high + 1)]
    try:
        values = [_int(v, name) for v in text.split(",") if v]
    except ArgumentError:
        raise
    except ValueError:
        raise ArgumentError(f"--{name} {text!r}: expected integers like 50,100 or a range like 2^10..2^15.") from None
    if not values or any(v <= 0 for v in values):
        raise ArgumentError(f"--{name} {text!r}: expected positive integers.")
    if any(v > MAX_VALUE for v in values):
        raise ArgumentError(f"--{name} {text!r}: every value must be at most {MAX_VALUE:,} (2^31 - 1).")
    return values


def _exponent(digits: str, text: str, name: str) -> int:
    """The exponent of ``2^E``, at most MAX_EXPONENT: 2^100000 is a 30,000-digit number, refused before it is
    computed."""
    if not digits.isdigit():
        raise ArgumentError(f"--{name} {text!r}: expected integers like 50,100 or a range like 2^10..2^15.")
    if len(digits) > 3 or int(digits) > MAX_EXPONENT:
        raise ArgumentError(f"--{name} {text}: 2^{digits} is more than 2^{MAX_EXPONENT}; give smaller values.")
    return int(digits)


def _int(text: str, name: str) -> int:
    return 2 ** _exponent(text[2:], text, name) if text.startswith("2^") else int(text)
