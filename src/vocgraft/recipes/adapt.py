"""The one adaptation recipe: load -> vocabulary step -> init -> graft -> save, with the checks, manifest and save
written once. What differs between `vocgraft expand` and `vocgraft replace` is the vocabulary step, a part
(:class:`~vocgraft.recipes.expand.ExpandStep`, :class:`~vocgraft.recipes.replace.ReplaceStep`) that makes the
target tokenizer and the plan and says what the manifest records of it.

adapt_model("smollm2", lines, ExpandStep(k=100), "align", "out/el-k100")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vocgraft.init.choice import ChosenMethod
from vocgraft.outdir import check_writable
from vocgraft.plan import VocabPlan
from vocgraft.recipes.common import choose_method, init_and_graft, method_resources, method_stats, open_source
from vocgraft.recipes.editable import editable
from vocgraft.tokenization.marks import MarksChoice, check_setting


@dataclass
class Vocabulary:
    """What a vocabulary step made: the target tokenizer and the plan from the source's ids to its ids."""

    tokenizer: Any
    plan: VocabPlan
    marks: MarksChoice  # whether its split regex keeps combining marks with their letters, and why
    timings: dict[str, float]
    aux_tokenizer: Any = None  # expand: the tokenizer the new tokens came from (an init method input)
    expansion: Any = None  # expand: the tokenization.Expansion
    scripts: list[str] | None = None  # expand: the writing systems wanted tokens were restricted to


@dataclass
class Adapted:
    """An adapted model in memory (expand's and replace's result)."""

    model: Any
    tokenizer: Any
    plan: VocabPlan
    timings: dict[str, float] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)  # what the init method reported (e.g. fallback shares)
    marks: MarksChoice | None = None
    expansion: Any = None  # expand only
    scripts: list[str] | None = None  # expand only


class VocabularyStep(Protocol):
    """The part of the recipe that differs between expand and replace."""

    mode: str  # "expand" or "replace": the manifest's stage
    keep_marks: str  # --keep-marks: auto, on or off

    def before_load(self, model_spec: str) -> Any:
        """Checks and loads that can fail before the model is loaded; the source tokenizer if it loaded it."""

    def vocabulary(self, source_tokenizer: Any, lines: Sequence[str], seed: int) -> Vocabulary: ...

    def given(self) -> dict[str, Any]:
        """The manifest's inputs of this step (the tokenizer given by path)."""

    def settings(self, result: Adapted) -> dict[str, Any]:
        """The manifest's method settings of this step."""

    def facts(self, result: Adapted) -> dict[str, Any]:
        """More manifest sections (after the plan)."""

    def files(self, result: Adapted) -> dict[str, Any]:
        """More JSON files to save beside the model."""


def adapt_loaded(
    model,
    source_tokenizer,
    lines: Sequence[str],
    step: VocabularyStep,
    chosen: ChosenMethod,
    *,
    seed: int = 0,
    resources: dict[str, Any] | None = None,
) -> Adapted:
    """Adapt an in-memory model in place (no I/O). The init method sees the source tokenizer as it was: its rows
    were learnt from that segmentation."""
    vocab = step.vocabulary(source_tokenizer, lines, seed)
    timings = dict(vocab.timings)
    timings["init_seconds"], resources = init_and_graft(
        model,
        vocab.plan,
        source_tokenizer,
        vocab.tokenizer,
        chosen,
        corpus=lines,
        seed=seed,
        resources=resources,
        aux_tokenizer=vocab.aux_tokenizer,
    )
    stats = method_stats(resources)
    return Adapted(model, vocab.tokenizer, vocab.plan, timings, stats, vocab.marks, vocab.expansion, vocab.scripts)


def adapt_model(
    model_spec: str,
    lines: Sequence[str],
    step: VocabularyStep,
    init: str | ChosenMethod,
    out_dir: str | Path,
    *,
    seed: int = 0,
    overwrite: bool = False,
    inputs: dict | None = None,
    method_inputs: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    dtype: str = "auto",
    device: str = "auto",
    surgery: str = "auto",
) -> tuple[Path, Adapted]:
    """`vocgraft expand` / `vocgraft replace`: load, adapt, save an HF directory with plan and manifest.

    ``init``: the method's name with its settings ``options`` and user inputs ``method_inputs``
    (``{"target_plm": DIR}``), or a ChosenMethod. ``dtype`` (auto: the source's) is the saved model's;
    ``surgery`` picks how the model is edited (:func:`~vocgraft.recipes.common.open_source`: on its files without
    loading it, or loaded on ``device``). ``inputs``: more facts for the manifest (the corpus)."""
    check_writable(out_dir, overwrite)  # before minutes of work
    chosen = choose_method(init, options, method_inputs)
    check_setting(step.keep_marks)
    source_tokenizer = step.before_load(model_spec)
    model, source_tokenizer, surgery_facts = open_source(
        model_spec, chosen, dtype=dtype, device=device, surgery=surgery, tokenizer=source_tokenizer
    )
    resources = method_resources(chosen)
    result = adapt_loaded(model, source_tokenizer, lines, step, chosen, seed=seed, resources=resources)
    manifest = {
        "inputs": {"model": model_spec, **step.given(), **chosen.inputs, **(inputs or {})},
        "method": {"stage": step.mode, "init": chosen.name, "options": chosen.options, **step.settings(result)},
        "seed": seed,
        "source_model": model_spec,
        "plan": result.plan.summary(),
        **step.facts(result),
        "timings": result.timings,
        "init_stats": result.stats,
        "surgery": surgery_facts,
    }
    extra = {"vocgraft-plan.json": result.plan.to_dict(), **step.files(result)}
    out = editable(result.model).save(
        result.tokenizer, out_dir, overwrite=overwrite, manifest=manifest, extra_json=extra
    )
    return out, result
