"""VocADT (paper 004): new embeddings learned as combinations of the frozen old ones, ``E_new = A @ E_old``.

The adapter ``A`` (|Vnew| x |Vold|) starts as (§3.2)

- a one-hot row for a token the old vocabulary already has (the plan's copied tokens),
- ``1/m`` on each of the ``m`` old pieces that spell a new token byte for byte (a piece that occurs twice counts
  twice, so the row is exactly the Mean initialization's average),
- a uniform random row normalized to sum 1 for a token the old tokenizer cannot spell,

and is trained with the LM loss through the frozen model, plus ``alpha`` times the mean L2 distance of the
shared vocabulary's rows from their start (§3.3).

**Which rows are the shared vocabulary** (``V_old ∩ V_new``, the aux loss's rows): the copied tokens whose
match kind says the token itself is in both vocabularies, ``SHARED_KINDS``: ``identity`` (expand), ``exact`` (the
same canonical bytes: ``▁the`` is ``Ġthe``) and ``special`` (the same special-token string). Not shared:
``special-role`` (the target's ``</s>`` mapped onto the source's ``<|im_end|>``: two different tokens that hold one
role) and ``fuzzy-*`` (``▁1`` and ``1``: different tokens). Those rows still *start* one-hot on their match, as the
plan says (spelled out by the old tokenizer a role token would start as the mean of ``<``, ``/``, ``s``, ``>``),
but the aux loss leaves them free, like any other new row.

**Input and output adapters** (``ADAPTER_FORMS``): ``separate`` (the paper's form, §4 "Adapter Training": the
input and output adapters are separate modules, a shared one "performs worse") gives the embedding and the LM head
an adapter each, so a tied source becomes an untied model (``A_in E`` and ``A_out E``, + |Vnew| x hidden
parameters); ``shared`` puts one adapter on both sides (a tied source stays tied; an untied one gets ``A E_in`` and
``A H``), half the adapter state.

Two forms of ``A``:

- **dense**: the full matrix, as in the paper. For SmolLM2 (50K x 49K) that is 9.8 GB in fp32 and four times
  that with its gradient and AdamW's two states: a large-GPU form.
- **sparse** (default): each row keeps weights on a candidate set only: its initial support plus its K nearest
  old rows by cosine to the initial row, stored as ``[Vnew, W]`` index and weight tensors and applied with
  ``embedding_bag`` (no ``[Vnew, W, hidden]`` gather). A token the old tokenizer cannot spell gets K random
  candidates with normalized uniform weights (the dense form's uniform row, restricted to K columns).

The adapter is a ``torch.nn.utils.parametrize`` parametrization of the embedding (and head) weight, so the model
keeps its own classes and forward; ``merged_weights`` computes ``A @ E_old`` for saving. A shared adapter on a tied
model would be computed twice per forward (once per parametrization); it computes ``A @ E_old`` once per model
forward instead (``VocabAdapter`` reuses its result inside a forward scope opened by hooks on the model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize

from vocgraft.settings.vocadt import MAX_CANDIDATES
from vocgraft.train.data import TrainingError
from vocgraft.train.neighbours import CosineIndex, nearest_rows  # noqa: F401 (nearest_rows: re-exported)

ADAPTER_FORMS = ("separate", "shared")  # the paper's form first
# copied tokens that are the same token in both vocabularies (see the module docstring): the aux loss's rows
SHARED_KINDS = ("identity", "exact", "special")
ADAPTER_PARAM = "adapter_weights"  # the only parameters VocADT trains (strategies.configure looks for this name)


@dataclass
class AdapterStart:
    """The initial adapter A0 of one vocabulary, before any training."""

    index: torch.Tensor | None  # [Vnew, W] old ids (sparse form); None for the dense form
    weight: torch.Tensor  # [Vnew, W] sparse, or [Vnew, Vold] dense
    overlap_rows: torch.Tensor  # new ids of the shared vocabulary (SHARED_KINDS): the aux loss's rows
    counts: dict[str, int]  # how many rows started as one-hot / pieces / uniform


def shared_vocabulary(plan: Any) -> list[int]:
    """New ids of the tokens both vocabularies hold (``V_old ∩ V_new``, paper 004 eq. 4), ascending."""
    unrecorded = [t for t in plan.copied if t not in plan.match_kind]
    if unrecorded:
        raise TrainingError(
            f"the plan records no match kind for copied id {unrecorded[0]} (and {len(unrecorded) - 1} more), so "
            "VocADT cannot tell the shared vocabulary from role and fuzzy matches; rebuild the plan from the "
            "tokenizers (VocabPlan.from_tokenizers)."
        )
    return sorted(plan.copied_by(*SHARED_KINDS))


def initial_supports(
    plan: Any, source_tokenizer: Any, target_tokenizer: Any
) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """Per new id: the old ids and weights of its initial row, and which of the three cases it is."""
    from vocgraft.init.mean import source_pieces, target_forms

    n_old = len(plan.source_tokens)
    forms = target_forms(plan, range(len(plan.target_tokens)), target_tokenizer)
    ids: list[list[int]] = []
    weights: list[list[float]] = []
    kinds: list[str] = []
    for new_id, form in enumerate(forms):
        if new_id in plan.copied:
            ids.append([plan.copied[new_id]])
            weights.append([1.0])
            kinds.append("one-hot")
            continue
        pieces, exact = source_pieces(source_tokenizer, form, n_old) if form else ([], False)
        if exact and pieces:
            ids.append(pieces)
            weights.append([1.0 / len(pieces)] * len(pieces))
            kinds.append("pieces")
        else:
            ids.append([])
            weights.append([])
            kinds.append("uniform")
    return ids, weights, kinds


def adapter_start(
    old_matrix: torch.Tensor,
    plan: Any,
    source_tokenizer: Any,
    target_tokenizer: Any,
    *,
    candidates: int | None = MAX_CANDIDATES.default,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> AdapterStart:
    """A0 for ``old_matrix`` (input embeddings or LM head, ``[Vold(+padding), hidden]``), on the CPU.

    ``candidates=None`` gives the dense form; otherwise each row's K nearest old rows join its support. The
    neighbour search (``vocgraft.train.neighbours``: a bfloat16 shortlist settled in float32, the exact search's
    neighbours) runs on ``device`` (default: the matrix's own; a GPU does Llama-3's 128K x 128K x 4096 in
    seconds), over blocks of new rows x blocks of old rows: the matrix itself stays in its dtype (one copy on
    ``device`` when it lives elsewhere), plus a unit-norm bfloat16 copy, never a float32 copy of it. Rows with the
    same start (support and weights) are searched once.
    """
    old = old_matrix[: len(plan.source_tokens)].detach()  # a view in the stored dtype
    ids, weights, kinds = initial_supports(plan, source_tokenizer, target_tokenizer)
    counts = {kind: kinds.count(kind) for kind in ("one-hot", "pieces", "uniform")}
    overlap = torch.tensor(shared_vocabulary(plan), dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    uniform = [row for row, kind in enumerate(kinds) if kind == "uniform"]
    if candidates is None:
        dense = torch.zeros(len(ids), old.shape[0])
        rows = torch.tensor([r for r, cols in enumerate(ids) for _ in cols], dtype=torch.long)
        cols = torch.tensor([c for cols in ids for c in cols], dtype=torch.long)
        dense.index_put_((rows, cols), torch.tensor([w for ws in weights for w in ws]), accumulate=True)
        if uniform:
            u = torch.rand(len(uniform), old.shape[0], generator=generator)
            dense[uniform] = u / u.sum(dim=1, keepdim=True)
        return AdapterStart(None, dense, overlap, counts)
    if candidates <= 0:
        raise TrainingError(f"--max-candidates must be positive; got {candidates}.")
    k = min(candidates, old.shape[0])
    # a row's first columns hold its support (padded by repeating a support id with weight 0: a duplicate column
    # changes nothing and needs no mask), the last k its candidates: nearest old rows, or for a token the old
    # tokenizer cannot spell, k distinct random old ids carrying its normalized uniform weights
    width = max([len(cols) for cols in ids if cols], default=1)
    neighbours = torch.empty(len(ids), k, dtype=torch.long)
    neighbour_w = torch.zeros(len(ids), k)
    for row in uniform:
        neighbours[row] = torch.randperm(old.shape[0], generator=generator)[:k]
        u = torch.rand(k, generator=generator)
        neighbour_w[row] = u / u.sum()
        ids[row] = [int(neighbours[row, 0])]  # padding for its support columns
        weights[row] = [0.0]
    support = torch.tensor([cols + [cols[0]] * (width - len(cols)) for cols in ids], dtype=torch.long)
    support_w = torch.tensor([ws + [0.0] * (width - len(ws)) for ws in weights])
    spelled_rows = torch.tensor([kind != "uniform" for kind in kinds]).nonzero().squeeze(1)
    if len(spelled_rows):
        keys = old.to(torch.device(device) if device is not None else old.device)
        # rows with the same start (support and weights) have the same query and exclusions: searched once
        starts = torch.cat([support[spelled_rows].double(), support_w[spelled_rows].double()], dim=1)
        distinct, copy_of = torch.unique(starts, dim=0, return_inverse=True)
        first = torch.full((len(distinct),), len(spelled_rows), dtype=torch.long).scatter_reduce_(
            0, copy_of, torch.arange(len(spelled_rows)), "amin"
        )
        rows = spelled_rows[first]  # one new id per distinct start

        def queries(at: torch.Tensor) -> torch.Tensor:  # the start rows, made one block at a time
            return weighted_rows(keys, support[rows[at]], support_w[rows[at]])

        found = CosineIndex(keys).search_rows(queries, len(rows), k, exclude=support[rows])
        neighbours[spelled_rows] = found[copy_of]
    index = torch.cat([support, neighbours], dim=1)
    weight = torch.cat([support_w, neighbour_w], dim=1)
    return AdapterStart(index, weight, overlap, counts)


def weighted_rows(matrix: torch.Tensor, index: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``sum_j weight[:, j] * matrix[index[:, j]]`` in float32 on the matrix's device (``embedding_bag``'s weighted
    sum, for a matrix in any dtype: only the gathered rows are cast)."""
    index, weight = index.to(matrix.device), weight.to(matrix.device, torch.float32)
    out = torch.zeros(index.shape[0], matrix.shape[1], dtype=torch.float32, device=matrix.device)
    for j in range(index.shape[1]):
        out += weight[:, j, None] * matrix[index[:, j]].to(torch.float32)
    return out


