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


def script_shares(lines: Iterable[str], max_lines: int = 4000) -> dict[str, float]:
    """Each script's share of the letters and marks in the first ``max_lines`` lines, largest first."""
    counts: Counter[str] = Counter()
    for i, line in enumerate(lines):
        if i >= max_lines:
            break
        counts.update(s for s in map(char_script, line) if s is not None)
    total = sum(counts.values())
    return {script: n / total for script, n in counts.most_common()}


def dominant_scripts(lines: Iterable[str], min_share: float = DOMINANT_SHARE, max_lines: int = 4000) -> set[str]:
    """Scripts holding at least ``min_share`` of the letters and marks in the first ``max_lines`` lines."""
    return {script for script, share in script_shares(lines, max_lines).items() if share >= min_share}


def parse_scripts(value: str) -> str | list[str] | None:
    """``--scripts`` / ``adapt.scripts``: ``auto`` (the corpus's dominant scripts), ``any`` (None: no restriction),
    or comma-separated script names (``greek,latin`` -> ``["GREEK", "LATIN"]``)."""
    if value in ("auto", "any"):
        return None if value == "any" else "auto"
    return [name.strip().upper() for name in value.split(",") if name.strip()]


def describe_shares(shares: dict[str, float], top: int = 3) -> str:
    """``GREEK 91%, LATIN 9%``; ``no letters`` for text without any."""
    return ", ".join(f"{script} {share:.0%}" for script, share in list(shares.items())[:top]) or "no letters"


def in_scripts(canonical: bytes, scripts: set[str]) -> bool:
    """Whether a token's text has a letter or mark of one of ``scripts``.

    A token with no complete character (a piece of a multi-byte character) passes: it cannot occur in text of
    another script's ASCII letters, and it is mostly needed as a step towards whole characters.
    """
    text = canonical.decode("utf-8", errors="ignore")
    if not text.strip() and any(b >= 0x80 for b in canonical):
        return True
    return any(char_script(ch) in scripts for ch in text)


def bytes_in_scripts(canonical: bytes, scripts: set[str]) -> list[bool]:
    """Per byte of a token's text: whether it belongs to a character of ``scripts``.

    A character cut off at the token's end (a lead byte and some continuation bytes) belongs to ``scripts`` when
    every letter or mark it could complete to does (``E0 A4`` can only become Devanagari; ``E2 80`` only general
    punctuation); continuation bytes cut off at the start could be part of any character and never count.
    """
    flags = [False] * len(canonical)
    pos = 0
    while pos < len(canonical):
        width = _utf8_width(canonical[pos])
        chunk = canonical[pos : pos + width]
        if width == 0:  # a stray continuation byte
            pos += 1
            continue
        if len(chunk) == width:
            try:
                inside = char_script(chunk.decode("utf-8")) in scripts
            except UnicodeDecodeError:
                inside, width = False, 1
        else:  # the token ends inside this character
            inside = _prefix_in_scripts(chunk, width, scripts)
        flags[pos : pos + len(chunk[:width])] = [inside] * len(chunk[:width])
        pos += width
    return flags


def _utf8_width(lead: int) -> int:
    """Bytes of the UTF-8 character that starts with ``lead``; 0 for a continuation byte."""
    if lead < 0x80:
        return 1
    if lead < 0xC0:
        return 0
    return 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


PREFIX_SCAN_LIMIT = 4096  # completions of a character prefix worth scanning (a lone 4-byte lead has 2^18)


def _prefix_in_scripts(prefix: bytes, width: int, scripts: set[str]) -> bool:
    missing = width - len(prefix)
    if 64**missing > PREFIX_SCAN_LIMIT:
        return False
    found = False
    for tail in range(64**missing):
        rest = bytes(0x80 | ((tail >> (6 * i)) & 0x3F) for i in reversed(range(missing)))
        try:
            ch = (prefix + rest).decode("utf-8")
        except UnicodeDecodeError:
            continue
        script = char_script(ch)
        if script is None:
            continue
        if script not in scripts:
            return False
        found = True
    return found
