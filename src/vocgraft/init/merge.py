"""Merge initialization (paper 000 §3.2 and Algorithm 1 in its Appendix A; paper 003 §4.3): hierarchical means
along the *auxiliary* tokenizer's BPE merges.

A token made by the merge ``(a, b)`` gets ``(row(a) + row(b)) / 2``, where a child that is a source token uses
its source row and any other child uses its own hierarchical mean, computed first. So ``abcd = (ab)(cd)`` is
``mean(mean(a, b), mean(c, d))``, not the flat mean of ``a, b, c, d``. A token made by several merges (a
SentencePiece-BPE tokenizer lists every split of a piece) gets the mean of their rows, as Algorithm 1 averages
everything it collects for a token. Tokens with no merge path get Random, the authors' fallback.

Whose merges: the auxiliary tokenizer's (``ctx.aux``), as the papers' own expanded tokenizer ranks the auxiliary
merges first. In replace mode that is the target tokenizer itself. vocgraft's expanded tokenizer instead ranks its
new merges after every source merge and builds each new token from the pieces the source leaves, so a walk over
*its* merges ends in the same pieces Mean averages. The auxiliary tree follows the auxiliary tokenizer's own
subwords: on SmolLM2 + Greek, `` και`` (``ĠÎºÎ±Î¹``) is ``ĠÎºÎ± + Î¹`` there, but ``ĠÎº + Î±Î¹`` in the expansion
and in the source's pieces; which is the point of the method.

Nodes of the tree are raw vocab strings. Expansion compares tokens as raw strings (byte-level ``Ġ`` strings, or
SentencePiece ``▁`` pieces, in the same alphabet as the source's), so a string is resolved as:

1. a source token (in replace mode: a target token the plan copies): its source row, a leaf;
2. a string some auxiliary merge produces: the mean over those merges, whether or not the string is in the
   target vocabulary (auxiliary subwords the expansion did not add are inner nodes of the tree, never rows);
3. otherwise a string one of the target tokenizer's merges produces: the expansion's *intermediate* tokens that
   are not auxiliary tokens (the expansion needed them to reach a wanted token; the auxiliary tokenizer never
   makes them), over the expanded tokenizer's merges, which Algorithm 1 names as "merge rules of T_t";
4. otherwise a single character the source has only as byte pieces (a SentencePiece source without the
   character): the mean of those pieces, a leaf. Algorithm 1 assumes every leaf is in V_s and would leave the
   character and every token above it unmapped, i.e. Random;
5. otherwise (a special token, a multi-character token no merge makes, a Unigram or WordPiece tokenizer
   without merges) it is unmapped, and so is every merge that needs it: the token gets Random
   (per-dimension normal of the source rows, seeded), as in the authors' code.

Computed level by level (depth in the tree), one sparse product per level.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from vocgraft.init import InitContext, MethodInputError, register, source_rows
from vocgraft.init.mean import source_pieces
from vocgraft.init.random import normal_rows
from vocgraft.tokenization.bpe import parse_merges
from vocgraft.tokenization.canonical import canonical_form, tokenizer_rules
from vocgraft.tokenization.spec import tokenizer_spec

# A child reference: a source id (>= 0), or tree node n encoded as -(n + 1).
Ref = int
VIA = ("aux_merges", "target_merges", "spelled", "random")  # how a new token got its row


def bpe_merges(tokenizer: Any) -> tuple[list[tuple[str, str]], str | None]:
    """The tokenizer's BPE merges in rank order and its continuing-subword prefix; ([], None) for other models."""
    spec = tokenizer_spec(tokenizer)["model"]
    if spec.get("type") != "BPE":
        return [], None
    return parse_merges(spec.get("merges", [])), spec.get("continuing_subword_prefix") or None


