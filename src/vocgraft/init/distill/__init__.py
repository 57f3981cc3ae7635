"""Distillation initialization: new input rows learned from the frozen model itself, output rows fitted to the
canonical next token.

**Input rows** (Token Distillation, Dobler, Elliott & de Melo 2025, arXiv 2505.20133; :mod:`.input_rows`). Subword
averaging only looks at the embedding matrix, but a word spelled by several pieces is put together by the model's
first layers. So: take corpus snippets that contain the new token (:mod:`.snippets`), run the frozen source model
on the snippet as the *source* tokenizer spells it (the teacher), and optimize the new rows so that the model fed
the snippet with the new token (the student) produces the same final hidden states at the new token (matched with
the teacher's state after the token's last old piece) and at every position after it. Only the new rows are
trained; the model is frozen and never written to. As in the paper: start from Mean, MSE on the last layer's
(normed) hidden states, snippets centred on an occurrence, a BOS-like prefix token, Adam.

Where we differ, and why (each a setting): ``distill_merge all`` (ours; the paper's ``one`` is the default) spells
the snippet as the expanded tokenizer does, every new token merged, so one snippet trains every new token in it;
the teacher runs once and its states are cached; each row takes an Adam step only when its token is in the batch
(a lazy per-row Adam); the learning rate is in units of the source rows' RMS.

**Output rows** (:mod:`.output_rows`). The paper trains an untied head's new rows by next-token prediction; so do
we, cheaply: the body is frozen and reads the distilled input rows, the text is the snippets' windows as the
expanded tokenizer spells them, and only the new output rows move (a convex fit next to the fixed old logits,
anchored at each token's first piece's row). Untied source, or ``untie_head`` (the default, read by the recipe:
a tied model gets its own head before the init stage, so the output is untied, +|V| x hidden parameters): the head
pass fits the head rows this way. Tied source kept tied (``--no-untie-head``): one row serves both goals;
``distill_head_weight`` weighs the next-token loss next to the distillation loss (each relative to its value at
the start); 0 is the paper's input-only objective.

**Speed** (:mod:`.precision`, ``distill_dtype``). The model is frozen, so its forward passes (teacher, student,
head states) run in bfloat16 where the device runs it natively (a GPU; a CPU with AVX512-BF16 or AMX), on a
bfloat16 copy of the weights put back bit for bit afterwards; the trained rows, their Adam state, the losses and
the head fit's rows stay float32 (the fit's matmuls then take bfloat16 inputs, float32 sums). ``float32`` is the
exact path. Every forward pass runs once per batch: the teacher's states are cached, the student's backward
reaches only the new rows (no parameter requires a gradient), batches are grouped by length (little padding).

New tokens that never occur in the corpus keep their start rows (input: ``distill_start``; head: Mean of head
rows, pushed down by the fit wherever they would fire). In replace mode the same applies to new tokens the source
tokenizer cannot spell byte for byte.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np
import torch

from vocgraft.devices import dtype_name
from vocgraft.init import InitContext, Option, check_source_matrix, get_method, register, source_blocks
from vocgraft.init.distill.input_rows import frozen, teacher_targets, train_input_rows
from vocgraft.init.distill.output_rows import (
    canonical_text,
    canonical_windows,
    ce_loss_and_grad,
    fit_head_rows,
    student_states,
)
from vocgraft.init.distill.precision import DTYPES, compute_dtype, computing_in, fit_matmuls, student_attention
from vocgraft.init.distill.snippets import Vocab, byte_lengths, collect_snippets, prefix_id
from vocgraft.init.mean import source_pieces, target_forms

MERGES = ("one", "all")
STARTS = ("mean", "align")
HEAD_POSITIONS = 32768  # canonical positions the output rows are fitted on (memory: positions x hidden floats)
# sequences per forward pass without a gradient (teacher, the student's states for the output rows): on 2 CPU cores
# SmolLM2 reads ~35% more tokens/s at 32 than at 8; the results do not depend on it
STATE_BATCH = 32

OPTIONS = (
    Option(
        "distill_snippets", 8, "distill: corpus snippets per new token (the paper uses 100)", minimum=1, maximum=10_000
    ),
    Option(
        "distill_length",
        24,
        "distill: snippet length in target tokens, the new token in the middle (paper: 50)",
        minimum=1,
        maximum=4096,
    ),
    Option(
        "distill_epochs",
        2,
        "distill: passes over the snippets (a row takes one step per batch with its token); 0 keeps the start "
        "input rows (only the output rows are fitted)",
        minimum=0,
        maximum=1000,
    ),
    Option(
        "distill_lr",
        0.05,
        "distill: Adam learning rate, in units of the source rows' RMS",
        minimum=0,
        above=True,
        maximum=100,
    ),
    Option(
        "distill_batch",
        8,
        "distill: snippets per forward pass (smaller: more steps per row for the same work)",
        minimum=1,
        maximum=4096,
    ),
    Option(
        "distill_merge",
        "one",
        "distill: which new tokens a snippet spells with their new id: one (the snippet's own token, the paper's "
        "form) or all (ours: every new token, as the expanded tokenizer spells it)",
        choices=MERGES,
    ),
    Option(
        "distill_start",
        "mean",
        "distill: start rows, and rows of tokens without snippets: mean or align",
        choices=STARTS,
    ),
    Option(
        "distill_head_weight",
        1.0,
        "distill, tied head: weight of the next-token loss of the shared rows next to the distillation loss (0: "
        "input goal only, the paper's form)",
        minimum=0,
        maximum=1000,
    ),
    Option(
        "distill_ridge",
        0.3,
        "distill, output rows: pull towards the token's first piece's row (dimensionless: like that many "
        "observations of a typical context)",
        minimum=0,
        maximum=1e6,
    ),
    Option(
        "distill_dtype",
        "auto",
        "distill: dtype of the frozen model's forward passes (the rows, their optimizer and the head fit stay "
        "float32): auto (bfloat16 where the device runs it natively, else the model's own), float32 or bfloat16",
        choices=DTYPES,
    ),
    Option(
        "untie_head",
        True,
        "distill: give a tied model its own LM head first, so input and output rows are fitted separately (the "
        "output is untied, +|V| x hidden parameters); --no-untie-head keeps one row for both",
    ),
)


def _vocab(ctx: InitContext) -> Vocab:
    plan = ctx.plan
    n_target = len(plan.target_tokens)
    source_of_target = np.full(n_target, -1, dtype=np.int64)
    for t, s in plan.copied.items():
        source_of_target[t] = s
    new_index = np.full(n_target, -1, dtype=np.int64)
    new_index[np.asarray(plan.new_ids, dtype=np.int64)] = np.arange(len(plan.new_ids))
    pieces, exact = _pieces(ctx)
    trainable = np.array([e and len(p) > 0 for p, e in zip(pieces, exact)], dtype=bool)
    return Vocab(
        source_of_target,
        new_index,
        trainable,
        byte_lengths(ctx.target_tokenizer),
        byte_lengths(ctx.source_tokenizer),
        prefix_id(ctx.source_tokenizer),
    )


def _pieces(ctx: InitContext) -> tuple[list[list[int]], list[bool]]:
    """Each new token's source pieces, and whether they spell it byte for byte (cached across passes)."""
    cached = ctx.resources.get("distill_pieces")
    if cached is None:
        forms = target_forms(ctx.plan, ctx.plan.new_ids, ctx.target_tokenizer)
        pairs = [source_pieces(ctx.source_tokenizer, f, ctx.n_source) if f else ([], False) for f in forms]
        cached = ctx.resources["distill_pieces"] = ([p for p, _ in pairs], [e for _, e in pairs])
    return cached


