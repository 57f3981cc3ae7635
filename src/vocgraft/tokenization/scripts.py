"""Writing systems of a corpus and of a token, for keeping an expansion to the target language's script.

A target corpus in Hindi or Greek also carries English words (product names, code, units). Their auxiliary tokens
rank among the frequent new tokens, and adding them as merges changes how English is tokenized. Restricting
wanted tokens to the corpus's own script(s) keeps the budget for the language and English text as it was.

The script of a character is approximated by the first word of its Unicode name (``DEVANAGARI``, ``GREEK``,
``LATIN``, ``CJK``, ``HIRAGANA``, ...): Python's ``unicodedata`` has no script property, and this is exact for the
letters and marks that decide it. Digits, punctuation and spaces have no script here.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Iterable

# a script counts as the corpus's own when it has at least this share of its letters and marks; Japanese needs
# three (hiragana 39%, katakana 25%, kanji 22% in the shared corpus) while the Latin words in Hindi, Greek or
# Japanese text stay at 3-11%
DOMINANT_SHARE = 0.15


def char_script(ch: str) -> str | None:
    """The script of a letter or mark, None for digits, punctuation, spaces and symbols."""
    if unicodedata.category(ch)[0] not in "LM":
        return None
    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0] if name else None


def dominant_scripts(lines: Iterable[str], min_share: float = DOMINANT_SHARE, max_lines: int = 4000) -> set[str]:
    """Scripts holding at least ``min_share`` of the letters and marks in the first ``max_lines`` lines."""
    counts: Counter[str] = Counter()
    for i, line in enumerate(lines):
        if i >= max_lines:
            break
        counts.update(s for s in map(char_script, line) if s is not None)
    total = sum(counts.values())
    return {script for script, n in counts.items() if total and n / total >= min_share}


def in_scripts(canonical: bytes, scripts: set[str]) -> bool:
    """Whether a token's text has a letter or mark of one of ``scripts``.

    A token with no complete character (a piece of a multi-byte character) passes: it cannot occur in text of
    another script's ASCII letters, and it is mostly needed as a step towards whole characters.
    """
    text = canonical.decode("utf-8", errors="ignore")
    if not text.strip() and any(b >= 0x80 for b in canonical):
        return True
    return any(char_script(ch) in scripts for ch in text)
