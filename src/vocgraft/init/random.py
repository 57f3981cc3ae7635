"""Random initialization: each new row drawn from a per-dimension normal N(mean_j, std_j) of the source rows.

The common baseline (paper 000 §3.2): independent dimensions, so it keeps the scale of the source matrix but
none of its correlations (that is Multivariate). Statistics are over real source tokens only, never padding
rows. It is also the papers' fallback for Merge (and through it Align) where a token has no merge path.
"""

from __future__ import annotations

import torch

from vocgraft.init import InitContext, blocked_mean_std, cpu_normal, matrix_blocks, register, source_mean_std


def normal_rows(rows: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` rows from N(mean_j, std_j) of ``rows`` (the real source rows, any float dtype and device), one
    independent normal per dimension: statistics over float32 row blocks, noise drawn on the CPU (the same rows on
    every device) and moved to ``rows``' device."""
    mean, std = blocked_mean_std(lambda: matrix_blocks(rows))
    return mean + std * torch.randn(n, rows.shape[1], generator=generator).to(mean.device)


@register(
    "random",
    summary="per-dimension normal N(mean, std) of the source rows",
    reference="paper 000 §3.2 (Random)",
)
def random_rows(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    mean, std = source_mean_std(source_matrix, ctx)
    return mean + std * cpu_normal(ctx, (len(ctx.plan.new_ids), source_matrix.shape[1]), mean)