def _prepare(ctx: InitContext) -> dict[str, Any]:
    """Snippets and the teacher pass, once per model (the head pass of an untied model reuses them)."""
    opts = ctx.options
    # what the snippets and the teacher pass depend on besides the plan, corpus and model; a cache made with
    # other settings (a caller reusing resources across runs) is not reused
    names = ("distill_snippets", "distill_length", "distill_merge", "distill_dtype")
    key = tuple(opts[name] for name in names) + (ctx.seed,)
    cached = ctx.resources.get("distill_data")
    if cached is not None and cached["key"] == key:
        if "distill_stats" not in ctx.resources:  # a new run on the same data: its own statistics
            ctx.resources["distill_stats"] = {**cached["stats"], "teacher_reused": True}
        return cached
    show = len(ctx.plan.new_ids) > 50
    # the forward passes' dtype, decided once: the input and head passes (and their caches) use the same
    dtype, why = compute_dtype(ctx.model, opts["distill_dtype"])
    t0 = time.perf_counter()
    vocab = _vocab(ctx)
    snippets, got = collect_snippets(
        ctx.corpus or [],
        ctx.source_tokenizer,
        ctx.target_tokenizer,
        vocab,
        per_token=opts["distill_snippets"],
        length=opts["distill_length"],
        merge=opts["distill_merge"],
        seed=ctx.seed,
        show_progress=show,
    )
    t1 = time.perf_counter()
    with computing_in(ctx.model, dtype):
        targets = teacher_targets(ctx.model, snippets, batch=STATE_BATCH, show_progress=show)
    t2 = time.perf_counter()
    covered = got > 0
    data = {
        "key": key,
        "dtype": dtype,
        "snippets": snippets,
        "targets": targets,
        "covered": covered,
        "stats": {
            "snippets": len(snippets),
            "student_tokens": int(sum(len(s.student) for s in snippets)),
            "teacher_tokens": int(sum(len(s.teacher) for s in snippets)),
            "tokens_trained": int(covered.sum()),
            "tokens_without_snippets": int((~covered).sum()),
            "tokens_not_spelled_by_source": int((~vocab.trainable).sum()),
            "snippet_seconds": t1 - t0,
            "teacher_seconds": t2 - t1,
            "device": str(next(ctx.model.parameters()).device),
            "compute_dtype": dtype_name(dtype),
            "compute_dtype_why": why,
        },
    }
    ctx.resources["distill_data"] = data
    ctx.resources["distill_stats"] = dict(data["stats"])
    return data


