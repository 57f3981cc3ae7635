"""Generation health: counters that catch the degenerate output a small model writes, before any score is read
from it (loops, broken UTF-8, stopping after a word).

- ``eos_stop_rate``: share of generations that ended with a stop id (EOS) instead of running to ``max_new_tokens``.
- ``mean_new_tokens`` (stop ids not counted) and ``mean_chars`` of the text.
- ``repeated_char_ngram_share``: of all character n-grams (n = 8 by default) of a generation, the share that repeat
  an n-gram seen earlier in the same generation (seq-rep-n of Welleck et al. 2019, over characters), pooled over
  generations (repeats / n-grams). Characters, not tokens, so that vocabularies compare: a token 4-gram of a
  vocabulary with longer tokens covers more text. With n = 8, natural text stays low (0.02-0.06 on the first 150
  characters of held-out lines in en, el, hi, ja; 0.10-0.14 with n = 4, where common syllables repeat), against
  about 0.95 for the loops seen in the review ("οχόλια, οχόλια, ..."). It grows with length for any text, so
  compare it between generations of about the same length in characters.
- ``repeated_token_ngram_share``: the same over token 4-grams (when ids are given): for one model over time, not
  across vocabularies.
- ``replacement_char_share``: share of characters that are U+FFFD (bytes that are not UTF-8: a byte-level model
  that stopped mid-character, or emitted byte pieces in a wrong order), and ``with_replacement_char``: share of
  generations holding at least one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

REPLACEMENT = "\ufffd"
CHAR_N = 8
TOKEN_N = 4


def repeated_ngrams(sequence: Sequence, n: int) -> tuple[int, int]:
    """(n-grams that occurred earlier in ``sequence``, all n-grams of it); (0, 0) when shorter than n."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    seen, repeats, total = set(), 0, 0
    for start in range(len(sequence) - n + 1):
        gram = tuple(sequence[start : start + n])
        total += 1
        repeats += gram in seen
        seen.add(gram)
    return repeats, total


def text_health(texts: Sequence[str], *, n: int = CHAR_N) -> dict:
    """The counters that need only the text (e.g. llama.cpp's output): ``generations``, ``mean_chars``,
    ``empty_share``, ``repeated_char_ngram_share`` (None when no text has n characters), ``char_ngram``,
    ``replacement_char_share``, ``with_replacement_char``."""
    if not texts:
        raise ValueError("no generations to measure.")
    chars = sum(len(t) for t in texts)
    counts = [repeated_ngrams(t, n) for t in texts]
    ngrams = sum(total for _, total in counts)
    return {
        "generations": len(texts),
        "mean_chars": chars / len(texts),
        "empty_share": sum(not t.strip() for t in texts) / len(texts),
        "repeated_char_ngram_share": sum(r for r, _ in counts) / ngrams if ngrams else None,
        "char_ngram": n,
        "replacement_char_share": sum(t.count(REPLACEMENT) for t in texts) / chars if chars else 0.0,
        "with_replacement_char": sum(REPLACEMENT in t for t in texts) / len(texts),
    }


def generation_health(
    tokenizer,
    generations: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: Collection[int] | None = None,
    texts: Sequence[str] | None = None,
    n: int = CHAR_N,
    token_n: int = TOKEN_N,
) -> dict:
    """:func:`text_health` plus the counters that need the ids: ``generations`` are the new ids of each generation
    (prompt excluded, EOS included where the model stopped, as :func:`vocgraft.eval.generation.generate_one` returns
    them); ``stop_ids`` default to the tokenizer's EOS; ``texts`` default to each generation decoded without
    special tokens (pass the texts decoded in context where the caller has them).

    Adds ``eos_stop_rate`` (last id a stop id), ``max_new_tokens``, ``mean_new_tokens`` (stop ids not counted),
    ``repeated_token_ngram_share`` (None when no generation has ``token_n`` tokens) and ``token_ngram``."""
    stops = {tokenizer.eos_token_id} if stop_ids is None else set(stop_ids)
    stops.discard(None)
    if texts is None:
        texts = [tokenizer.decode(list(ids), skip_special_tokens=True) for ids in generations]
    if len(texts) != len(generations):
        raise ValueError(f"{len(texts)} texts for {len(generations)} generations.")
    text_ids = [[t for t in ids if t not in stops] for ids in generations]
    counts = [repeated_ngrams(ids, token_n) for ids in text_ids]
    ngrams = sum(total for _, total in counts)
    return {
        **text_health(texts, n=n),
        "eos_stop_rate": sum(bool(ids) and ids[-1] in stops for ids in generations) / len(generations),
        "max_new_tokens": max_new_tokens,
        "mean_new_tokens": sum(len(ids) for ids in text_ids) / len(generations),
        "repeated_token_ngram_share": sum(r for r, _ in counts) / ngrams if ngrams else None,
        "token_ngram": token_n,
    }


def greedy_generations(model, tokenizer, prompts: Sequence[str], max_new_tokens: int) -> list[list[int]]:
    """Free greedy generations (the model may stop at EOS) of each prompt, for :func:`generation_health`."""
    from vocgraft.eval.generation import GREEDY, generate_one

    model.eval()
    return [generate_one(model, tokenizer, prompt, max_new_tokens, GREEDY) for prompt in prompts]
