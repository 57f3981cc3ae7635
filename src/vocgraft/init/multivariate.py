"""Multivariate initialization: new rows drawn from N(mean, covariance) of the source rows.

What ``transformers``' ``resize_token_embeddings(mean_resizing=True)`` does, but with the real covariance:
that function scales it by 1e-9, which makes every new row (almost) the mean. Statistics are over real source
tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from vocgraft.init import InitContext, cpu_normal, register, source_blocks


def covariance_factor(cov: torch.Tensor) -> torch.Tensor:
    """A matrix L with L @ L.T == cov (to rounding), for a symmetric positive *semi*-definite ``cov``.

    Cholesky first; a covariance from fewer rows than dimensions is singular, so retry with a small diagonal
    jitter, and as a last resort use the eigen-decomposition with negative eigenvalues (rounding) clipped to
    zero.
    """
    scale = float(cov.diagonal().mean().clamp_min(1e-12))
    eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
    for jitter in (0.0, 1e-10, 1e-8, 1e-6):
        factor, info = torch.linalg.cholesky_ex(cov + jitter * scale * eye)
        if int(info) == 0:
            return factor
    values, vectors = torch.linalg.eigh(cov)
    return vectors * values.clamp_min(0).sqrt()


def mean_and_covariance(blocks: Callable[[], Iterable[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased covariance in float64 over the row blocks ``blocks()`` yields (called twice: a mean pass,
    then a centered pass); only a block and the ``hidden x hidden`` sums are in memory (a 150K x 4096 float64
    copy would be 5 GB)."""
    total, count = None, 0
    for rows in blocks():
        part = rows.to(torch.float64).sum(dim=0)
        total, count = (part if total is None else total + part), count + rows.shape[0]
    if not count:
        raise ValueError("the source vocabulary has no tokens to take statistics over")
    mean = total / count
    cov = torch.zeros(mean.shape[0], mean.shape[0], dtype=torch.float64, device=mean.device)
    for rows in blocks():
        centered = rows.to(torch.float64) - mean
        cov += centered.T @ centered
    return mean, cov / max(count - 1, 1)


@register(
    "multivariate",
    summary="normal N(mean, covariance) of the source rows",
    reference="paper 001 §4 baseline (transformers' mean_resizing, with the real covariance)",
)
def multivariate_rows(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    mean, cov = mean_and_covariance(lambda: source_blocks(source_matrix, ctx, dtype=torch.float64))
    factor = covariance_factor(cov)
    noise = cpu_normal(ctx, (len(ctx.plan.new_ids), cov.shape[0]), cov, dtype=torch.float64)
    return (mean + noise @ factor.T).to(torch.float32)
