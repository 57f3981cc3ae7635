"""Static token vectors for FOCUS: fastText trained on a corpus tokenized by the target tokenizer.

Each corpus line becomes one sentence whose words are the line's tokens, spelled as their raw vocab strings
(``Ġλ``): the same words the official ``deepfocus`` feeds fastText (``tokenizer.tokenize``), so fastText's
character n-grams run over the same strings. Special tokens are dropped (they are not text).

Library: gensim's ``FastText`` (a maintained reimplementation of fastText with wheels). On 32,768 Greek lines
(548K tokens, dim 300, 3 epochs, 2 threads) it trained skip-gram in 41-75 s against 73-113 s for the
``fasttext-wheel`` C++ binding on this machine; it also takes a seed, trains from memory (no temp file) and is
bit-for-bit reproducible with one thread. Hyper-parameters are fastText's ``train_unsupervised`` defaults (lr
0.05 decayed to 0, window 5, 5 negatives, subsampling 1e-4, char n-grams 3-6, 2M buckets) except those the
FOCUS paper sets (Appendix B: dim 300, 3 epochs, minCount 10).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vocgraft.plan import raw_tokens

MAX_WORDS = 1024  # fastText reads at most this many words per line and continues with the rest as a new one
MODELS = ("skipgram", "cbow")


@dataclass
class TokenVectors:
    """fastText vectors for the target ids that got one (seen at least ``min_count`` times), and, apart from
    them, subword vectors for the other target tokens (``subword_ids``/``subword_vectors``, see
    :func:`subword_vectors`). FOCUS reads only the first kind (paper 002: rare tokens get Random rows); SALT reads
    both (paper 001 §3, Step 1)."""

    ids: np.ndarray  # [n] int64 target ids, ascending
    vectors: np.ndarray  # [n, dim] float32, row i belongs to ids[i]
    seconds: float = 0.0  # tokenization + training time
    subword_ids: np.ndarray | None = None  # [m] int64 target ids below minCount with a subword vector, ascending
    subword_vectors: np.ndarray | None = None  # [m, dim] float32

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids, dtype=np.int64)
        self.vectors = np.asarray(self.vectors, dtype=np.float32)
        if self.vectors.ndim != 2 or len(self.ids) != len(self.vectors):
            raise ValueError(f"TokenVectors: {len(self.ids)} ids but vectors of shape {self.vectors.shape}.")
        dim = self.vectors.shape[1]
        self.subword_ids = np.asarray(self.subword_ids if self.subword_ids is not None else [], dtype=np.int64)
        self.subword_vectors = np.asarray(
            self.subword_vectors if self.subword_vectors is not None else np.zeros((0, dim)), dtype=np.float32
        )
        if self.subword_vectors.ndim != 2 or len(self.subword_ids) != len(self.subword_vectors):
            raise ValueError(
                f"TokenVectors: {len(self.subword_ids)} subword ids but vectors of shape {self.subword_vectors.shape}."
            )
        if np.intersect1d(self.ids, self.subword_ids).size:
            raise ValueError("TokenVectors: a target id has both a trained and a subword vector.")


class _Sentences:
    """Restartable iterable of word lists (gensim reads the corpus once per epoch plus once for the vocab)."""

    def __init__(self, ids: np.ndarray, bounds: np.ndarray, words: Sequence[str]) -> None:
        self.ids, self.bounds, self.words = ids, bounds, words

    def __iter__(self) -> Iterator[list[str]]:
        words, ids = self.words, self.ids.tolist()
        for a, b in zip(self.bounds[:-1].tolist(), self.bounds[1:].tolist()):
            yield [words[i] for i in ids[a:b]]


def tokenize_corpus(tokenizer: Any, lines: Iterable[str], batch_lines: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """Flat token ids (special tokens dropped) and sentence bounds, lines longer than MAX_WORDS split."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"FOCUS needs a fast tokenizer (tokenizer.json); got {type(tokenizer).__name__}.")
    special = np.asarray(sorted(set(getattr(tokenizer, "all_special_ids", []) or [])), dtype=np.int64)
    chunks: list[np.ndarray] = []
    lengths: list[int] = []
    batch: list[str] = []

    def flush() -> None:
        for enc in backend.encode_batch(batch, add_special_tokens=False):
            ids = np.asarray(enc.ids, dtype=np.int64)
            ids = ids[~np.isin(ids, special)]
            if len(ids):
                chunks.append(ids)
                full, rest = divmod(len(ids), MAX_WORDS)
                lengths.extend([MAX_WORDS] * full + ([rest] if rest else []))
        batch.clear()

    for line in lines:
        if line.strip():
            batch.append(line)
            if len(batch) == batch_lines:
                flush()
    if batch:
        flush()
    ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return ids, bounds


