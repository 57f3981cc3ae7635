"""Expand a model's vocabulary: aux tokenizer -> top-k new tokens as real merges -> plan -> init -> surgery -> save.

expand_model("smollm2", corpus_lines, k=100, init="align", out_dir="out/el-k100")
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vocgraft.errors import UserError
from vocgraft.init import method_options
from vocgraft.models import load_tokenizer
from vocgraft.outdir import check_writable
from vocgraft.plan import VocabPlan
from vocgraft.recipes.common import (
    check_method_inputs,
    init_and_graft,
    method_resources,
    method_stats,
    open_source,
    save_adapted,
)
from vocgraft.tokenization import expand_tokenizer, train_tokenizer
from vocgraft.tokenization.expand import check_pair, expandable_family
from vocgraft.tokenization.marks import MarksChoice, check_setting, choose_keep_marks, follow_given
from vocgraft.tokenization.scripts import dominant_scripts
from vocgraft.tokenization.spec import tokenizer_family

# which auxiliary tokenizer kind can expand which source tokenizer family
AUX_KIND_FOR = {"byte-level-bpe": "bytelevel-bpe", "sentencepiece-bpe": "sp-bpe"}


class ExpandError(UserError, ValueError):
    """An expansion that cannot be done as asked; the message says what to change."""


@dataclass
class Expanded:
    model: Any
    tokenizer: Any
    plan: VocabPlan
    expansion: Any  # tokenization.Expansion
    timings: dict[str, float] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)  # what the init method reported (e.g. fallback shares)
    scripts: list[str] | None = None  # the writing systems wanted tokens were restricted to
    marks: MarksChoice | None = None  # whether the split regex was rewritten to keep combining marks, and why


def check_expandable(source_tokenizer, name: str | None = None) -> None:
    """Refuse, before any work, a source tokenizer expansion cannot edit (WordPiece, Unigram, ...); ``name``: the
    model spec, for the message."""
    try:
        expandable_family(source_tokenizer)
    except ValueError as exc:
        raise ExpandError(f"--model {name}: {exc}" if name else str(exc)) from None


def train_aux_tokenizer(source_tokenizer, lines: Sequence[str], vocab_size: int, seed: int = 0):
    """An auxiliary tokenizer of the family that can expand ``source_tokenizer`` (same pre-tokenization)."""
    check_expandable(source_tokenizer)
    return train_tokenizer(
        lines, AUX_KIND_FOR[tokenizer_family(source_tokenizer)], vocab_size, like=source_tokenizer, seed=seed
    )


def expand_loaded(
    model,
    source_tokenizer,
    lines: Sequence[str],
    k: int,
    init: str,
    *,
    aux_tokenizer=None,
    aux_vocab_size: int = 16000,
    protect: Sequence[str] | None = None,
    scripts: Collection[str] | str | None = "auto",
    seed: int = 0,
    resources: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    keep_marks: str = "auto",
) -> Expanded:
    """Expand an in-memory model in place (no I/O): the core of `vocgraft expand` and of the benchmarks.

    ``scripts``: the writing systems wanted tokens must use; "auto" = the dominant ones of ``lines``
    (:func:`~vocgraft.tokenization.scripts.dominant_scripts`), None = any.
    ``keep_marks``: auto/on/off, whether the expanded tokenizer's split regex keeps combining marks with their
    letters (:mod:`vocgraft.tokenization.marks`); with ``aux_tokenizer`` given, auto follows it. The init method
    still sees the source tokenizer as it was: its rows were learnt from that segmentation.
    """
    if k <= 0:
        raise ExpandError(f"--new-tokens must be positive, got {k}.")
    check_expandable(source_tokenizer)
    options = method_options(init, options)  # fail on a typo before any work
    timings = {}
    start = time.perf_counter()
    if aux_tokenizer is None:
        marks = choose_keep_marks(keep_marks, source_tokenizer, lines)
        splitting = marks.apply(source_tokenizer)  # the source as the expanded tokenizer will pre-tokenize
        aux_tokenizer = train_aux_tokenizer(splitting, lines, aux_vocab_size, seed)
    else:
        marks = follow_given(keep_marks, source_tokenizer, aux_tokenizer, "auxiliary")
        splitting = marks.apply(source_tokenizer)
    timings["aux_tokenizer_seconds"] = time.perf_counter() - start

    start = time.perf_counter()
    if scripts == "auto":
        scripts = dominant_scripts(lines)
    expansion = expand_tokenizer(splitting, aux_tokenizer, lines, k, protect=protect, scripts=scripts)
    target_tokenizer = expansion.tokenizer
    plan = VocabPlan.from_tokenizers(source_tokenizer, target_tokenizer, "expand")
    timings["expansion_seconds"] = time.perf_counter() - start

    timings["init_seconds"], resources = init_and_graft(
        model,
        plan,
        source_tokenizer,
        target_tokenizer,
        init,
        corpus=lines,
        seed=seed,
        resources=resources,
        aux_tokenizer=aux_tokenizer,
        options=options,
    )
    return Expanded(
        model, target_tokenizer, plan, expansion, timings, method_stats(resources), sorted(scripts or []) or None, marks
    )


def expand_model(
    model_spec: str,
    lines: Sequence[str],
    k: int,
    init: str,
    out_dir: str | Path,
    *,
    aux_tokenizer_spec: str | None = None,
    aux_vocab_size: int = 16000,
    protect: Sequence[str] | None = None,
    scripts: Collection[str] | str | None = "auto",
    seed: int = 0,
    overwrite: bool = False,
    inputs: dict | None = None,
    method_inputs: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    dtype: str = "auto",
    device: str = "auto",
    surgery: str = "auto",
    keep_marks: str = "auto",
) -> tuple[Path, Expanded]:
    """`vocgraft expand`: load, expand, initialize, and save an HF directory with plan and manifest.

    ``method_inputs``: the init method's user inputs (``{"target_plm": DIR}``); ``options``: its settings.
    ``dtype`` (auto: the source's) is the saved model's; ``surgery`` picks how the model is edited
    (:func:`~vocgraft.recipes.common.open_source`: on its files without loading it, or loaded on ``device``)."""
    check_writable(out_dir, overwrite)  # before minutes of work
    method_inputs = dict(method_inputs or {})
    options = method_options(init, options)
    check_method_inputs(init, method_inputs)
    check_setting(keep_marks)
    source_tokenizer = load_tokenizer(model_spec)
    check_expandable(source_tokenizer, str(model_spec))  # before the model is loaded
    aux = load_tokenizer(aux_tokenizer_spec) if aux_tokenizer_spec else None
    if aux is not None:  # before the model is loaded: a Unigram or WordPiece aux tokenizer cannot give merges
        try:
            check_pair(source_tokenizer, aux)
        except ValueError as exc:
            raise ExpandError(f"--aux-tokenizer {aux_tokenizer_spec}: {exc}") from None
    model, source_tokenizer, surgery_facts = open_source(
        model_spec, init, dtype=dtype, device=device, surgery=surgery, tokenizer=source_tokenizer
    )
    result = expand_loaded(
        model,
        source_tokenizer,
        lines,
        k,
        init,
        aux_tokenizer=aux,
        aux_vocab_size=aux_vocab_size,
        protect=protect,
        scripts=scripts,
        seed=seed,
        resources=method_resources(init, method_inputs),
        options=options,
        keep_marks=keep_marks,
    )
    manifest = {
        "inputs": {"model": model_spec, "aux_tokenizer": aux_tokenizer_spec, **method_inputs, **(inputs or {})},
        "method": {
            "stage": "expand",
            "init": init,
            "options": options,
            "new_tokens": k,
            "aux_vocab_size": aux_vocab_size,
            "scripts": result.scripts,
            "keep_marks": result.marks.to_dict(),
        },
        "seed": seed,
        "source_model": model_spec,
        "plan": result.plan.summary(),
        "expansion": {
            key: v
            for key, v in result.expansion.to_dict().items()
            if key
            in (
                "added",
                "wanted",
                "intermediate_count",
                "first_new_id",
                "candidates_considered",
                "skipped_count",
                "skipped_reasons",
            )
        },
        "timings": result.timings,
        "init_stats": result.stats,
        "surgery": surgery_facts,
    }
    out = save_adapted(
        result.model,
        result.tokenizer,
        result.plan,
        out_dir,
        overwrite=overwrite,
        manifest=manifest,
        extra_json={"vocgraft-expansion.json": result.expansion.to_dict()},
    )
    return out, result
