"""Random initialization: each new row drawn from a per-dimension normal N(mean_j, std_j) of the source rows.

The common baseline (paper 000 §3.2): independent dimensions, so it keeps the scale of the source matrix but
none of its correlations (that is Multivariate). Statistics are over real source tokens only, never padding
rows.
"""

from __future__ import annotations

import torch

from vocgraft.init import InitContext, register, source_rows


@register(
    "random",
    summary="per-dimension normal N(mean, std) of the source rows",
    reference="paper 000 §3.2 (Random)",
)
def random_rows(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    rows = source_rows(source_matrix, ctx)
    mean, std = rows.mean(dim=0), rows.std(dim=0)
    noise = torch.randn(len(ctx.plan.new_ids), rows.shape[1], generator=ctx.generator())
    return mean + std * noise