class VocabAdapter(torch.nn.Module):
    """Parametrization ``E_old -> A @ E_old`` of an embedding or head weight; owns A and its start for the aux loss.

    Inside a forward scope (``open_scope`` .. ``close_scope``, one model forward) a second call on the same
    ``E_old`` returns the first call's result: a shared adapter on a tied model is computed once per forward, and
    autograd sums both sides' gradients into A through the one result."""

    def __init__(self, start: AdapterStart):
        super().__init__()
        self.sparse = start.index is not None
        index = start.index.clone() if self.sparse else torch.empty(0, dtype=torch.long)
        self.register_buffer("index", index)  # cloned: two adapters built from one start share no storage
        self.register_parameter(ADAPTER_PARAM, torch.nn.Parameter(start.weight.clone()))
        self.register_buffer("overlap_rows", start.overlap_rows.clone())
        self.register_buffer("overlap_start", start.weight[start.overlap_rows].clone())
        self._scoped = False
        self._last: tuple | None = None  # (E_old, A's version, A @ E_old) of this scope
        self.scope_hooks: list = []  # the model hooks that open and close the scope (removed on merge)

    @property
    def adapter(self) -> torch.Tensor:
        return getattr(self, ADAPTER_PARAM)

    def open_scope(self, *_) -> None:
        self._scoped, self._last = True, None

    def close_scope(self, *_) -> None:
        self._scoped, self._last = False, None

    def forward(self, old: torch.Tensor) -> torch.Tensor:
        if self._last is not None and self._last[0] is old and self._last[1] == self.adapter._version:
            return self._last[2]
        weight = self.adapter.to(old.dtype)
        if self.sparse:
            new = F.embedding_bag(self.index, old, per_sample_weights=weight, mode="sum")
        else:
            new = weight @ old
        if self._scoped:
            self._last = (old, self.adapter._version, new)
        return new

    def aux_loss(self) -> torch.Tensor:
        """Mean L2 distance of the shared vocabulary's rows from their start (paper 004 eq. 4); 0 at the start."""
        if len(self.overlap_rows) == 0:
            return self.adapter.sum() * 0.0
        drift = self.adapter[self.overlap_rows] - self.overlap_start
        return torch.linalg.vector_norm(drift, dim=1).mean()


