"""Sparsemax (Martins & Astudillo, 2016) and block-wise cosine-similarity neighbour weights.

Stable API (FOCUS and SALT import these):

- :func:`sparsemax` ``(scores, dim=-1) -> Tensor``: the exact Euclidean projection of ``scores`` onto the
  probability simplex along ``dim``, batched over the other dimensions, by sorting. Outputs are >= 0, sum to 1
  along ``dim`` and are exactly 0 where a score is at or below the threshold tau.
- :func:`sparsemax_cosine_weights` ``(queries, keys, block_size=1024) -> torch.sparse_coo_tensor``: for every
  query row, sparsemax over its cosine similarities to all key rows, as a sparse ``[n_queries, n_keys]`` matrix
  (coalesced, float32). Only ``block_size x n_keys`` similarities exist at any time, never
  ``n_queries x n_keys`` (50K x 50K floats is 10 GB). ``weights @ key_values`` (``torch.sparse.mm``) is then the
  sparsemax-weighted mean of the keys' values for every query. ``return_similarities=True`` also returns the
  cosine similarities at the same (query, key) positions, as a sparse matrix with the same indices.

Ties: keys whose score equals tau exactly get weight 0 (as in the closed form); keys tied above tau share it.
"""

from __future__ import annotations

import torch

__all__ = ["sparsemax", "sparsemax_threshold", "sparsemax_cosine_weights", "cosine_normalize"]

TOPK = 128  # candidates tried before a full sort: sparsemax supports over cosine similarities are small


def sparsemax_threshold(sorted_desc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tau, support size) from scores sorted in descending order along the last dimension.

    The support size is k(z) = max{k : 1 + k z_(k) > sum_{j<=k} z_(j)}; the condition holds for k = 1..k(z)
    and for no k after it, so counting where it holds gives k(z). tau = (sum_{j<=k(z)} z_(j) - 1) / k(z).
    """
    k = torch.arange(1, sorted_desc.shape[-1] + 1, dtype=sorted_desc.dtype, device=sorted_desc.device)
    cumsum = sorted_desc.cumsum(dim=-1)
    support = (1 + k * sorted_desc > cumsum).sum(dim=-1, keepdim=True)  # >= 1: k = 1 always holds
    tau = (cumsum.gather(-1, support - 1) - 1) / support.to(sorted_desc.dtype)
    return tau, support


def sparsemax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Exact sparsemax of ``scores`` along ``dim`` (any batch shape): max(z - tau, 0), summing to 1."""
    z = scores.movedim(dim, -1)
    if z.shape[-1] == 0:
        raise ValueError("sparsemax over an empty dimension is undefined.")
    tau, _ = sparsemax_threshold(z.sort(dim=-1, descending=True).values)
    return (z - tau).clamp_min(0).movedim(-1, dim)


def _block_threshold(scores: torch.Tensor, topk: int = TOPK) -> torch.Tensor:
    """tau per row of a 2-D block: from the top-``topk`` scores where the support fits in them, else a full sort.

    Exact either way: if the support condition fails at some k <= topk, k(z) < topk is fully determined by the
    top ``topk`` sorted values; only rows whose support could be larger are sorted in full.
    """
    n = scores.shape[1]
    if n <= topk:
        return sparsemax_threshold(scores.sort(dim=1, descending=True).values)[0]
    top = scores.topk(topk, dim=1, sorted=True).values
    tau, support = sparsemax_threshold(top)
    full = (support.squeeze(1) == topk).nonzero().flatten()
    if len(full):  # rare: a very flat row; sort just those rows completely
        tau[full] = sparsemax_threshold(scores[full].sort(dim=1, descending=True).values)[0]
    return tau


def cosine_normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Rows scaled to unit L2 norm in float32 (an all-zero row stays zero: cosine 0 with everything)."""
    x = x.to(torch.float32)
    return x / x.norm(dim=1, keepdim=True).clamp_min(eps)


def sparsemax_cosine_weights(
    queries: torch.Tensor,
    keys: torch.Tensor,
    block_size: int = 1024,
    *,
    return_similarities: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sparse ``[n_queries, n_keys]`` matrix: row i = sparsemax(cos(queries[i], keys)); optionally the cosines.

    Computed in float32, ``block_size`` query rows at a time, so peak memory is about
    ``block_size * n_keys * 4`` bytes (plus the nonzeros). The nonzeros of each row sum to 1.
    """
    if queries.ndim != 2 or keys.ndim != 2 or queries.shape[1] != keys.shape[1]:
        raise ValueError(
            f"queries and keys must be 2-D with the same width; got {tuple(queries.shape)} and {tuple(keys.shape)}."
        )
    if keys.shape[0] == 0:
        raise ValueError("sparsemax_cosine_weights needs at least one key vector.")
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}.")
    q, k = cosine_normalize(queries), cosine_normalize(keys)
    kt = k.T.contiguous()
    rows, cols, weights, sims = [], [], [], []
    for lo in range(0, q.shape[0], block_size):
        scores = q[lo : lo + block_size] @ kt  # the only dense block: block_size x n_keys
        weight = (scores - _block_threshold(scores)).clamp_min(0)
        r, c = weight.nonzero(as_tuple=True)
        rows.append(r + lo)
        cols.append(c)
        weights.append(weight[r, c])
        if return_similarities:
            sims.append(scores[r, c])
    index = torch.stack([torch.cat(rows), torch.cat(cols)]) if rows else torch.zeros(2, 0, dtype=torch.long)
    shape = (q.shape[0], k.shape[0])

    def sparse(values: list[torch.Tensor]) -> torch.Tensor:
        data = torch.cat(values) if values else torch.zeros(0)
        # nonzero() yields row-major order without duplicates, so the tensor is coalesced as built
        return torch.sparse_coo_tensor(index, data, shape, is_coalesced=True, check_invariants=True)

    out = sparse(weights)
    return (out, sparse(sims)) if return_similarities else out
