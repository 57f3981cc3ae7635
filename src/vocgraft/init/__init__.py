"""Init stage: a registry of methods that compute embedding rows for a plan's new tokens.

A method is a plain function ``fn(source_matrix, ctx) -> rows`` registered with ``@register("name")``:

- ``source_matrix`` is one float32 matrix of the source model, ``[rows, hidden]``: the input embeddings,
  or the LM head when ``ctx.space == "head"`` (untied models are initialized once per space, with the same
  method). It may have padding rows past ``len(ctx.source_tokenizer)``; methods take statistics over real
  tokens only.
- it returns ``[len(ctx.plan.new_ids), hidden]``: one row per new id, in ``plan.new_ids`` order.

Methods do no I/O, are vectorized and deterministic for ``ctx.seed``. ``initialize`` runs a method on a model
and checks what comes back. A new method is one new file in this package plus one import line at the bottom.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vocgraft.plan import VocabPlan

SPACES = ("input", "head")


@dataclass
class InitContext:
    plan: VocabPlan
    source_tokenizer: Any
    target_tokenizer: Any
    corpus: Sequence[str] | None = None  # target-language lines (Align, FOCUS)
    seed: int = 0
    space: str = "input"  # "input" embeddings or "head": which source matrix the method receives
    # optional inputs some methods need (e.g. "target_embeddings" of a target-language PLM for SALT), and a cache
    # that lives across the input and head passes (e.g. fastText vectors, Align counts): computed once per model
    resources: dict[str, Any] = field(default_factory=dict)

    def generator(self) -> torch.Generator:
        """A CPU generator seeded from (seed, space): same seed, same rows; head and input noise differ."""
        return torch.Generator().manual_seed(self.seed * len(SPACES) + SPACES.index(self.space))

    @property
    def n_source(self) -> int:
        """Number of real source tokens: matrix rows at or past this index are padding."""
        return len(self.plan.source_tokens)


InitMethod = Callable[[torch.Tensor, InitContext], torch.Tensor]
METHODS: dict[str, InitMethod] = {}


def register(name: str) -> Callable[[InitMethod], InitMethod]:
    """Decorator: make ``fn`` available as init method ``name``."""

    def add(fn: InitMethod) -> InitMethod:
        if name in METHODS and METHODS[name] is not fn:
            raise ValueError(f"init method {name!r} is registered twice ({METHODS[name].__module__}, {fn.__module__}).")
        METHODS[name] = fn
        return fn

    return add


def get_method(name: str) -> InitMethod:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown init method {name!r}; available: {', '.join(sorted(METHODS))}.") from None


def source_rows(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    """The rows of real source tokens (padding rows excluded), float32: what statistics are taken over."""
    n = ctx.n_source
    if source_matrix.shape[0] < n:
        raise ValueError(
            f"the source matrix has {source_matrix.shape[0]} rows but the source tokenizer has {n} tokens; "
            "is this the right model for the plan?"
        )
    return source_matrix[:n].detach().to(torch.float32)


def initialize(model: Any, method: str, ctx: InitContext) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows for ``ctx.plan.new_ids``: (input-embedding rows, LM-head rows or None when the head is tied).

    Computed in float32 from the stored weights (unscaled: a model that multiplies embeddings by sqrt(hidden)
    does so in its forward pass, not in the weight), and returned in float32.
    """
    fn = get_method(method)
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is None or head.weight.data_ptr() == emb.data_ptr()
    input_rows = _run(fn, method, emb, replace(ctx, space="input"))
    head_rows = None if tied else _run(fn, method, head.weight, replace(ctx, space="head"))
    return input_rows, head_rows


def _run(fn: InitMethod, name: str, matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    n_new, hidden = len(ctx.plan.new_ids), matrix.shape[1]
    if n_new == 0:
        return torch.empty(0, hidden, dtype=torch.float32)
    with torch.no_grad():
        rows = fn(matrix.detach().to(torch.float32), ctx)
    if tuple(rows.shape) != (n_new, hidden):
        raise ValueError(f"init method {name!r} returned shape {tuple(rows.shape)}, expected ({n_new}, {hidden}).")
    rows = rows.to(torch.float32)
    bad = ~torch.isfinite(rows).all(dim=1)
    if bad.any():
        ids = [ctx.plan.new_ids[i] for i in bad.nonzero().flatten()[:5].tolist()]
        raise ValueError(f"init method {name!r} produced NaN/inf rows ({ctx.space} space) for target ids {ids} ...")
    zero = (rows == 0).all(dim=1)
    if zero.any():  # never silently: a zero row next to real ones is a sign of a broken method or source row
        warnings.warn(
            f"init method {name!r} produced {int(zero.sum())} all-zero rows ({ctx.space} space).",
            stacklevel=2,
        )
    return rows


# Methods register themselves on import. One line per method file.
from vocgraft.init import (  # noqa: E402, F401
    align,
    focus,
    mean,
    merge,
    multivariate,
    random,
    salt,
)
