"""SALT, Semantic Aware Linear Transfer (paper 001 §3): new rows projected from a target-language PLM's embeddings.

Inputs: the plan, one source matrix E_s (input embeddings, or the LM head in the head pass), and the input
embeddings E_t of a target-language PLM, ``ctx.resources["target_embeddings"]`` (``--target-plm``; ``vocgraft plm
train`` builds one offline). A PLM row belongs to the target token with the same raw vocab string
(``ctx.resources["target_plm_tokens"]``, the PLM tokenizer's tokens): in replace, with a PLM trained on the target
tokenizer, that is the identity; in expand, where the target vocabulary is the source's plus new tokens, the PLM is
trained with the *auxiliary* tokenizer, whose ids differ, and the strings pair its rows with the new tokens and
with the source tokens it also has. A caller with a bare matrix and no token list gives rows by target id.

1. **Shared tokens** are the plan's copied ids plus the whitespace-insensitive matches of
   :func:`whitespace_insensitive_overlap` (paper 001, Appendix A); a shared token's row is its source row. Those
   with a PLM row and an auxiliary vector are the *anchors* the maps are fitted on: in replace, the overlap of the
   two vocabularies; in expand, the source tokens that are also auxiliary-tokenizer (PLM) tokens.
2. **Auxiliary vectors** (Step 1): fastText on the corpus tokenized by the target tokenizer (FOCUS's
   ``train_token_vectors``, settings from ``ctx.resources["fasttext"]``, cached in
   ``ctx.resources["token_vectors"]``, where a caller may also put its own). A token seen fewer than minCount
   times gets fastText's vector from its character n-grams ("combinations of multiple subwords");
   only a token none of whose n-grams was trained has no vector.
3. **Neighbours** (Eq. 1-2): for each other new token i, sparsemax over the cosine similarities of its vector to
   the anchors'; its support is N_i.
4. **Least squares** (Eq. 3): X_i = pinv(E_t[N_i]) E_s[N_i], row_i = E_t[i] X_i: the paper's plain linear map.
   ``salt-centered`` (salt_centered.py) is our variant that fits it on centered spaces; why it exists is
   documented there.

Computing it: row_i = (E_t[i] pinv(E_t[N_i])) E_s[N_i] = c_i E_s[N_i], so the d_t x d_s matrix X_i is never formed;
the |N_i| coefficients c_i depend on E_t and the neighbours only. Tokens are grouped by |N_i|; each group's
pseudo-inverses come from the Gram matrices E_t[N] E_t[N]^T (float64): batched Cholesky, eigh where needed. The
coefficients of all tokens form one sparse ``[new, source]`` matrix, cached in ``ctx.resources``, so the head pass
of an untied model is one sparse product with the head matrix (head rows come from head rows, never from input
embeddings).

Fallbacks (each counted in ``ctx.resources["salt_stats"]``):

- no auxiliary vector (not even from n-grams), no PLM row (expand: an intermediate piece the auxiliary tokenizer
  does not have), or no anchor at all: Random (per-dimension normal of E_s, as the paper says, seeded by
  ``ctx.generator()``: the same rows Random would give those tokens);
- |N_i| = 1: the neighbour's source row. One pair (e, s) only fixes X along e, so E_t[i] X = (E_t[i]·e / |e|^2) s, a
  rescaled, possibly sign-flipped neighbour row whose scale is arbitrary: the row itself is the safe reading;
- degenerate fits (E_t[i] (numerically) orthogonal to its neighbours' E_t rows, which would give a zero row, or a
  non-finite solve): the sparsemax-weighted mean of the neighbours' source rows (FOCUS's row for that token).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vocgraft.init import InitContext, MethodInputError, register, source_rows
from vocgraft.init.focus import token_vectors as focus_token_vectors
from vocgraft.init.mean import target_forms
from vocgraft.init.random import random_rows
from vocgraft.init.sparsemax import sparsemax_cosine_weights
from vocgraft.plan import VocabPlan
from vocgraft.tokenization.canonical import canonical_form, canonical_tokens, default_rules

ASCII_WHITESPACE = b" \t\n\r\x0b\x0c"
MIN_EXPLAINED = 1e-3  # a fit whose projection keeps < 0.1% of |E_t[i]| is a zero row in disguise: degenerate
SOLVE_BUDGET = 1 << 22  # float64 values per batched solve (32 MB): bounds memory at any vocabulary size
_CACHE = "salt_coefficients"


class SaltInputError(MethodInputError):
    """SALT's inputs do not fit together; the message names the input to fix (the CLI reports it in one line)."""