def attach_adapters(model: Any, input_start: AdapterStart, head_start: AdapterStart | None) -> list[VocabAdapter]:
    """Put the adapters on the model's embedding (and head) weights; the model then speaks the new vocabulary.

    ``head_start=None`` is the shared form: the input adapter serves the head too (a tied model stays tied; an
    untied head gets ``A @ H_old``). Otherwise the head gets its own adapter, built in head space (on a tied
    model that space is the input matrix, and ``merged_weights`` unties the model)."""
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is emb.weight
    if getattr(head, "bias", None) is not None:
        raise TrainingError("VocADT does not support an LM head with a bias (its rows would need an adapter too).")
    n_new = input_start.weight.shape[0]
    adapters = [VocabAdapter(input_start)]
    parametrize.register_parametrization(emb, "weight", adapters[0], unsafe=True)  # unsafe: rows change count
    emb.num_embeddings = n_new
    if head is not None:
        if head_start is None:
            head_adapter = adapters[0]
            if tied:  # both parametrizations read one E_old: compute A @ E_old once per model forward
                head_adapter.scope_hooks = [
                    model.register_forward_pre_hook(head_adapter.open_scope),
                    model.register_forward_hook(head_adapter.close_scope),
                ]
        else:
            head_adapter = VocabAdapter(head_start)
            adapters.append(head_adapter)
        parametrize.register_parametrization(head, "weight", head_adapter, unsafe=True)
        head.out_features = n_new
    return adapters


