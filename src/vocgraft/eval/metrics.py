"""Text metrics for downstream tasks: chrF (via sacrebleu), ROUGE-L F, and SQuAD-style token F1.

ROUGE-L and F1 split text into Unicode words (``\\w+``, lowercased) rather than ASCII ones: the usual English-only
tokenizers (rouge-score's drops every non-ASCII character) would score Greek or Hindi output as empty. On English
text the ROUGE-L here equals rouge-score's without stemming (a test checks it). Scripts written without spaces
(Japanese, Thai) make one "word" per run of letters; score those with chrF.
"""

from __future__ import annotations

import string
import unicodedata
from collections import Counter
from collections.abc import Sequence

import regex

# ``\w`` alone leaves combining marks (Devanagari vowel signs, viramas) out of words: keep them with their letter.
# ``regex`` (a transformers dependency) knows Unicode categories; ``re`` does not.
WORD = regex.compile(r"[\w\p{M}]+")
ENGLISH_ARTICLES = {"a", "an", "the"}


def words(text: str) -> list[str]:
    """Lowercased Unicode words of ``text`` (NFC; letters, digits, underscores and combining marks)."""
    return WORD.findall(unicodedata.normalize("NFC", text).lower())


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF (character 6-grams, beta 2) as sacrebleu computes it, 0-100."""
    from sacrebleu.metrics import CHRF

    _check_pairs(hypotheses, references)
    return CHRF().corpus_score(list(hypotheses), [list(references)]).score


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence (O(len(a) x len(b)) time, O(len(b)) memory)."""
    if not a or not b:
        return 0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def rouge_l(hypothesis: str, reference: str) -> float:
    """ROUGE-L F1 (LCS of words; precision and recall weighted equally), 0-1."""
    hyp, ref = words(hypothesis), words(reference)
    common = lcs_length(hyp, ref)
    if common == 0:
        return 0.0
    precision, recall = common / len(hyp), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def _span_words(text: str, english: bool) -> list[str]:
    """SQuAD normalization: lowercase, no punctuation, no English articles, words."""
    text = "".join(ch for ch in text if ch not in string.punctuation and not unicodedata.category(ch).startswith("P"))
    found = words(text)
    return [w for w in found if w not in ENGLISH_ARTICLES] if english else found


def token_f1(prediction: str, answers: str | Sequence[str], *, english: bool = False) -> float:
    """SQuAD-style token F1 of a predicted span against the best of the gold answers, 0-1."""
    answers = [answers] if isinstance(answers, str) else list(answers)
    if not answers:
        raise ValueError("token_f1 needs at least one gold answer.")
    pred = _span_words(prediction, english)
    best = 0.0
    for answer in answers:
        gold = _span_words(answer, english)
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            precision, recall = common / len(pred), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _check_pairs(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references.")
    if not references:
        raise ValueError("no hypotheses to score.")