def _canonical_text(ctx: InitContext, data: dict, head_matrix: torch.Tensor, input_rows: torch.Tensor):
    """The fixed part of the output rows' loss: the model reading ``input_rows`` over the snippets' canonical
    windows, with the old output rows ``head_matrix``."""
    windows = canonical_windows(data["snippets"], HEAD_POSITIONS)
    device = next(ctx.model.parameters()).device
    with computing_in(ctx.model, data["dtype"]):
        hidden, next_ids = student_states(
            ctx.model, windows, input_rows.to(device), batch=STATE_BATCH, show_progress=len(ctx.plan.new_ids) > 50
        )
    return canonical_text(ctx.model, head_matrix, hidden, next_ids)


def _rms(matrix: torch.Tensor, ctx: InitContext) -> float:
    """Root mean square of the real source rows' entries (the step size scales with it), block by block."""
    squares, count = 0.0, 0
    for rows in source_blocks(matrix, ctx):
        squares += float(rows.square().sum(dtype=torch.float64))
        count += rows.numel()
    return math.sqrt(squares / max(count, 1))


def _tied(model) -> bool:
    head = model.get_output_embeddings()
    return head is None or head.weight is model.get_input_embeddings().weight


@register(
    "distill",
    needs=("corpus", "model"),
    options=OPTIONS,
    summary="new input rows distilled from the frozen model's hidden states on corpus snippets (Token "
    "Distillation); output rows fitted to the canonical next token with the body frozen",
    reference="Dobler, Elliott & de Melo 2025, arXiv 2505.20133 (input rows); cheap frozen-body output fit: vocgraft",
)
def distill(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    """Distilled input rows (``ctx.space == "input"``) or fitted head rows (``"head"``, untied models)."""
    if ctx.corpus is None:
        raise ValueError("init method 'distill' needs a corpus: pass the target-language text (--corpus).")
    if ctx.model is None:
        raise ValueError("init method 'distill' runs the source model; call it through vocgraft.init.initialize.")
    opts = ctx.options
    matrix = source_matrix.detach().cpu()  # start rows and head fit on the CPU; forward passes on the model's device
    check_source_matrix(matrix, ctx)
    start = get_method(opts["distill_start"])(matrix, ctx)
    model = ctx.model
    with frozen(model):
        data = _prepare(ctx)
        stats = ctx.resources["distill_stats"]
        if ctx.space == "head":
            return _head_rows(matrix, start, data, ctx, stats)
        return _input_rows(matrix, start, data, ctx, stats)


def _input_rows(matrix: torch.Tensor, start: torch.Tensor, data: dict, ctx: InitContext, stats: dict) -> torch.Tensor:
    opts, model = ctx.options, ctx.model
    t0 = time.perf_counter()
    tied = _tied(model)
    # an untied model's input rows do not depend on the head settings: a caller trying several (a benchmark
    # passing the resources on) trains them once
    key = (data["key"], *(opts[n] for n in ("distill_epochs", "distill_batch", "distill_lr", "distill_start")))
    cached = ctx.resources.get("distill_input")
    if not tied and cached is not None and cached["key"] == key:
        stats["input"] = {**cached["history"], "reused": True}
        return cached["rows"].clone()
    if tied and opts["distill_epochs"] == 0:
        warnings.warn(
            "--distill-epochs 0 with a tied head kept tied (--no-untie-head) leaves the start rows "
            f"({opts['distill_start']}) as they are: the result is labelled distill but is not its work.",
            stacklevel=2,
        )
    head = None
    if tied and opts["distill_head_weight"] > 0 and opts["distill_epochs"] > 0:
        text = _canonical_text(ctx, data, matrix, start)

        def head(rows):
            with fit_matmuls(data["dtype"]):
                loss, grad = ce_loss_and_grad(rows.cpu(), text)
            return loss, grad.to(rows.device)

    device = next(model.parameters()).device
    with computing_in(model, data["dtype"]), student_attention(model):
        rows, history = train_input_rows(
            model,
            data["snippets"],
            data["targets"],
            start,
            torch.from_numpy(data["covered"]).to(device),
            epochs=opts["distill_epochs"],
            batch=opts["distill_batch"],
            lr=opts["distill_lr"] * _rms(matrix, ctx),
            seed=ctx.seed,
            head=head,
            head_weight=opts["distill_head_weight"] if tied else 0.0,
            show_progress=len(ctx.plan.new_ids) > 50,
        )
    rows = rows.cpu()
    stats["input"] = {**history, "seconds": time.perf_counter() - t0, "tied_head": tied}
    ctx.resources["distill_input"] = {"key": key, "rows": rows, "history": stats["input"]}
    return rows


def _head_rows(matrix: torch.Tensor, start: torch.Tensor, data: dict, ctx: InitContext, stats: dict) -> torch.Tensor:
    """Head rows fitted to the canonical next token on the student's states, from each seen token's first piece's
    head row (unseen tokens: from their start rows)."""
    trained = ctx.resources.get("distill_input")
    if trained is None:
        raise ValueError("distill's head pass reads the input rows its input pass trained; run the input pass first.")
    t0 = time.perf_counter()
    text = _canonical_text(ctx, data, matrix, trained["rows"])
    pieces, _ = _pieces(ctx)
    first = torch.tensor([p[0] if p else 0 for p in pieces], dtype=torch.long)
    seen = torch.zeros(len(pieces), dtype=torch.bool)
    seen[text.target[text.target >= 0]] = True
    seen &= torch.tensor([bool(p) for p in pieces])
    anchor = torch.where(seen.unsqueeze(1), matrix[first].float(), start.float())
    t1 = time.perf_counter()
    with fit_matmuls(data["dtype"]):
        rows, fit_stats = fit_head_rows(text, anchor, ctx.options["distill_ridge"])
    stats["head"] = {
        **fit_stats,
        "rows_seen": int(seen.sum()),
        "states_seconds": t1 - t0,
        "fit_seconds": time.perf_counter() - t1,
    }
    return rows
