"""FOCUS initialization (Dobler & de Melo, 2023; paper 002 §2 and Appendix B).

1. fastText vectors for the target tokens, trained on ``ctx.corpus`` tokenized by the target tokenizer
   (:mod:`vocgraft.init.token_vectors`; paper settings dim 300, 3 epochs, minCount 10, overridable through
   ``ctx.resources["fasttext"]``). They are cached in ``ctx.resources["token_vectors"]`` so an untied model's head
   pass reuses them; a caller may also put its own :class:`TokenVectors` there.
2. Overlapping tokens are the plan's copied target ids (canonical *byte* forms, FOCUS Appendix B). Those with a
   vector are the keys; each key brings its own source row ``source_matrix[plan.copied[t]]``.
3. Each new token with a vector gets sparsemax over its cosine similarities to the keys, and its row is the
   sparsemax-weighted mean of the keys' source rows (computed in row blocks, never |new| x |keys| at once).
4. New tokens without a vector get Random rows (per-dimension normal of the source rows, ``ctx.generator()``):
   exactly the rows the ``random`` method gives them.

``ctx.resources["focus_stats"]``: fallback_share (new tokens that got Random rows / n_new), n_new, n_with_vector
(new tokens with a fastText vector), n_keys (overlapping tokens with one), fasttext_seconds.

Choices of the official ``deepfocus`` package (1.0.1) that the paper does not state, and what we do:
  * overlapping tokens without a fastText vector are not keys, and a token whose vector is all zeros counts as
    having none: matched.
  * fastText words are the tokens' raw vocab strings (``Ġλ``), one corpus line per sentence: matched.
  * similarities and weights in float64 (fastdist, entmax): we use float32; rows agree to ~1e-6.
  * fastText CBOW with 10 negatives and dim 100 by default: we follow the paper (fastText defaults, i.e.
    skip-gram with 5 negatives, dim 300); ``ctx.resources["fasttext"] = {"model": "cbow", "dim": 100}`` mimics
    deepfocus.
  * Random statistics over every matrix row, padding included: we use real source tokens only (as ``random``).
  * expansion (``extend_tokenizer``): deepfocus trains fastText on the language-specific tokenizer's output and
    uses only overlapping tokens in that tokenizer as keys; we train on the expanded target tokenizer's output,
    so the keys are the source tokens that still occur (>= minCount) in target-language text.
  * which tokens overlap is the plan's business, not this module's. deepfocus's default is exact matches only;
    the plan's default (``fuzzy="symbols"``) also copies numbers/punctuation/whitespace across a word-start
    marker (deepfocus's ``match_symbols``); ``VocabPlan.from_tokenizers(..., fuzzy=False)`` is deepfocus's default.
  * overlap by *decoded strings*: a bug we do not copy. Every partial-UTF-8 byte token decodes to U+FFFD and
    every whitespace-only token to "" (or "▁" after a ``Ġ``), and among equal forms deepfocus takes the source
    token with the *highest* id: with SmolLM2 as the source, ``Î`` and ``Ï`` both get the row of ``æĭ`` and the
    newline ``Ċ`` that of a newline followed by 50 spaces. We compare canonical byte strings (the plan), so each
    keeps its own source row. Given deepfocus's own overlap, this module reproduces its rows (within ~5e-6).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch

from vocgraft.init import InitContext, check_source_matrix, register
from vocgraft.init.random import random_rows
from vocgraft.init.sparsemax import sparsemax_cosine_weights
from vocgraft.init.token_vectors import TokenVectors, train_token_vectors

BLOCK_SIZE = 1024  # new tokens per similarity block: 1024 x 50K keys x 4 bytes = 200 MB at most
# paper, Appendix B; trained on every core (fastText's own default is 12 threads: training is the slow part of
# FOCUS and SALT). Threads race on the shared weights, so vectors differ slightly from run to run; set
# resources["fasttext"]["threads"] = 1 for vectors that are the same for a seed.
FASTTEXT_DEFAULTS: dict[str, Any] = {"dim": 300, "epochs": 3, "min_count": 10, "threads": os.cpu_count() or 1}


def token_vectors(ctx: InitContext) -> TokenVectors:
    """The target tokens' fastText vectors, trained once per context (shared by the input and head passes)."""
    cached = ctx.resources.get("token_vectors")
    if cached is not None:
        return cached
    if ctx.corpus is None:
        raise ValueError(
            "init method 'focus' needs a corpus to train fastText on: pass the target-language text (--corpus)."
        )
    params = {**FASTTEXT_DEFAULTS, "seed": ctx.seed, **ctx.resources.get("fasttext", {})}
    vectors = train_token_vectors(ctx.target_tokenizer, ctx.corpus, **params)
    ctx.resources["token_vectors"] = vectors
    return vectors