def train_token_vectors(
    tokenizer: Any,
    lines: Iterable[str],
    *,
    dim: int = 300,
    epochs: int = 3,
    min_count: int = 10,
    seed: int = 0,
    threads: int = 2,
    model: str = "skipgram",
    bucket: int = 2_000_000,
) -> TokenVectors:
    """fastText vectors for the tokens of ``tokenizer`` that occur at least ``min_count`` times in ``lines``.

    Deterministic for a seed with ``threads=1`` (more threads race on the shared weights, as in fastText).
    ``model="cbow"`` with ``dim=100`` reproduces what deepfocus trains by default.
    """
    try:
        from gensim.models import FastText
    except ImportError as exc:  # an optional dependency: only FOCUS needs it
        raise ImportError("FOCUS trains fastText with gensim: pip install 'vocgraft[focus]'.") from exc
    if model not in MODELS:
        raise ValueError(f"fastText model must be one of {MODELS}, got {model!r}.")
    t0 = time.perf_counter()
    ids, bounds = tokenize_corpus(tokenizer, lines)
    words = raw_tokens(tokenizer)
    if len(ids) == 0:
        return TokenVectors(np.zeros(0, np.int64), np.zeros((0, dim), np.float32), time.perf_counter() - t0)
    counts = np.bincount(ids, minlength=len(words))
    if counts.max() < min_count:  # gensim refuses an empty vocabulary; no token has a vector
        return TokenVectors(np.zeros(0, np.int64), np.zeros((0, dim), np.float32), time.perf_counter() - t0)
    ft = FastText(
        sentences=_Sentences(ids, bounds, words),
        sg=int(model == "skipgram"),
        vector_size=dim,
        epochs=epochs,
        min_count=min_count,
        seed=seed,
        workers=max(1, threads),
        # fastText's train_unsupervised defaults where gensim's differ
        alpha=0.05,
        min_alpha=0.0,
        sample=1e-4,
        window=5,
        negative=5,
        min_n=3,
        max_n=6,
        bucket=bucket,
    )
    # gensim's in-vocabulary vectors already average the word's own vector with its n-grams' (as fastText's
    # get_word_vector does); reorder them from gensim's frequency order to ascending target ids
    index = {w: i for i, w in enumerate(words) if w}
    tids = np.fromiter((index[w] for w in ft.wv.index_to_key), dtype=np.int64, count=len(ft.wv.index_to_key))
    order = np.argsort(tids)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    rare = [i for i, w in enumerate(words) if w and i not in special and w not in ft.wv.key_to_index]
    sub_ids, sub_vectors = subword_vectors(ft.wv, [words[i] for i in rare])
    return TokenVectors(
        tids[order],
        ft.wv.vectors[order],
        time.perf_counter() - t0,
        subword_ids=np.asarray(rare, dtype=np.int64)[sub_ids],
        subword_vectors=sub_vectors,
    )


def subword_vectors(wv: Any, words: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """fastText vectors of out-of-vocabulary ``words`` from their character n-grams: (positions in ``words`` that
    got one, ``[len(positions), dim]`` float32).

    The vector is fastText's ``get_word_vector`` of an unknown word: the mean of the vectors of its n-grams' hash
    buckets. A word only gets one when at least one of those buckets was trained, i.e. belongs to an n-gram of a
    word seen ``min_count`` times (fastText trains nothing else: rarer words are dropped from the corpus); a word
    whose every bucket is still at its random initial value "cannot be formed via subword combinations" (paper
    001 §3, Step 1) and gets none, rather than a vector of noise. Hash collisions count as trained, as in fastText.
    """
    from gensim.models.fasttext import ft_ngram_hashes

    dim = wv.vectors_ngrams.shape[1] if wv.bucket else wv.vector_size
    if not words or wv.bucket == 0:
        return np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.float32)
    trained = np.zeros(wv.bucket, dtype=bool)
    for buckets in wv.buckets_word:
        trained[np.asarray(buckets, dtype=np.int64)] = True
    positions: list[int] = []
    rows: list[np.ndarray] = []
    for position, word in enumerate(words):
        buckets = np.asarray(ft_ngram_hashes(word, wv.min_n, wv.max_n, wv.bucket), dtype=np.int64)
        if len(buckets) and trained[buckets].any():
            positions.append(position)
            rows.append(wv.vectors_ngrams[buckets].mean(axis=0))
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.float32)
    return np.asarray(positions, dtype=np.int64), np.stack(rows).astype(np.float32)
