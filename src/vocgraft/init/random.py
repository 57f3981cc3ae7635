"""Random initialization: each new row drawn from a per-dimension normal N(mean_j, std_j) of the source rows.

The common baseline (paper 000 §3.2): independent dimensions, so it keeps the scale of the source matrix but
none of its correlations (that is Multivariate). Statistics are over real source tokens only, never padding
rows. It is also the papers' fallback for Merge (and through it Align) where a token has no merge path.
"""

from __future__ import annotations

import torch

from vocgraft.init import InitContext, register, source_rows


def normal_rows(rows: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` rows from N(mean_j, std_j) of ``rows`` (the real source rows), one independent normal per dimension."""
    mean, std = rows.mean(dim=0), rows.std(dim=0)
    noise = torch.randn(n, rows.shape[1], generator=generator)
    return mean + std * noise


@register(
    "random",
    summary="per-dimension normal N(mean, std) of the source rows",
    reference="paper 000 §3.2 (Random)",
)
def random_rows(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    return normal_rows(source_rows(source_matrix, ctx), len(ctx.plan.new_ids), ctx.generator())
