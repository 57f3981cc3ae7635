"""Init stage: a registry of methods that compute embedding rows for a plan's new tokens.

A method is a plain function ``fn(source_matrix, ctx) -> rows`` registered with ``@register("name", ...)``:

- ``source_matrix`` is one float32 matrix of the source model, ``[rows, hidden]``: the input embeddings,
  or the LM head when ``ctx.space == "head"`` (untied models are initialized once per space, with the same
  method). It may have padding rows past ``len(ctx.source_tokenizer)``; methods take statistics over real
  tokens only.
- it returns ``[len(ctx.plan.new_ids), hidden]``: one row per new id, in ``plan.new_ids`` order.

The registration declares what the method needs (``needs``: names from ``INPUTS``) and its own settings
(``options``). The CLI flags (``vocgraft expand/replace --init ... --target-plm ... --<option>``), the pipeline
keys (``adapt.<input>``, ``adapt.<option>``), the check that refuses a run before any work when an input is
missing, and the generic test matrix all come from these declarations, so **a new method is one new file** in
this package: it registers itself when imported, and this package imports every module in it.

Methods do no I/O, are vectorized and deterministic for ``ctx.seed``. ``initialize`` runs a method on a model
and checks what comes back.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vocgraft.plan import VocabPlan

SPACES = ("input", "head")

# What a method may need, and where it comes from. "corpus" and "aux_tokenizer" are always there in expand and
# replace (replace's auxiliary tokenizer is the target tokenizer itself); the others come from the user
# (``USER_INPUTS``) or from the recipe ("model").
INPUTS = {
    "corpus": "target-language training lines (--corpus)",
    "aux_tokenizer": "the auxiliary target-language tokenizer (expand: trained on --corpus or --aux-tokenizer; "
    "replace: the target tokenizer)",
    "target_plm": "a target-language model whose tokenizer is the target (replace) or auxiliary (expand) "
    "tokenizer: --target-plm DIR (`vocgraft plm train` builds one)",
    "model": "the source model itself, for forward passes",
}


@dataclass(frozen=True)
class Option:
    """A method setting: ``--<name with dashes>`` on the command line, ``adapt.<name>`` in a pipeline config."""

    name: str
    default: Any
    help: str

    @property
    def type(self) -> type:
        return type(self.default)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Method:
    name: str
    fn: Callable[[torch.Tensor, InitContext], torch.Tensor]
    needs: frozenset[str]
    options: tuple[Option, ...]
    summary: str
    reference: str  # where the method is defined: a paper section, or what it varies ("variant of salt: ...")

    def __call__(self, source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
        return self.fn(source_matrix, ctx)

    def defaults(self) -> dict[str, Any]:
        return {option.name: option.default for option in self.options}


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
    # the auxiliary tokenizer the target's new tokens come from (expand); in replace the target tokenizer itself
    aux_tokenizer: Any = None
    model: Any = None  # the source model, for methods that run it ("model" in needs); set by ``initialize``
    options: dict[str, Any] = field(default_factory=dict)  # method settings (Option names -> values)

    def generator(self) -> torch.Generator:
        """A CPU generator seeded from (seed, space): same seed, same rows; head and input noise differ."""
        return torch.Generator().manual_seed(self.seed * len(SPACES) + SPACES.index(self.space))

    @property
    def n_source(self) -> int:
        """Number of real source tokens: matrix rows at or past this index are padding."""
        return len(self.plan.source_tokens)

    @property
    def aux(self) -> Any:
        """The auxiliary tokenizer (the target tokenizer where none was given: replace mode)."""
        return self.aux_tokenizer if self.aux_tokenizer is not None else self.target_tokenizer


InitMethod = Callable[[torch.Tensor, InitContext], torch.Tensor]
METHODS: dict[str, Method] = {}


class MethodInputError(ValueError):
    """A method was asked for without an input it needs, or with a setting it does not have."""


def register(
    name: str,
    *,
    needs: Sequence[str] = (),
    options: Sequence[Option] = (),
    summary: str = "",
    reference: str = "",
) -> Callable[[InitMethod], InitMethod]:
    """Decorator: make ``fn`` available as init method ``name``, declaring its inputs and settings."""
    unknown = sorted(set(needs) - set(INPUTS))
    if unknown:
        raise ValueError(f"init method {name!r} needs {unknown[0]!r}, which is not one of {sorted(INPUTS)}.")

    def add(fn: InitMethod) -> InitMethod:
        if name in METHODS and METHODS[name].fn is not fn:
            raise ValueError(
                f"init method {name!r} is registered twice ({METHODS[name].fn.__module__}, {fn.__module__})."
            )
        METHODS[name] = Method(name, fn, frozenset(needs), tuple(options), summary, reference)
        return fn

    return add


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise MethodInputError(f"unknown init method {name!r}; available: {', '.join(sorted(METHODS))}.") from None


def all_options() -> dict[str, Option]:
    """Every method option by name (methods that share a setting declare the same Option)."""
    found: dict[str, Option] = {}
    for method in METHODS.values():
        for option in method.options:
            if found.setdefault(option.name, option) != option:
                raise ValueError(f"option {option.name!r} is declared differently by two methods.")
    return found


def method_options(name: str, given: dict[str, Any] | None) -> dict[str, Any]:
    """The method's settings: its defaults, overridden by the ``given`` values that are not None. A given
    setting of another method is an error (it would be silently ignored)."""
    method = get_method(name)
    given = {k: v for k, v in (given or {}).items() if v is not None}
    foreign = sorted(set(given) - {o.name for o in method.options})
    if foreign:
        option = all_options().get(foreign[0])
        flag = option.flag if option else foreign[0]
        raise MethodInputError(f"{flag} is not a setting of init method {name!r}; remove it or choose another --init.")
    return method.defaults() | given


def source_rows(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    """The rows of real source tokens (padding rows and unused ids excluded), float32: what statistics are taken
    over."""
    n = ctx.n_source
    if source_matrix.shape[0] < n:
        raise ValueError(
            f"the source matrix has {source_matrix.shape[0]} rows but the source tokenizer has {n} ids; "
            "is this the right model for the plan?"
        )
    rows = source_matrix[:n].detach().to(torch.float32)
    unused = [i for i, token in enumerate(ctx.plan.source_tokens) if not token]  # ids inside the range no token has
    if unused:
        keep = torch.ones(n, dtype=torch.bool)
        keep[unused] = False
        rows = rows[keep]
    return rows


def initialize(model: Any, method: str, ctx: InitContext) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows for ``ctx.plan.new_ids``: (input-embedding rows, LM-head rows or None when the head is tied).

    Computed in float32 from the stored weights (unscaled: a model that multiplies embeddings by sqrt(hidden)
    does so in its forward pass, not in the weight), and returned in float32.
    """
    spec = get_method(method)
    ctx = replace(ctx, model=model, options=method_options(method, ctx.options))
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is None or head.weight.data_ptr() == emb.data_ptr()
    input_rows = _run(spec, emb, replace(ctx, space="input"))
    head_rows = None if tied else _run(spec, head.weight, replace(ctx, space="head"))
    return input_rows, head_rows


def _run(method: Method, matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    n_new, hidden = len(ctx.plan.new_ids), matrix.shape[1]
    if n_new == 0:
        return torch.empty(0, hidden, dtype=torch.float32)
    with torch.no_grad():
        rows = method(matrix.detach().to(torch.float32), ctx)
    name = method.name
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


def _import_methods() -> None:
    """Import every module of this package: methods register themselves on import (one file per method)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_import_methods()
