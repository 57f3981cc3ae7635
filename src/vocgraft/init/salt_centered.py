"""SALT on centered spaces: our variant of paper 001's SALT (salt.py), a separately named method.

Everything is SALT's (shared tokens, auxiliary vectors with subword fallback, sparsemax neighbours, fallbacks), but
the least-squares map is fitted between the two spaces centered on their mean rows:

    row_i = mean_s + (E_t[i] - mean_t) pinv(E_t[N_i] - mean_t) (E_s[N_i] - mean_s)

where mean_t is the mean PLM row and mean_s the mean source row (of real tokens, in the space being initialized).

Why: the plain map's row is c_i E_s[N_i] with coefficients c_i = E_t[i] pinv(E_t[N_i]) that do not sum to 1
(median 0.54 on Greek), so its rows lose part of the mean row that every source embedding shares (norm 2.2 of a
typical 3.2 in SmolLM2). In a tied model that mean sets how unlikely a token is by default, and rows without it draw
probability from everywhere. Measured right after replacing SmolLM2's vocabulary with a 39K Greek one
(benchmarks/replacement.py, 200 held-out lines, PLM 100 steps, benchmarks/results/replacement.md): salt 4.04
bits/byte, salt-centered 2.18, Random 3.05, FOCUS 2.78, Mean 1.61 (uniform reference 1.45); Hindi: 5.94 vs 3.97.
The centered fit is affine: shifting every source row by v shifts every new row by v, and shifting the PLM's rows
changes nothing. A fit whose coefficients sum to 1 (one neighbour, the degenerate fallback's sparsemax weights) is
unchanged by centering.

Statistics go to ``ctx.resources["salt_centered_stats"]`` (the same fields as ``salt_stats``).
"""

from __future__ import annotations

import torch

from vocgraft.init import InitContext, register
from vocgraft.init.salt import salt_rows


@register(
    "salt-centered",
    needs=("corpus", "target_plm"),
    summary="SALT with the least-squares map fitted on mean-centered PLM and source spaces (keeps the mean row)",
    reference="variant of salt (paper 001 §3): centered spaces; see salt_centered.py",
)
def salt_centered(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    return salt_rows(source_matrix, ctx, center=True, method="salt-centered")