def aux_loss(adapters: Sequence[VocabAdapter], alpha: float):
    """``alpha`` x the sum of the adapters' aux losses, as a callable for the trainer (None when alpha is 0)."""
    if alpha == 0:
        return None
    return lambda: alpha * sum(adapter.aux_loss() for adapter in adapters)


def merged_weights(model: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``A @ E_old`` (and the head's rows unless the model stays tied: one shared adapter on one matrix), then the
    adapters are removed and the model holds its old matrices again, ready for ``surgery.graft``; a tied model
    whose head had its own adapter is untied first, so that graft takes the head's rows."""
    from vocgraft.surgery import untie_head

    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    with torch.no_grad():
        new_input = emb.weight.detach().clone()
        stays_tied = head is not None and (
            head.parametrizations.weight[0] is emb.parametrizations.weight[0]
            and head.parametrizations.weight.original is emb.parametrizations.weight.original
        )
        new_head = None if head is None or stays_tied else head.weight.detach().clone()
    # leave_parametrized=False: the old matrix goes back as it was (with True, torch would write A @ E_old into
    # the old Parameter in place, and a tied head shares that Parameter)
    for module in (emb, head):
        if module is not None and parametrize.is_parametrized(module, "weight"):
            for hook in module.parametrizations.weight[0].scope_hooks:
                hook.remove()
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
    emb.num_embeddings = emb.weight.shape[0]
    if head is not None:
        head.out_features = head.weight.shape[0]
        if new_head is not None and head.weight is emb.weight:
            untie_head(model)
    return new_input, new_head


def adapter_memory(n_new: int, n_old: int, width: int | None, *, adapters: int = 1) -> dict[str, int]:
    """Bytes of the adapters' training state in fp32: weights, gradient and AdamW's two moments (the sparse form
    adds its int64 index). The dense form's figures are computed, never allocated; ``width=None``: dense only."""
    per_entry = 4 * 4
    memory = {
        "dense_weight_bytes": adapters * n_new * n_old * 4,
        "dense_training_bytes": adapters * n_new * n_old * per_entry,
    }
    if width is not None:
        memory["sparse_training_bytes"] = adapters * n_new * width * (per_entry + 8)
    return memory
