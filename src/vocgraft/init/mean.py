"""Mean initialization (paper 000 §3.2): a new token's row is the mean of the source rows that spell it.

"Spell" is exact and byte-based: the new token's canonical bytes (leading-space marker as a space, byte tokens
as their byte) go through the source tokenizer's model (``encode_canonical``), so ``Ġλ`` averages the source
pieces of ``" λ"`` and a partial-UTF-8 token averages the source's byte pieces for exactly those bytes.

When the source cannot spell the bytes exactly (a character it has no piece and no byte fallback for), the
surface text goes through the full source tokenizer instead (unknown characters become its unk token); when
even that gives nothing, the row is the mean of all source rows. Both fallbacks are counted in a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from vocgraft.init import InitContext, check_source_matrix, gathered_product, matrix_blocks, register
from vocgraft.tokenization.canonical import (
    canonical_form,
    canonical_tokens,
    default_rules,
    encode_canonical,
    surface_text,
)


def target_forms(plan: Any, target_ids: Sequence[int], target_tokenizer: Any | None = None) -> list[bytes]:
    """Canonical bytes of the given target ids; special/added tokens use their raw string's UTF-8.

    With the target tokenizer the tokenizer's own markers are used; without it (a plan read from JSON) the
    usual markers of ``plan.target_family``.
    """
    if target_tokenizer is not None:
        forms = canonical_tokens(target_tokenizer)
        return [forms[t] if forms[t] is not None else plan.target_tokens[t].encode() for t in target_ids]
    rules = default_rules(plan.target_family)
    return [canonical_form(plan.target_tokens[t], rules) for t in target_ids]


def source_pieces(source_tokenizer: Any, form: bytes, n_source: int) -> tuple[list[int], bool]:
    """Source ids to average for one canonical form, and whether they spell it exactly.

    ([], False) when nothing usable comes out: the caller uses the centroid.
    """
    try:
        return encode_canonical(source_tokenizer, form), True
    except ValueError:
        pass
    special = set(getattr(source_tokenizer, "all_special_ids", []) or []) - {source_tokenizer.unk_token_id}
    ids = source_tokenizer(surface_text(form), add_special_tokens=False)["input_ids"]
    return [i for i in ids if i not in special and 0 <= i < n_source], False


def mean_rows(
    source_matrix: torch.Tensor,
    plan: Any,
    source_tokenizer: Any,
    target_ids: Sequence[int],
    *,
    target_tokenizer: Any | None = None,
) -> torch.Tensor:
    """Mean rows for ``target_ids`` (in that order), ``[len(target_ids), hidden]`` float32.

    One sparse averaging matrix (targets x source tokens, weight 1/len(pieces)) times the source rows it uses,
    cast to float32 (:func:`gathered_product`): no Python loop over tensor ops, no float32 copy of the whole
    matrix, on the matrix's device.
    """
    n_source = len(plan.source_tokens)
    rows: list[int] = []
    cols: list[int] = []
    weights: list[float] = []
    empty: list[int] = []
    inexact = 0
    for r, form in enumerate(target_forms(plan, target_ids, target_tokenizer)):
        pieces, exact = source_pieces(source_tokenizer, form, n_source) if form else ([], False)
        if not pieces:
            empty.append(r)
            continue
        inexact += not exact
        rows += [r] * len(pieces)
        cols += pieces
        weights += [1.0 / len(pieces)] * len(pieces)
    averaging = torch.sparse_coo_tensor(
        torch.tensor([rows, cols], dtype=torch.long).reshape(2, -1),
        torch.tensor(weights, dtype=torch.float32),
        (len(target_ids), n_source),
        check_invariants=True,  # ids out of range must fail here, not read stray memory
    ).coalesce()  # repeated pieces (``aa`` -> a, a) sum to their share
    out = gathered_product(averaging, source_matrix)
    if inexact:
        warnings.warn(
            f"mean: the source tokenizer cannot spell {inexact} of {len(target_ids)} tokens byte for byte; "
            "they average the pieces of their text under the full source tokenizer (unknown characters: unk)",
            stacklevel=2,
        )
    if empty:
        out[empty] = _centroid(source_matrix[:n_source])
        warnings.warn(
            f"mean: {len(empty)} of {len(target_ids)} tokens have no source pieces at all; they get the mean "
            "of all source rows.",
            stacklevel=2,
        )
    return out


def _centroid(matrix: torch.Tensor) -> torch.Tensor:
    """Mean of all rows in float32, over float32 row blocks (no float32 copy of the whole matrix)."""
    total = torch.zeros(matrix.shape[1], dtype=torch.float64, device=matrix.device)
    for rows in matrix_blocks(matrix):
        total += rows.sum(dim=0, dtype=torch.float64)
    return (total / max(matrix.shape[0], 1)).to(torch.float32)


@register(
    "mean",
    summary="mean of the source rows of the pieces that spell the token",
    reference="paper 000 §3.2 (Mean)",
)
def mean(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    check_source_matrix(source_matrix, ctx)
    return mean_rows(
        source_matrix, ctx.plan, ctx.source_tokenizer, ctx.plan.new_ids, target_tokenizer=ctx.target_tokenizer
    )
