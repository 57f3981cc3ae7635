"""Multivariate initialization: new rows drawn from N(mean, covariance) of the source rows.

What ``transformers``' ``resize_token_embeddings(mean_resizing=True)`` does, but with the real covariance:
that function scales it by 1e-9, which makes every new row (almost) the mean. Statistics are over real source
tokens.
"""

from __future__ import annotations

import torch

from vocgraft.init import InitContext, register, source_rows


def covariance_factor(cov: torch.Tensor) -> torch.Tensor:
    """A matrix L with L @ L.T == cov (to rounding), for a symmetric positive *semi*-definite ``cov``.

    Cholesky first; a covariance from fewer rows than dimensions is singular, so retry with a small diagonal
    jitter, and as a last resort use the eigen-decomposition with negative eigenvalues (rounding) clipped to
    zero.
    """
    scale = float(cov.diagonal().mean().clamp_min(1e-12))
    eye = torch.eye(cov.shape[0], dtype=cov.dtype)
    for jitter in (0.0, 1e-10, 1e-8, 1e-6):
        factor, info = torch.linalg.cholesky_ex(cov + jitter * scale * eye)
        if int(info) == 0:
            return factor
    values, vectors = torch.linalg.eigh(cov)
    return vectors * values.clamp_min(0).sqrt()


def mean_and_covariance(rows: torch.Tensor, block: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased covariance in float64, over row blocks (a 150K x 4096 float64 copy is 5 GB)."""
    mean = rows.to(torch.float64).mean(dim=0) if rows.shape[0] <= block else _blocked_mean(rows, block)
    cov = torch.zeros(rows.shape[1], rows.shape[1], dtype=torch.float64)
    for start in range(0, rows.shape[0], block):
        centered = rows[start : start + block].to(torch.float64) - mean
        cov += centered.T @ centered
    return mean, cov / max(rows.shape[0] - 1, 1)


def _blocked_mean(rows: torch.Tensor, block: int) -> torch.Tensor:
    total = torch.zeros(rows.shape[1], dtype=torch.float64)
    for start in range(0, rows.shape[0], block):
        total += rows[start : start + block].to(torch.float64).sum(dim=0)
    return total / rows.shape[0]


@register(
    "multivariate",
    summary="normal N(mean, covariance) of the source rows",
    reference="paper 001 §4 baseline (transformers' mean_resizing, with the real covariance)",
)
def multivariate_rows(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    mean, cov = mean_and_covariance(source_rows(source_matrix, ctx))
    factor = covariance_factor(cov)
    noise = torch.randn(len(ctx.plan.new_ids), cov.shape[0], generator=ctx.generator(), dtype=torch.float64)
    return (mean + noise @ factor.T).to(torch.float32)
