"""Tokenizer-family rules of the tokenizer stage: which kind vocgraft trains for a source, what it copies from it,
and whether the combining-marks rule (``--keep-marks``) applies to the tokenizer it trains.

expand's auxiliary tokenizer, replace's default target tokenizer, the pipeline's tokenizer stage and
`vocgraft tokenizer train --like` all ask these questions; they are answered here only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vocgraft.tokenization.marks import MarksChoice, MarksError, choose_keep_marks
from vocgraft.tokenization.spec import tokenizer_family

# source family -> the kind trained for it (expand's aux tokenizer, replace's default target): the source's own
# family, so its pre-tokenization stays familiar to the model
KIND_FOR_FAMILY = {"byte-level-bpe": "bytelevel-bpe", "sentencepiece-bpe": "sp-bpe", "unigram": "sp-unigram"}


def kind_like(source_tokenizer: Any) -> str | None:
    """The kind trained for ``source_tokenizer`` by default; None for a family vocgraft trains no kind of."""
    return KIND_FOR_FAMILY.get(tokenizer_family(source_tokenizer))


def trained_like(kind: str, source_tokenizer: Any) -> Any:
    """The tokenizer a ``kind`` tokenizer trained for ``source_tokenizer`` copies its pipeline from, or None: a
    byte-level kind can copy only a byte-level source's pipeline; SentencePiece kinds take any source's
    special-token strings (and a SentencePiece source's whole layout)."""
    if kind != "bytelevel-bpe" or tokenizer_family(source_tokenizer) == "byte-level-bpe":
        return source_tokenizer
    return None


def marks_rule_applies(kind: str | None, like: Any) -> bool:
    """Does the combining-marks rule apply to a ``kind`` tokenizer trained like ``like`` (None: like nothing)?
    Only a byte-level BPE copies a split regex, which may cut marks from their letters; SentencePiece kinds keep
    marks with their letters anyway. (An expansion keeps the source's own pre-tokenizer, so there the rule is
    decided on the source itself: :func:`~vocgraft.tokenization.marks.choose_keep_marks`.)"""
    return kind == "bytelevel-bpe" and like is not None


def like_marks(setting: str, kind: str, like: Any, lines: Iterable[str]) -> MarksChoice | None:
    """`tokenizer train`: whether the copied split regex of a byte-level ``--like`` keeps combining marks; None
    where there is no such regex to copy."""
    if marks_rule_applies(kind, like):
        return choose_keep_marks(setting, like, lines)
    if setting == "on":
        raise MarksError(
            "--keep-marks on rewrites the split regex copied from --like; it needs --kind bytelevel-bpe and --like "
            "(SentencePiece kinds do not split marks from letters)."
        )
    return None