def _vector_index(vectors: TokenVectors, n_target: int) -> np.ndarray:
    """Row of each target id in ``vectors.vectors``, -1 where it has none (unseen, out of range or all zeros)."""
    ids = np.asarray(vectors.ids, dtype=np.int64)  # also takes tensors (a caller's own vectors)
    where = np.full(n_target, -1, dtype=np.int64)
    usable = (ids >= 0) & (ids < n_target) & np.any(np.asarray(vectors.vectors) != 0, axis=1)
    where[ids[usable]] = np.flatnonzero(usable)
    return where


def focus_rows(
    source_matrix: torch.Tensor,
    plan: Any,
    vectors: TokenVectors,
    *,
    block_size: int = BLOCK_SIZE,
) -> tuple[torch.Tensor, np.ndarray, int]:
    """FOCUS rows for the new ids that have a vector.

    Returns (rows ``[len(positions), hidden]``, positions of those ids in ``plan.new_ids``, number of keys).
    No keys (no overlapping token has a vector) gives no rows: everything falls back.
    """
    new_ids = np.asarray(plan.new_ids, dtype=np.int64)
    where = _vector_index(vectors, len(plan.target_tokens))
    copied_t = np.fromiter(plan.copied.keys(), dtype=np.int64, count=len(plan.copied))
    copied_s = np.fromiter(plan.copied.values(), dtype=np.int64, count=len(plan.copied))
    order = np.argsort(copied_t)  # keys in target-id order, like deepfocus (order only matters for ties)
    copied_t, copied_s = copied_t[order], copied_s[order]
    is_key = where[copied_t] >= 0
    key_t, key_s = copied_t[is_key], copied_s[is_key]
    positions = np.flatnonzero(where[new_ids] >= 0)
    hidden = source_matrix.shape[1]
    if len(key_t) == 0 or len(positions) == 0:  # nothing to compare with, or nothing to compare
        return torch.zeros(0, hidden, device=source_matrix.device), np.zeros(0, dtype=np.int64), len(key_t)
    table = torch.as_tensor(np.asarray(vectors.vectors, dtype=np.float32))
    queries = table[torch.from_numpy(where[new_ids[positions]])]
    keys = table[torch.from_numpy(where[key_t])]
    weights = sparsemax_cosine_weights(queries, keys, block_size=block_size)
    key_rows = source_matrix[torch.from_numpy(key_s).to(source_matrix.device)].to(torch.float32)  # only the keys
    return torch.sparse.mm(weights.to(source_matrix.device), key_rows), positions, len(key_t)


@register(
    "focus",
    needs=("corpus",),
    summary="sparsemax-weighted mean of overlapping tokens' rows by fastText similarity",
    reference="paper 002 §2 (FOCUS)",
)
def focus(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    """FOCUS rows for ``ctx.plan.new_ids``; new tokens without a fastText vector get Random rows."""
    check_source_matrix(source_matrix, ctx)
    vectors = token_vectors(ctx)
    rows, positions, n_keys = focus_rows(source_matrix, ctx.plan, vectors)
    out = random_rows(source_matrix, ctx)  # the fallback rows, drawn for every new id so each matches Random
    out[torch.from_numpy(positions)] = rows
    n_new = len(ctx.plan.new_ids)
    fallback = n_new - len(positions)
    where = _vector_index(vectors, len(ctx.plan.target_tokens))
    ctx.resources["focus_stats"] = {
        "fallback_share": fallback / n_new if n_new else 0.0,
        "n_new": n_new,
        "n_with_vector": int((where[np.asarray(ctx.plan.new_ids, dtype=np.int64)] >= 0).sum()),
        "n_keys": n_keys,
        "fasttext_seconds": vectors.seconds,
    }
    if fallback and ctx.space == "input":  # once per model, not again for the head
        reason = "no overlapping token has a fastText vector" if n_keys == 0 else "they have no fastText vector"
        warnings.warn(
            f"focus: {fallback} of {n_new} new tokens get Random rows ({reason}; a token needs minCount "
            "occurrences in the corpus to get one).",
            stacklevel=2,
        )
    return out
