"""Init stage: a registry of methods that compute embedding rows for a plan's new tokens.

A method is a plain function ``fn(source_matrix, ctx) -> rows`` registered with ``@register("name", ...)``:

- ``source_matrix`` is one matrix of the source model, ``[rows, hidden]``, as the model holds it (its dtype and
  device: a bfloat16 matrix on a GPU stays there): the input embeddings, or the LM head when
  ``ctx.space == "head"`` (untied models are initialized once per space, with the same method). It may have
  padding rows past ``len(ctx.source_tokenizer)``; methods take statistics over real tokens only.
- methods compute in float32 on the rows they use, on the matrix's device: gathered rows
  (:func:`gathered_product`), statistics over row blocks (:func:`source_blocks`, :func:`source_mean_std`), never a
  float32 or float64 copy of the whole matrix (a 262K x 3584 matrix is 1.75 GiB in bfloat16, 3.5 GiB in float32).
  Random draws come from ``ctx.generator()`` on the CPU and are moved to the device, so a seed gives the same rows
  on every device.
- it returns ``[len(ctx.plan.new_ids), hidden]``: one row per new id, in ``plan.new_ids`` order.

The registration declares what the method needs (``needs``: names from ``INPUTS``) and its own settings
(``options``). The CLI flags (``vocgraft expand/replace --init ... --target-plm ... --<option>``), the pipeline
keys (``adapt.<input>``, ``adapt.<option>``), the check that refuses a run before any work when an input is
missing, and the generic test matrix all come from these declarations, so **a new method is one new file** in
this package: it registers itself when imported, and this package imports every module in it.

Methods do no I/O, are vectorized and deterministic for ``ctx.seed`` (fastText training on several threads
excepted: ``ctx.resources["fasttext"]["threads"] = 1`` makes FOCUS and SALT vectors reproducible too).
``initialize`` runs a method on a model and checks what comes back.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vocgraft.errors import UserError
from vocgraft.plan import VocabPlan

SPACES = ("input", "head")
# rows per float32 working block of a source matrix (statistics, gathered rows, products): 8192 x 4096 floats =
# 128 MiB; float64 blocks have half as many rows. Read at call time (tests make it small).
GATHER_BLOCK = 8192


def block_rows(dtype: torch.dtype = torch.float32) -> int:
    """Rows per working block in ``dtype``: GATHER_BLOCK float32 rows' worth of bytes."""
    return max(1, GATHER_BLOCK * 4 // dtype.itemsize)


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
    """A method setting: ``--<name with dashes>`` on the command line, ``adapt.<name>`` in a pipeline config.

    Its allowed values are declared with it and checked where the value is parsed (preflight, the pipeline config,
    :func:`method_options`): ``minimum``/``maximum`` for numbers (floats must also be finite; ``above`` makes the
    minimum exclusive), ``choices`` for names. A method whose settings can make it leave its start rows as they
    are warns where it finds that out (e.g. distill with no training epochs and a tied head)."""

    name: str
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False  # the minimum itself is not allowed (a learning rate > 0)
    choices: tuple[str, ...] = ()

    @property
    def type(self) -> type:
        return type(self.default)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` for this setting (None: nothing)."""
        if self.choices:
            return None if value in self.choices else f"must be one of {', '.join(self.choices)}; got {value!r}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if not math.isfinite(value):
            return f"must be a finite number; got {value}"
        low = self.minimum is not None and (value <= self.minimum if self.above else value < self.minimum)
        high = self.maximum is not None and value > self.maximum
        if low or high:
            lower = None if self.minimum is None else f"{'>' if self.above else '>='} {self.minimum:g}"
            upper = None if self.maximum is None else f"<= {self.maximum:g}"
            return f"must be {' and '.join(filter(None, (lower, upper)))}; got {value}"
        return None

    def check(self, value: Any, name: str | None = None) -> None:
        """Refuse a value outside the declared range or choices; ``name``: how the user gave it (default: the flag)."""
        problem = None if value is None else self.problem(value)
        if problem:
            raise MethodInputError(f"{name or self.flag} {problem}.")


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

    def describe(self, flags: dict[str, str]) -> str:
        """What `vocgraft methods` says of it: summary, where it is defined, what it needs (``flags``: the flag that
        names a user input), and its settings."""
        needs = ", ".join(flags.get(need, need) for need in sorted(self.needs)) or "nothing"
        lines = [f"{self.name}: {self.summary}", f"  defined in: {self.reference}", f"  needs: {needs}"]
        return "\n".join(lines + [f"  {o.flag} (default {o.default}): {o.help}" for o in self.options])


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


class MethodInputError(UserError, ValueError):
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
    for option in method.options:
        option.check(given.get(option.name))
    return method.defaults() | given


def check_source_matrix(source_matrix: torch.Tensor, ctx: InitContext) -> None:
    """The matrix must have a row for every source id (it may have more: padding)."""
    n = ctx.n_source
    if source_matrix.shape[0] < n:
        raise ValueError(
            f"the source matrix has {source_matrix.shape[0]} rows but the source tokenizer has {n} ids; "
            "is this the right model for the plan?"
        )


def real_source_ids(ctx: InitContext) -> torch.Tensor | None:
    """Ids of real source tokens, or None when every id below ``ctx.n_source`` is one (the usual case)."""
    unused = [i for i, token in enumerate(ctx.plan.source_tokens) if not token]  # ids in the range no token has
    if not unused:
        return None
    keep = torch.ones(ctx.n_source, dtype=torch.bool)
    keep[unused] = False
    return keep.nonzero().squeeze(1)


def source_blocks(
    source_matrix: torch.Tensor, ctx: InitContext, block: int | None = None, dtype: torch.dtype = torch.float32
) -> Iterator[torch.Tensor]:
    """The rows of real source tokens (padding rows and unused ids excluded), in order, as ``dtype`` blocks of at
    most ``block`` rows on the matrix's device: statistics are taken over these, one block in memory at a time."""
    check_source_matrix(source_matrix, ctx)
    block = block or block_rows(dtype)
    ids = real_source_ids(ctx)
    n = ctx.n_source if ids is None else len(ids)
    for start in range(0, n, block):
        if ids is None:
            rows = source_matrix[start : min(start + block, n)]
        else:
            rows = source_matrix[ids[start : start + block].to(source_matrix.device)]
        yield rows.detach().to(dtype)


def source_mean_std(source_matrix: torch.Tensor, ctx: InitContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension mean and (unbiased) std of the real source rows, float32 on the matrix's device."""
    return blocked_mean_std(lambda: source_blocks(source_matrix, ctx))


def matrix_blocks(matrix: torch.Tensor, block: int | None = None) -> Iterator[torch.Tensor]:
    """All rows of ``matrix`` as float32 blocks of at most ``block`` rows (on its device)."""
    block = block or block_rows()
    for start in range(0, matrix.shape[0], block):
        yield matrix[start : start + block].detach().to(torch.float32)


def blocked_mean_std(blocks: Callable[[], Iterator[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension mean and unbiased std over the row blocks ``blocks()`` yields (called twice: the mean, then
    the squared deviations from it), float32. Sums are kept in float64: vectors of ``hidden`` values, not a copy
    of the matrix."""
    count, total = 0, None
    for rows in blocks():
        part = rows.sum(dim=0, dtype=torch.float64)
        total = part if total is None else total + part
        count += rows.shape[0]
    if not count:
        raise ValueError("the source vocabulary has no tokens to take statistics over")
    mean = total / count
    squares = torch.zeros_like(mean)
    for rows in blocks():
        squares += ((rows.to(torch.float64) - mean) ** 2).sum(dim=0)
    std = (squares / max(count - 1, 1)).sqrt()
    return mean.to(torch.float32), std.to(torch.float32)


def gathered_product(
    weights: torch.Tensor,
    source_matrix: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    block: int | None = None,
    out_dtype: torch.dtype | None = None,
    finish: Callable[[torch.Tensor, int, int], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``weights @ source_matrix`` computed in ``dtype`` (returned in ``out_dtype``, default ``dtype``) for a sparse
    ``weights`` ``[m, rows]`` (CPU or the matrix's device), touching only the source rows it references.

    Output rows are made ``block`` at a time, each from the source rows its entries use, gathered and cast ``block``
    rows at a time: no cast copy of the whole matrix, and no ``[m, hidden]`` buffer in ``dtype`` besides the result.
    An output row whose entries use at most ``block`` source rows is one ``torch.sparse.mm`` over its entries in
    their order, as on the whole matrix (the same bits). ``finish(rows, first, stop)``, when given, maps each block
    of output rows ``first:stop`` in ``dtype`` before the cast (e.g. adds an offset in float64)."""
    device, block = source_matrix.device, block or block_rows(dtype)
    out_dtype = out_dtype or dtype
    m, hidden = weights.shape[0], source_matrix.shape[1]
    weights = weights.coalesce()  # entries sorted by (row, column)
    index, values = weights.indices(), weights.values().to(dtype)
    starts = torch.searchsorted(index[0].contiguous(), torch.arange(0, m + block, block).clamp_max(m)).tolist()
    out = torch.zeros(m, hidden, dtype=out_dtype, device=device)
    for chunk, first in enumerate(range(0, m, block)):
        lo, hi = starts[chunk], starts[chunk + 1]
        n_rows = min(block, m - first)
        if lo == hi and finish is None:
            continue
        rows_here = index[0][lo:hi] - first
        used, column = torch.unique(index[1][lo:hi], return_inverse=True)  # sorted: entries keep their order
        total = None
        for start in range(0, len(used), block):
            here = (column >= start) & (column < start + block) if len(used) > block else slice(None)
            part = torch.sparse_coo_tensor(
                torch.stack([rows_here[here], column[here] - start]),
                values[lo:hi][here],
                (n_rows, min(block, len(used) - start)),
                is_coalesced=True,
                check_invariants=False,  # a coalesced tensor's own entries, renumbered in order
            ).to(device)
            gathered = source_matrix[used[start : start + block].to(device)].detach().to(dtype)
            product = torch.sparse.mm(part, gathered)
            del gathered
            total = product if total is None else total.add_(product)
        if total is None:  # no entries in these rows
            total = torch.zeros(n_rows, hidden, dtype=dtype, device=device)
        out[first : first + n_rows] = total if finish is None else finish(total, first, first + n_rows)
    return out


def cpu_normal(ctx: InitContext, shape: tuple[int, ...], like: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Standard normal noise from ``ctx.generator()`` (drawn on the CPU: the same rows on every device), on
    ``like``'s device."""
    return torch.randn(*shape, generator=ctx.generator(), dtype=dtype).to(like.device)


def initialize(model: Any, method: Any, ctx: InitContext) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows for ``ctx.plan.new_ids``: (input-embedding rows, LM-head rows or None when the head is tied).

    Computed in float32 on the rows each method uses, from the stored weights in their dtype (unscaled: a model
    that multiplies embeddings by sqrt(hidden) does so in its forward pass, not in the weight), on the model's
    device, and returned in float32.
    """
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is None or head.weight is emb or head.weight.data_ptr() == emb.data_ptr()
    return initialize_matrices(method, replace(ctx, model=model), emb, None if tied else head.weight)


Matrix = torch.Tensor | Callable[[], torch.Tensor]


def initialize_matrices(
    method: Any, ctx: InitContext, input_matrix: Matrix, head_matrix: Matrix | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`initialize` on given source matrices instead of a model: (input rows, head rows or None).

    ``method``: a name (its settings are ``ctx.options``, checked here), or a
    :class:`~vocgraft.init.choice.ChosenMethod`, whose settings were checked when it was chosen.
    ``head_matrix`` None means a tied head (or none). Either matrix may be a zero-argument callable returning it:
    it is called when its pass starts and released when the pass ends, so a caller that reads matrices from disk
    holds one of them at a time. A method that runs the model ("model" in its ``needs``) needs ``ctx.model``.
    """
    if isinstance(method, str):
        spec, options = get_method(method), method_options(method, ctx.options)
    else:
        spec, options = method.method, dict(method.options)
    if "model" in spec.needs and ctx.model is None:
        raise MethodInputError(f"init method {spec.name!r} runs the source model; it needs the loaded model.")
    ctx = replace(ctx, options=options)
    input_rows = _run(spec, _matrix(input_matrix), replace(ctx, space="input"))
    head_rows = None if head_matrix is None else _run(spec, _matrix(head_matrix), replace(ctx, space="head"))
    return input_rows, head_rows


def _matrix(given: Matrix) -> torch.Tensor:
    return given() if callable(given) and not isinstance(given, torch.Tensor) else given


def _run(method: Method, matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    n_new, hidden = len(ctx.plan.new_ids), matrix.shape[1]
    if n_new == 0:
        return torch.empty(0, hidden, dtype=torch.float32, device=matrix.device)
    if not matrix.is_floating_point():
        raise ValueError(f"init method {method.name!r}: the source matrix is {matrix.dtype}, not a float matrix.")
    with torch.no_grad():
        rows = method(matrix.detach(), ctx)  # in its own dtype: methods cast the rows they use to float32
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