def producing_merges(
    merges: list[tuple[str, str]], prefix: str | None, wanted: set[str] | None = None
) -> dict[str, list[tuple[str, str]]]:
    """Merged string -> every merge that produces it, in rank order (only strings in ``wanted`` if given)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for a, b in merges:
        # with a continuing-subword prefix, (a, ##b) makes a + b: the right child's prefix is dropped
        merged = a + (b[len(prefix) :] if prefix and b.startswith(prefix) else b)
        if wanted is None or merged in wanted:
            found.setdefault(merged, []).append((a, b))
    return found


@dataclass
class MergeTree:
    """Nodes ``0 .. n_new - 1`` are ``plan.new_ids`` in order; later nodes are auxiliary subwords outside the
    target vocabulary that some new token is built from."""

    n_new: int
    names: list[str] = field(default_factory=list)  # raw string per node
    depth: list[int] = field(default_factory=list)  # -1 unmapped, 0 spelled leaf, >= 1 built by merges
    children: dict[int, list[tuple[Ref, Ref]]] = field(default_factory=dict)  # node -> its mapped merges
    spelled: dict[int, list[int]] = field(default_factory=dict)  # leaf node -> source ids spelling it
    via: list[str] = field(default_factory=list)  # per node: one of VIA

    def stats(self) -> dict[str, int]:
        """How the plan's new tokens got their rows (counts per ``VIA``), and how many inner auxiliary nodes."""
        counts = dict.fromkeys(VIA, 0)
        for how in self.via[: self.n_new]:
            counts[how] += 1
        return {"new": self.n_new, **counts, "aux_inner_nodes": len(self.names) - self.n_new}


class _Builder:
    def __init__(self, plan: Any, source_tokenizer: Any, target_tokenizer: Any, aux_tokenizer: Any) -> None:
        self.plan, self.source_tokenizer = plan, source_tokenizer
        self.target_vocab = target_tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
        self.aux_tokenizer = aux_tokenizer
        aux_merges, prefix = bpe_merges(aux_tokenizer)
        self.has_aux_merges = bool(aux_merges)
        self.aux = producing_merges(aux_merges, prefix)
        self.target: dict[str, list[tuple[str, str]]] = {}
        if target_tokenizer is not aux_tokenizer:  # expand: the expansion's own merges, for its intermediates
            target_merges, target_prefix = bpe_merges(target_tokenizer)
            new_strings = {plan.target_tokens[t] for t in plan.new_ids}
            self.target = producing_merges(target_merges, target_prefix, new_strings)
        new_ids = plan.new_ids
        self.tree = MergeTree(n_new=len(new_ids))
        self.node_of: dict[str, int] = {}
        for tid in new_ids:
            self._add_node(plan.target_tokens[tid])
        for node in range(len(new_ids)):
            self._resolve(node)

    def _add_node(self, name: str) -> int:
        tree = self.tree
        node = len(tree.names)
        tree.names.append(name)
        tree.depth.append(-2)  # not resolved yet
        tree.via.append("random")
        self.node_of.setdefault(name, node)
        return node

    def _ref(self, name: str) -> tuple[Ref, int] | None:
        """(reference, depth) of a child string, or None where it cannot be built from source rows."""
        tid = self.target_vocab.get(name)
        if tid is not None and tid in self.plan.copied:
            return self.plan.copied[tid], 0
        node = self.node_of.get(name)
        if node is None:
            node = self._add_node(name)
        depth = self._resolve(node)
        return None if depth < 0 else (-(node + 1), depth)

    def _resolve(self, node: int) -> int:
        tree = self.tree
        if tree.depth[node] != -2:
            return tree.depth[node]
        tree.depth[node] = -1  # while resolving: a merge that leads back here is unusable
        name = tree.names[node]
        for via, producing in (("aux_merges", self.aux), ("target_merges", self.target)):
            merges = producing.get(name)
            if not merges:
                continue
            mapped, depth = [], 0
            for a, b in merges:
                left, right = self._ref(a), self._ref(b)
                if left is not None and right is not None:
                    mapped.append((left[0], right[0]))
                    depth = max(depth, left[1], right[1])
            if mapped:
                tree.children[node], tree.depth[node], tree.via[node] = mapped, depth + 1, via
            return tree.depth[node]  # the auxiliary merges decide when there are any (Algorithm 1)
        if len(name) == 1:  # a base character: spelled by the source's pieces (its bytes) when it has them
            pieces = self._spelling(name)
            if pieces:
                tree.spelled[node], tree.depth[node], tree.via[node] = pieces, 0, "spelled"
        return tree.depth[node]

    def _spelling(self, name: str) -> list[int]:
        """Source ids that spell the auxiliary string ``name`` byte for byte; [] where the source cannot."""
        try:
            form = canonical_form(name, tokenizer_rules(self.aux_tokenizer))
        except ValueError:  # a tokenizer family without canonical forms
            return []
        pieces, exact = source_pieces(self.source_tokenizer, form, len(self.plan.source_tokens))
        return pieces if exact else []


