"""Merge initialization (paper 000 §3.2, Algorithm 1 in its Appendix A): hierarchical means along BPE merges.

A new token made by the target tokenizer's merge ``(a, b)`` gets ``(row(a) + row(b)) / 2``, where a child that
is a copied (source) token uses its source row and a child that is itself new uses its own hierarchical mean,
computed first. So ``abcd = (ab)(cd)`` with ``ab`` and ``cd`` new is ``mean(mean(a, b), mean(c, d))``, not the
flat mean of ``a, b, c, d``.

The variant implemented, against the paper's pseudo-code:

1. Merges are the target tokenizer's ``model.merges`` (pairs, or ``"a b"`` strings in older files). The
   merge that produces a new token is the *lowest-ranked* one whose concatenation is that token. A BPE-trained
   or expanded tokenizer has exactly one; Algorithm 1 would append every such merge to ``Maps[t]`` and leaves
   open how several are averaged.
2. "Source tokens" (``V_s`` in Algorithm 1) are the plan's copied target ids: the source vocabulary in expand
   mode, the canonical overlap in replace mode. Children are looked up by raw string in the target vocabulary.
3. A new child with no merge path of its own (a new base character, or a cycle) gets its Mean row, and its
   parent is still a hierarchical mean over it. In Algorithm 1 such a parent is never mapped (its loop would
   not end).
4. A new token with no usable merge (no producing merge, a child missing from the vocabulary, Unigram or
   WordPiece targets without merges) falls back to Mean.

Computed level by level (depth in the merge tree), one vectorized gather-and-average per level.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from vocgraft.init import InitContext, register, source_rows
from vocgraft.init.mean import mean_rows
from vocgraft.tokenization.spec import tokenizer_spec

# A child reference: a source id (>= 0), or a new token's position p in plan.new_ids encoded as -(p + 1).
Ref = int


def target_merges(target_tokenizer: Any) -> tuple[list[tuple[str, str]], str | None]:
    """The target tokenizer's merges in rank order, and its continuing-subword prefix (None for none)."""
    spec = tokenizer_spec(target_tokenizer)["model"]
    if spec.get("type") != "BPE":
        return [], None
    merges = []
    for merge in spec.get("merges", []):
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if len(pair) != 2:
            raise ValueError(f"target tokenizer merge {merge!r} is not a pair of tokens.")
        merges.append((pair[0], pair[1]))
    return merges, spec.get("continuing_subword_prefix") or None


def producing_merges(
    merges: list[tuple[str, str]], vocab: dict[str, int], wanted: set[int], prefix: str | None
) -> dict[int, tuple[str, str]]:
    """For each wanted target id, the lowest-ranked merge whose result is that token."""
    found: dict[int, tuple[str, str]] = {}
    for a, b in merges:
        # with a continuing-subword prefix, (a, ##b) makes a + b: the right child's prefix is dropped
        merged = a + (b[len(prefix) :] if prefix and b.startswith(prefix) else b)
        tid = vocab.get(merged)
        if tid is not None and tid in wanted and tid not in found:
            found[tid] = (a, b)
    return found


class _Tree:
    """Resolve every new token to (left ref, right ref) or to the Mean fallback, with its depth."""

    def __init__(self, plan: Any, vocab: dict[str, int], producing: dict[int, tuple[str, str]]) -> None:
        self.plan, self.vocab, self.producing = plan, vocab, producing
        self.new_ids = plan.new_ids  # a computed property: read it once
        self.position = {tid: p for p, tid in enumerate(self.new_ids)}
        self.children: dict[int, tuple[Ref, Ref]] = {}  # position -> refs
        self.depth: dict[int, int] = {}  # position -> 0 (Mean) or 1 + deepest new child
        self._visiting: set[int] = set()
        for p in range(len(self.position)):
            self._resolve(p)

    def _ref(self, raw: str) -> tuple[Ref, int] | None:
        """(reference, depth) of a child token, or None when it is not in the target vocabulary."""
        tid = self.vocab.get(raw)
        if tid is None:
            return None
        if tid in self.plan.copied:
            return self.plan.copied[tid], 0
        p = self.position[tid]
        if p in self._visiting:  # a merge cycle: this child cannot be built from below
            return None
        return -(p + 1), self._resolve(p)

    def _resolve(self, p: int) -> int:
        if p in self.depth:
            return self.depth[p]
        self._visiting.add(p)
        tid = self.new_ids[p]
        left = right = None
        if tid in self.producing:
            a, b = self.producing[tid]
            left, right = self._ref(a), self._ref(b)
        self._visiting.discard(p)
        if left is None or right is None:
            self.depth[p] = 0
        else:
            self.children[p] = (left[0], right[0])
            self.depth[p] = 1 + max(left[1], right[1])
        return self.depth[p]


def merge_rows(source_matrix: torch.Tensor, plan: Any, source_tokenizer: Any, target_tokenizer: Any) -> torch.Tensor:
    """Rows for ``plan.new_ids`` (in that order) by hierarchical means over the target merges."""
    new_ids = plan.new_ids
    matrix = source_matrix[: len(plan.source_tokens)].detach().to(torch.float32)
    vocab = target_tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    merges, prefix = target_merges(target_tokenizer)
    tree = _Tree(plan, vocab, producing_merges(merges, vocab, set(new_ids), prefix))

    rows = torch.zeros(len(new_ids), matrix.shape[1], dtype=torch.float32)
    fallback = [p for p in range(len(new_ids)) if p not in tree.children]
    if fallback:
        rows[fallback] = mean_rows(
            matrix, plan, source_tokenizer, [new_ids[p] for p in fallback], target_tokenizer=target_tokenizer
        )
        if not merges:
            warnings.warn("merge: the target tokenizer has no BPE merges; every new token gets Mean.", stacklevel=2)
    for level in range(1, max(tree.depth.values(), default=0) + 1):
        positions = [p for p, d in tree.depth.items() if d == level]
        left = torch.tensor([tree.children[p][0] for p in positions], dtype=torch.long)
        right = torch.tensor([tree.children[p][1] for p in positions], dtype=torch.long)
        # children are at lower levels, so their rows are final by now
        rows[positions] = (_gather(matrix, rows, left) + _gather(matrix, rows, right)) / 2
    return rows


def _gather(matrix: torch.Tensor, rows: torch.Tensor, refs: torch.Tensor) -> torch.Tensor:
    out = torch.empty(len(refs), matrix.shape[1], dtype=torch.float32)
    source = refs >= 0
    out[source] = matrix[refs[source]]
    out[~source] = rows[-refs[~source] - 1]
    return out


@register(
    "merge",
    needs=("aux_tokenizer",),
    summary="hierarchical means along the merges that build the token",
    reference="paper 000 Algorithm 1 (Merge)",
)
def merge(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    source_rows(source_matrix, ctx)  # checks the matrix covers the source vocabulary
    return merge_rows(source_matrix, ctx.plan, ctx.source_tokenizer, ctx.target_tokenizer)