# ------------------------------------------------------------------------------------------------------------
# shared tokens


def _strip_whitespace(form: bytes) -> bytes:
    # ASCII whitespace bytes never occur inside a multi-byte UTF-8 sequence, so deleting them keeps partial
    # characters intact (comparisons stay on bytes)
    return form.translate(None, ASCII_WHITESPACE)


def whitespace_insensitive_overlap(
    plan: VocabPlan, source_tokenizer: Any | None = None, target_tokenizer: Any | None = None
) -> dict[int, int]:
    """Extra shared tokens: new target id -> source id whose canonical bytes are equal once whitespace is removed.

    Paper 001 Appendix A counts a token as shared when its characters match whatever whitespace marker either
    tokenizer uses ("we remove all white spaces and only consider meaningful characters", like FOCUS's fuzzy
    search). ``VocabPlan`` already matches markers exactly through canonical bytes (``Ġλα`` = ``▁λα`` =
    ``b" \\xce\\xbb\\xce\\xb1"``) but keeps the leading space, so ``Ġλα`` does not match a source ``λα``; this adds
    such pairs for the ids the plan left new. Exact matches stay the plan's; special tokens and tokens that are
    only whitespace never match. Among several source candidates the one closest in length wins, then the lowest
    id (BPE: the earlier, more frequent merge).

    Whatever the plan matched stays as it is: its default (``fuzzy="symbols"``) already pairs numbers and
    punctuation across the word-start marker, and ``fuzzy="all"`` does so for every token (case-insensitively
    too, FOCUS's rule); this function then only adds tokens that differ in other whitespace (``ĊĠthe`` vs
    ``the``). Case is never ignored here: the paper removes whitespace only.
    """
    if source_tokenizer is not None:
        source_forms = canonical_tokens(source_tokenizer)
    else:
        rules = default_rules(plan.source_family)
        source_forms = [canonical_form(t, rules) if t else None for t in plan.source_tokens]
    by_key: dict[bytes, list[int]] = {}
    for sid, form in enumerate(source_forms[: len(plan.source_tokens)]):
        if form is not None:
            key = _strip_whitespace(form)
            if key:
                by_key.setdefault(key, []).append(sid)
    special = set()
    if target_tokenizer is not None:  # target specials have no canonical form: never matched by bytes
        forms = canonical_tokens(target_tokenizer)
        special = {t for t in plan.new_ids if t < len(forms) and forms[t] is None}
    new_ids = [t for t in plan.new_ids if t not in special]
    extra: dict[int, int] = {}
    for tid, form in zip(new_ids, target_forms(plan, new_ids, target_tokenizer)):
        candidates = by_key.get(_strip_whitespace(form))
        if candidates:
            extra[tid] = min(candidates, key=lambda s: (abs(len(source_forms[s]) - len(form)), s))
    return extra


# ------------------------------------------------------------------------------------------------------------
# the least-squares core