def merge_tree(plan: Any, source_tokenizer: Any, target_tokenizer: Any, aux_tokenizer: Any) -> MergeTree:
    """The hierarchical-mean tree of every new token of ``plan`` over the auxiliary tokenizer's merges."""
    builder = _Builder(plan, source_tokenizer, target_tokenizer, aux_tokenizer)
    if not builder.has_aux_merges and plan.new_ids:
        warnings.warn(
            "merge: the auxiliary tokenizer has no BPE merges (Unigram, WordPiece, ...) and Merge is defined over "
            "BPE merges: new tokens get Random (single characters their source bytes, expansion intermediates "
            "the expansion's merges).",
            stacklevel=2,
        )
    return builder.tree


def tree_rows(matrix: torch.Tensor, tree: MergeTree) -> torch.Tensor:
    """Rows of every node (zeros where unmapped) from the real source rows ``matrix``, level by level."""
    n_nodes, n_source = len(tree.names), matrix.shape[0]
    rows = torch.zeros(n_nodes, matrix.shape[1], dtype=torch.float32)
    leaves = list(tree.spelled)
    if leaves:
        entries = [(r, s, 1.0 / len(tree.spelled[n])) for r, n in enumerate(leaves) for s in tree.spelled[n]]
        rows[leaves] = _sparse(entries, len(leaves), n_source) @ matrix
    for level in range(1, max(tree.depth, default=0) + 1):
        nodes = [n for n, d in enumerate(tree.depth) if d == level]
        on_source, on_nodes = [], []
        for r, node in enumerate(nodes):
            merges = tree.children[node]
            weight = 0.5 / len(merges)  # mean over the token's merges of the mean of the two children
            for ref in (ref for pair in merges for ref in pair):
                (on_source if ref >= 0 else on_nodes).append((r, ref if ref >= 0 else -ref - 1, weight))
        # children sit at lower levels, so their rows are final by now
        rows[nodes] = _sparse(on_source, len(nodes), n_source) @ matrix + _sparse(on_nodes, len(nodes), n_nodes) @ rows
    return rows


def _sparse(entries: list[tuple[int, int, float]], n_rows: int, n_cols: int) -> torch.Tensor:
    """A sparse float32 matrix from (row, column, value) entries; repeated positions add up."""
    index = torch.tensor([[r for r, _, _ in entries], [c for _, c, _ in entries]], dtype=torch.long).reshape(2, -1)
    values = torch.tensor([v for _, _, v in entries], dtype=torch.float32)
    return torch.sparse_coo_tensor(index, values, (n_rows, n_cols), check_invariants=True).coalesce()


def merge_rows(source_matrix: torch.Tensor, tree: MergeTree, generator: torch.Generator) -> torch.Tensor:
    """Rows for the plan's new ids (in order): hierarchical means, Random where a token has no merge path.

    ``source_matrix``: the real source rows only (no padding), float32."""
    rows = tree_rows(source_matrix, tree)[: tree.n_new]
    unmapped = [n for n in range(tree.n_new) if tree.depth[n] < 0]
    if unmapped:
        rows[unmapped] = normal_rows(source_matrix, len(unmapped), generator)
    return rows


def cached_tree(ctx: InitContext, method: str) -> MergeTree:
    """The context's merge tree, built once per model (the head pass and Align's fallback reuse it)."""
    if "merge_tree" not in ctx.resources:
        if ctx.plan.mode == "expand" and ctx.aux_tokenizer is None:
            raise MethodInputError(
                f"init method {method!r} needs the auxiliary tokenizer the new tokens came from in expand mode: "
                "pass InitContext(aux_tokenizer=...) (`vocgraft expand` passes the one it trained or --aux-tokenizer)."
            )
        ctx.resources["merge_tree"] = merge_tree(ctx.plan, ctx.source_tokenizer, ctx.target_tokenizer, ctx.aux)
    return ctx.resources["merge_tree"]


def warn_random(method: str, count: int, total: int, why: str) -> None:
    if count:
        warnings.warn(
            f"{method}: {count} of {total} new tokens {why}; they get Random rows (the papers' fallback).",
            stacklevel=3,
        )


@register(
    "merge",
    needs=("aux_tokenizer",),
    summary="hierarchical means along the auxiliary tokenizer's merges that build the token",
    reference="paper 000 Algorithm 1 (Merge)",
)
def merge(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    matrix = source_rows(source_matrix, ctx)
    tree = cached_tree(ctx, "merge")
    stats = ctx.resources["merge_stats"] = tree.stats()
    if ctx.space == "input":
        warn_random("merge", stats["random"], stats["new"], "have no merge path down to source tokens")
    return merge_rows(matrix, tree, ctx.generator())