def gram_pinv_apply(gram: torch.Tensor, b: torch.Tensor, rtol: float) -> torch.Tensor:
    """``b @ pinv(gram)`` for a batch of symmetric PSD ``[g, k, k]`` matrices, with pinv's cut at ``rtol`` on
    sqrt(eigenvalue), i.e. eigenvalues <= rtol^2 * the largest count as zero.

    Fast path: Cholesky, where it provably equals pinv, i.e. every eigenvalue survives the cut. The bounds
    lambda_min >= 1 / ||L^-1||_F^2 and lambda_max <= trace(G) need no eigendecomposition; a Gram matrix they cannot
    clear (rank-deficient: more neighbours than dimensions, repeated neighbours; or badly conditioned) takes the
    exact path, an eigendecomposition (8x slower than Cholesky for k = 60).
    """
    g, k, _ = gram.shape
    out = torch.empty(g, k, dtype=gram.dtype)
    chol, info = torch.linalg.cholesky_ex(gram)
    fast = info == 0
    if fast.any():
        eye = torch.eye(k, dtype=gram.dtype).expand(int(fast.sum()), k, k)
        chol_inv = torch.linalg.solve_triangular(chol[fast], eye, upper=False)  # L^-1: G^-1 = L^-T L^-1
        lambda_min_bound = 1.0 / chol_inv.pow(2).sum(dim=(1, 2))
        lambda_max_bound = gram[fast].diagonal(dim1=1, dim2=2).sum(dim=1)
        clear = torch.isfinite(lambda_min_bound) & (lambda_min_bound > rtol**2 * lambda_max_bound)
        y = chol_inv @ b[fast].unsqueeze(2)  # b G^-1 = (L^-T L^-1 b^T)^T
        out[fast] = (chol_inv.transpose(1, 2) @ y).squeeze(2)
        fast[fast.clone()] = clear
    slow = ~fast
    if slow.any():
        eigenvalues, eigenvectors = torch.linalg.eigh(gram[slow])
        keep = eigenvalues > rtol**2 * eigenvalues[:, -1:].clamp_min(0)
        inverse = torch.where(keep, 1.0 / eigenvalues.clamp_min(1e-300), torch.zeros_like(eigenvalues))
        rotated = (b[slow].unsqueeze(1) @ eigenvectors) * inverse.unsqueeze(1)
        out[slow] = (rotated @ eigenvectors.transpose(1, 2)).squeeze(1)
    return out


def least_squares_coefficients(
    target_embeddings: torch.Tensor, queries: torch.Tensor, neighbours: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Coefficients c with E_t[q] pinv(E_t[N]) = c, for a batch of queries with the same number of neighbours.

    ``queries``: ``[g]`` target ids; ``neighbours``: ``[g, k]`` target ids. Returns (c ``[g, k]`` float64, explained
    ``[g]``: |c E_t[N]| / |E_t[q]|, the share of E_t[q] inside its neighbours' span). Row = c @ E_s[N].
    """
    a = target_embeddings[neighbours].to(torch.float64)  # [g, k, d_t]
    e = target_embeddings[queries].to(torch.float64)  # [g, d_t]
    k, d = a.shape[1], a.shape[2]
    # pinv(A) = A^T pinv(A A^T) = pinv(A^T A) A^T: the smaller of the k x k and d_t x d_t Gram matrices (usually
    # k x k: |N_i| is small next to d_t) instead of a batched SVD of the k x d_t matrices (15x slower); exact in
    # float64. Both Gram matrices have the same nonzero eigenvalues, so pinv's cut is the same.
    # singular values below float32 rounding of the stored embeddings are noise, not directions (torch.linalg.pinv's
    # rtol, for float32 data)
    rtol = torch.finfo(torch.float32).eps * max(k, d)
    if k <= d:
        b = torch.einsum("gd,gkd->gk", e, a)  # e A^T
        coef = gram_pinv_apply(a @ a.transpose(1, 2), b, rtol)
    else:  # more neighbours than dimensions: c = (e pinv(A^T A)) A^T
        coef = torch.einsum("gd,gkd->gk", gram_pinv_apply(a.transpose(1, 2) @ a, e, rtol), a)
    projection = torch.einsum("gk,gkd->gd", coef, a)  # e projected onto span(E_t[N])
    explained = projection.norm(dim=1) / e.norm(dim=1).clamp_min(1e-30)
    return coef, explained


def batched_least_squares(
    target_embeddings: torch.Tensor, queries: torch.Tensor, supports: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Least-squares coefficients for queries with neighbour sets of any size: grouped by size, chunked by memory.

    Returns (coefficients per query, aligned with ``supports``; explained ``[n]``). No Python loop over tokens:
    one batched solve per (size, chunk).
    """
    sizes = torch.tensor([len(s) for s in supports], dtype=torch.long)
    coefs: list[torch.Tensor] = [torch.empty(0, dtype=torch.float64)] * len(supports)
    explained = torch.zeros(len(supports), dtype=torch.float64)
    d = target_embeddings.shape[1]
    table = target_embeddings.to(torch.float64)  # once: gathering float64 rows is one pass, not two
    for k in sizes.unique().tolist():
        if k == 0:
            continue
        members = (sizes == k).nonzero().flatten()
        chunk = max(1, SOLVE_BUDGET // (k * d))
        for lo in range(0, len(members), chunk):
            idx = members[lo : lo + chunk]
            neigh = torch.stack([supports[i] for i in idx.tolist()])
            coef, expl = least_squares_coefficients(table, queries[idx], neigh)
            explained[idx] = expl
            for i, c in zip(idx.tolist(), coef.unbind(0)):
                coefs[i] = c
    return coefs, explained


# ------------------------------------------------------------------------------------------------------------
# inputs


@dataclass
class PlmRows:
    """E_t and where each target token's row is in it."""

    embeddings: torch.Tensor  # [rows, d_t] float32
    row_of: torch.Tensor  # [n_target] long: the PLM row of each target id, -1 where the PLM has no such token


def plm_rows(ctx: InitContext, method: str = "salt") -> PlmRows:
    """E_t from the resources, and the PLM row of each target token: by raw vocab string where the PLM's tokens
    are given (``target_plm_tokens``), else by target id (a bare matrix, whose rows must cover every new id)."""
    emb = ctx.resources.get("target_embeddings")
    if emb is None:
        raise SaltInputError(
            f"init method {method!r} needs the input embeddings of a target-language PLM whose tokenizer is the "
            "target tokenizer (replace) or the auxiliary tokenizer (expand): pass --target-plm DIR (no such model "
            "at hand? train one: `vocgraft plm train --corpus F --tokenizer T --out DIR`)."
        )
    emb = torch.as_tensor(emb).detach().to(torch.float32)
    if emb.ndim != 2:
        raise SaltInputError(f"target_embeddings must be a [tokens, hidden] matrix, got shape {tuple(emb.shape)}.")
    plan = ctx.plan
    n_target = len(plan.target_tokens)
    plm_size = ctx.resources.get("target_plm_tokenizer_size")
    usable = min(emb.shape[0], plm_size if plm_size is not None else emb.shape[0])
    plm_tokens = ctx.resources.get("target_plm_tokens")
    if plm_tokens is not None:
        index = {token: i for i, token in enumerate(plm_tokens[:usable]) if token}
        row_of = torch.tensor([index.get(token, -1) if token else -1 for token in plan.target_tokens], dtype=torch.long)
    else:
        beyond = [t for t in plan.new_ids if t >= usable]
        if beyond:
            raise SaltInputError(
                f"the target embeddings have {usable} usable rows but the target vocabulary has {n_target} tokens, "
                f"{len(beyond)} of them new (first id {beyond[0]}): rows given without the PLM's tokens are read "
                "by target id, so the PLM must use the target tokenizer."
            )
        row_of = torch.full((n_target,), -1, dtype=torch.long)
        row_of[: min(usable, n_target)] = torch.arange(min(usable, n_target))
    new_ids = torch.tensor(plan.new_ids, dtype=torch.long)
    if len(new_ids) and bool((row_of[new_ids] < 0).all()):
        raise SaltInputError(
            f"none of the {len(new_ids)} new tokens (first: {plan.target_tokens[int(new_ids[0])]!r}) is in the "
            "--target-plm vocabulary: SALT needs a PLM trained with the tokenizer the new tokens come from, the "
            "target tokenizer in replace, the auxiliary tokenizer in expand (`vocgraft plm train --tokenizer T`)."
        )
    return PlmRows(emb[:usable], row_of)


@dataclass
class _Vectors:
    ids: torch.Tensor  # target ids with a vector
    vectors: torch.Tensor  # [len(ids), dim] float32
    from_subwords: torch.Tensor  # [len(ids)] bool: the vector comes from character n-grams (below minCount)


def _as_rows(ids: Any, vectors: Any) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    vectors = torch.as_tensor(vectors).to(torch.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(ids):
        raise SaltInputError(
            f"token_vectors: {len(ids)} ids but vectors of shape {tuple(vectors.shape)}; expected one row per id."
        )
    return ids, vectors


def auxiliary_vectors(ctx: InitContext, stats: dict[str, Any], method: str = "salt") -> _Vectors:
    """fastText vectors of target tokens, trained ones and (below minCount) subword ones: from
    ``ctx.resources["token_vectors"]``, else trained on ``ctx.corpus``."""
    if ctx.resources.get("token_vectors") is None:
        if ctx.corpus is None:
            raise SaltInputError(
                f"init method {method!r} finds neighbours with fastText vectors of the target tokens, trained on the "
                "target-language corpus: pass --corpus."
            )
        stats["token_vectors_trained_here"] = True
    # FOCUS's loader: the same fastText settings (``ctx.resources["fasttext"]``, seed) and the same cache, so a run
    # of both methods, or the head pass, trains fastText once
    tv = focus_token_vectors(ctx)
    stats["token_vectors_seconds"] = round(float(getattr(tv, "seconds", 0.0) or 0.0), 3)
    ids, vectors = _as_rows(tv.ids, tv.vectors)
    sub_ids, sub_vectors = ids[:0], vectors[:0]
    if getattr(tv, "subword_ids", None) is not None and len(tv.subword_ids):
        sub_ids, sub_vectors = _as_rows(tv.subword_ids, tv.subword_vectors)
    ids, vectors = torch.cat([ids, sub_ids]), torch.cat([vectors, sub_vectors])
    from_subwords = torch.arange(len(ids)) >= len(ids) - len(sub_ids)
    # an all-zero vector has cosine 0 with everything: sparsemax would spread over every shared token
    nonzero = vectors.norm(dim=1) > 0
    return _Vectors(ids[nonzero], vectors[nonzero], from_subwords[nonzero])


# ------------------------------------------------------------------------------------------------------------
# the method


@dataclass
class SaltCoefficients:
    """Everything about a SALT run that does not depend on the source matrix (shared by input and head passes)."""

    matrix: torch.Tensor  # sparse [n_new, n_source]: row r of the result = matrix[r] @ (E_s - offset) + offset
    random_rows: list[int]  # positions in plan.new_ids that get Random rows
    stats: dict[str, Any]


def salt_coefficients(ctx: InitContext, *, center: bool = False, method: str = "salt") -> SaltCoefficients:
    """Shared tokens, neighbours and least-squares coefficients for ``ctx.plan.new_ids``.

    ``center``: fit on E_t minus its mean row (``salt-centered``); the caller then applies the coefficients to
    E_s minus its mean row and adds that mean back."""
    plan = ctx.plan
    stats: dict[str, Any] = {"centered": center}
    plm = plm_rows(ctx, method)
    target_emb = plm.embeddings - plm.embeddings.mean(dim=0) if center else plm.embeddings
    new_ids = torch.tensor(plan.new_ids, dtype=torch.long)
    n_new, n_source, n_target = len(new_ids), len(plan.source_tokens), len(plan.target_tokens)
    position = torch.full((n_target,), -1, dtype=torch.long)  # target id -> row in the result
    position[new_ids] = torch.arange(n_new)

    extra = whitespace_insensitive_overlap(plan, ctx.source_tokenizer, ctx.target_tokenizer)
    shared = {**plan.copied, **extra}  # target id -> source id
    shared_source = torch.full((n_target,), -1, dtype=torch.long)
    shared_source[list(shared)] = torch.tensor(list(shared.values()), dtype=torch.long)
    is_extra = torch.zeros(n_target, dtype=torch.bool)
    is_extra[list(extra)] = True

    aux = auxiliary_vectors(ctx, stats, method)
    start = time.perf_counter()
    keep = (aux.ids >= 0) & (aux.ids < n_target)
    vector_row = torch.full((n_target,), -1, dtype=torch.long)  # target id -> row in aux.vectors
    vector_row[aux.ids[keep]] = keep.nonzero().flatten()
    has_vector = vector_row >= 0
    has_row = plm.row_of >= 0
    shared_ids = torch.tensor(sorted(shared), dtype=torch.long)
    # shared tokens that can be neighbours: a vector to compare with and a PLM row to fit on
    anchors = shared_ids[has_row[shared_ids] & has_vector[shared_ids]]
    todo = new_ids[~is_extra[new_ids]]
    placeable = has_vector[todo] & has_row[todo]
    queries = todo[placeable] if len(anchors) else todo[:0]
    random_ids = todo[~placeable] if len(anchors) else todo
    sizes = torch.zeros(0, dtype=torch.long)
    supports: list[torch.Tensor] = []
    weights: list[torch.Tensor] = []
    if len(queries):
        sparse = sparsemax_cosine_weights(aux.vectors[vector_row[queries]], aux.vectors[vector_row[anchors]])
        index, value = sparse.indices(), sparse.values()  # coalesced: row-major, every row has >= 1 entry
        sizes = torch.bincount(index[0], minlength=len(queries))
        supports = list(anchors[index[1]].split(sizes.tolist()))  # neighbour target ids per query
        weights = list(value.split(sizes.tolist()))
    stats["similarity_seconds"] = round(time.perf_counter() - start, 3)

    start = time.perf_counter()
    multi = (sizes >= 2).nonzero().flatten()
    coefs, explained = batched_least_squares(
        target_emb, plm.row_of[queries[multi]], [plm.row_of[supports[i]] for i in multi.tolist()]
    )
    # a non-finite solve gives a NaN/inf share, which this test catches too
    bad = (~((explained >= MIN_EXPLAINED) & torch.isfinite(explained))).nonzero().flatten().tolist()
    for j in bad:  # degenerate fit: FOCUS's row, the sparsemax-weighted mean of the neighbours' source rows
        coefs[j] = weights[int(multi[j])].to(torch.float64)
    single = (sizes == 1).nonzero().flatten()
    # one sparse matrix: least-squares rows, single-neighbour rows (weight 1), whitespace-insensitive copies
    extra_ids = torch.tensor(list(extra), dtype=torch.long)
    rows = torch.cat(
        [
            position[queries[multi]].repeat_interleave(sizes[multi]),
            position[queries[single]],
            position[extra_ids],
        ]
    )
    neighbour_ids = [supports[i] for i in multi.tolist()] + [supports[i] for i in single.tolist()]
    cols = shared_source[torch.cat([*neighbour_ids, extra_ids])]
    vals = torch.cat([*coefs, torch.ones(len(single) + len(extra_ids), dtype=torch.float64)])
    matrix = torch.sparse_coo_tensor(
        torch.stack([rows, cols]), vals, (n_new, n_source), check_invariants=True
    ).coalesce()
    stats["solve_seconds"] = round(time.perf_counter() - start, 3)
    from_subwords = torch.zeros(n_target, dtype=torch.bool)
    from_subwords[aux.ids[keep]] = aux.from_subwords[keep]
    stats.update(
        {
            "new": n_new,
            "shared_exact": len(plan.copied),
            "shared_whitespace_insensitive": len(extra),
            "shared_with_plm_row": int(has_row[shared_ids].sum()),
            "anchors": len(anchors),
            "anchors_with_subword_vector": int(from_subwords[anchors].sum()),
            "queries": len(queries),
            "queries_with_subword_vector": int(from_subwords[queries].sum()),
            "least_squares": len(multi) - len(bad),
            "single_neighbour": len(single),
            "degenerate_fallback": len(bad),
            "random_fallback": len(random_ids),
            # why (a token may lack both): no fastText vector even from n-grams / no row in the PLM
            "no_vector": int((~has_vector[todo]).sum()),
            "no_plm_row": int((~has_row[todo]).sum()),
            "neighbours_mean": round(float(sizes.float().mean()), 3) if len(sizes) else 0.0,
            "neighbours_max": int(sizes.max()) if len(sizes) else 0,
            "explained_median": round(float(explained.median()), 4) if len(explained) else None,
        }
    )
    return SaltCoefficients(matrix, position[random_ids].tolist(), stats)


def _key(ctx: InitContext, center: bool) -> tuple:
    resources = ctx.resources
    return id(ctx.plan), id(resources.get("target_embeddings")), id(resources.get("token_vectors")), center


def _cached_coefficients(ctx: InitContext, center: bool, method: str) -> SaltCoefficients:
    # the coefficients depend on the plan, E_t and the fastText vectors, not on the source matrix: computed once
    # per model, and the head pass of an untied model reuses them
    cached = ctx.resources.get(_CACHE)
    if cached is None or cached[0] != _key(ctx, center):
        coefficients = salt_coefficients(ctx, center=center, method=method)
        ctx.resources[_CACHE] = (_key(ctx, center), coefficients)  # after: training may have added "token_vectors"
        ctx.resources[stats_key(method)] = dict(coefficients.stats)
    return ctx.resources[_CACHE][1]


def stats_key(method: str) -> str:
    """Where a SALT method leaves its statistics: ``salt_stats``, ``salt_centered_stats``."""
    return method.replace("-", "_") + "_stats"


def salt_rows(source_matrix: torch.Tensor, ctx: InitContext, *, center: bool, method: str) -> torch.Tensor:
    """The rows of ``ctx.plan.new_ids`` in the space of ``source_matrix`` (the body of ``salt`` and
    ``salt-centered``)."""
    src = source_rows(source_matrix, ctx)
    coefficients = _cached_coefficients(ctx, center, method)
    start = time.perf_counter()
    src = src.to(torch.float64)
    offset = src.mean(dim=0) if center else torch.zeros_like(src[0])
    out = (torch.sparse.mm(coefficients.matrix, src - offset) + offset).to(torch.float32)
    if coefficients.random_rows:  # the rows Random would give these tokens, from this space's statistics
        out[coefficients.random_rows] = random_rows(source_matrix, ctx)[coefficients.random_rows]
        if ctx.space == "input":  # once per model, not again for the head
            s = coefficients.stats
            warnings.warn(
                f"{method}: {len(coefficients.random_rows)} of {len(ctx.plan.new_ids)} new tokens get Random rows "
                f"({s['no_vector']} without a fastText vector, even from character n-grams; {s['no_plm_row']} not "
                f"in the target PLM's vocabulary; {s['anchors']} anchors).",
                stacklevel=3,
            )
    stats = ctx.resources.setdefault(stats_key(method), dict(coefficients.stats))
    stats[f"{ctx.space}_rows_seconds"] = round(time.perf_counter() - start, 3)
    return out


@register(
    "salt",
    needs=("corpus", "target_plm"),
    summary="per-token least-squares map from a target PLM's embeddings, fitted on sparsemax neighbours",
    reference="paper 001 §3 (SALT)",
)
def salt(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    return salt_rows(source_matrix, ctx, center=False, method="salt")
