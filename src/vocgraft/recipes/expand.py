"""Expand a model's vocabulary: aux tokenizer -> top-k new tokens as real merges -> plan -> init -> surgery -> save.

expand_model("smollm2", corpus_lines, k=100, init="align", out_dir="out/el-k100")

The vocabulary step is :class:`ExpandStep`; the rest of the recipe is :mod:`vocgraft.recipes.adapt`'s.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from vocgraft.errors import UserError
from vocgraft.init.choice import choose
from vocgraft.models import load_tokenizer
from vocgraft.plan import VocabPlan
from vocgraft.recipes.adapt import Adapted, Vocabulary, adapt_loaded, adapt_model
from vocgraft.settings.adapt import AUX_VOCAB_SIZE
from vocgraft.tokenization import expand_tokenizer, train_tokenizer
from vocgraft.tokenization.expand import check_pair, expandable_family
from vocgraft.tokenization.family_rules import kind_like
from vocgraft.tokenization.marks import choose_keep_marks, follow_given
from vocgraft.tokenization.scripts import dominant_scripts

Expanded = Adapted  # expand's result: the one recipe's (older name)
# what the manifest keeps of the expansion (vocgraft-expansion.json has all of it)
EXPANSION_FACTS = (
    "added",
    "wanted",
    "intermediate_count",
    "first_new_id",
    "candidates_considered",
    "skipped_count",
    "skipped_reasons",
)


class ExpandError(UserError, ValueError):
    """An expansion that cannot be done as asked; the message says what to change."""


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
    return train_tokenizer(lines, kind_like(source_tokenizer), vocab_size, like=source_tokenizer, seed=seed)


@dataclass
class ExpandStep:
    """The vocabulary step of `vocgraft expand`: ``k`` new tokens, real merges of an auxiliary tokenizer (given,
    or trained on the corpus like the source), appended after the source's.

    ``scripts``: the writing systems wanted tokens must use; "auto" = the dominant ones of the corpus
    (:func:`~vocgraft.tokenization.scripts.dominant_scripts`), None = any. ``keep_marks``: auto/on/off, whether
    the expanded tokenizer's split regex keeps combining marks with their letters
    (:mod:`vocgraft.tokenization.marks`); with an aux tokenizer given, auto follows it."""

    mode: ClassVar[str] = "expand"
    k: int
    aux_tokenizer: Any = None  # loaded; None: trained on the corpus (or loaded from aux_tokenizer_spec)
    aux_tokenizer_spec: str | None = None
    aux_vocab_size: int = AUX_VOCAB_SIZE.default
    protect: Sequence[str] | None = None
    scripts: Collection[str] | str | None = "auto"
    keep_marks: str = "auto"

    def __post_init__(self):
        if self.k <= 0:
            raise ExpandError(f"--new-tokens must be positive, got {self.k}.")

    def before_load(self, model_spec: str):
        """The source tokenizer, checked expandable, and the given aux tokenizer, checked against it: a Unigram or
        WordPiece one cannot give merges."""
        source_tokenizer = load_tokenizer(model_spec)
        check_expandable(source_tokenizer, str(model_spec))
        if self.aux_tokenizer_spec:
            self.aux_tokenizer = load_tokenizer(self.aux_tokenizer_spec)
            try:
                check_pair(source_tokenizer, self.aux_tokenizer)
            except ValueError as exc:
                raise ExpandError(f"--aux-tokenizer {self.aux_tokenizer_spec}: {exc}") from None
        return source_tokenizer

    def train_tokenizer(self, source_tokenizer, lines: Sequence[str], seed: int = 0):
        """(aux tokenizer trained on ``lines``, marks choice): the pipeline's tokenizer stage, and this step's
        when none is given. An expansion keeps the source's pre-tokenizer, so marks are decided on the source."""
        marks = choose_keep_marks(self.keep_marks, source_tokenizer, lines)
        splitting = marks.apply(source_tokenizer)  # the source as the expanded tokenizer will pre-tokenize
        return train_aux_tokenizer(splitting, lines, self.aux_vocab_size, seed), marks

    def vocabulary(self, source_tokenizer, lines: Sequence[str], seed: int) -> Vocabulary:
        check_expandable(source_tokenizer)
        timings = {}
        start = time.perf_counter()
        aux = self.aux_tokenizer
        if aux is None:
            aux, marks = self.train_tokenizer(source_tokenizer, lines, seed)
        else:
            marks = follow_given(self.keep_marks, source_tokenizer, aux, "auxiliary")
        splitting = marks.apply(source_tokenizer)
        timings["aux_tokenizer_seconds"] = time.perf_counter() - start

        start = time.perf_counter()
        scripts = dominant_scripts(lines) if self.scripts == "auto" else self.scripts
        expansion = expand_tokenizer(splitting, aux, lines, self.k, protect=self.protect, scripts=scripts)
        plan = VocabPlan.from_tokenizers(source_tokenizer, expansion.tokenizer, "expand")
        timings["expansion_seconds"] = time.perf_counter() - start
        scripts = sorted(scripts or []) or None
        return Vocabulary(expansion.tokenizer, plan, marks, timings, aux, expansion, scripts)

    def given(self) -> dict[str, Any]:
        return {"aux_tokenizer": self.aux_tokenizer_spec}

    def settings(self, result: Adapted) -> dict[str, Any]:
        return {
            "new_tokens": self.k,
            "aux_vocab_size": self.aux_vocab_size,
            "scripts": result.scripts,
            "keep_marks": result.marks.to_dict(),
        }

    def facts(self, result: Adapted) -> dict[str, Any]:
        return {"expansion": {k: v for k, v in result.expansion.to_dict().items() if k in EXPANSION_FACTS}}

    def files(self, result: Adapted) -> dict[str, Any]:
        return {"vocgraft-expansion.json": result.expansion.to_dict()}


def expand_loaded(
    model,
    source_tokenizer,
    lines: Sequence[str],
    k: int,
    init: str,
    *,
    aux_tokenizer=None,
    aux_vocab_size: int = AUX_VOCAB_SIZE.default,
    protect: Sequence[str] | None = None,
    scripts: Collection[str] | str | None = "auto",
    seed: int = 0,
    resources: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    keep_marks: str = "auto",
) -> Adapted:
    """Expand an in-memory model in place (no I/O): the core of `vocgraft expand` and of the benchmarks
    (:class:`ExpandStep` has the settings)."""
    step = ExpandStep(k, aux_tokenizer, None, aux_vocab_size, protect, scripts, keep_marks)
    return adapt_loaded(model, source_tokenizer, lines, step, choose(init, options), seed=seed, resources=resources)


def expand_model(
    model_spec: str,
    lines: Sequence[str],
    k: int,
    init: str,
    out_dir: str | Path,
    *,
    aux_tokenizer_spec: str | None = None,
    aux_vocab_size: int = AUX_VOCAB_SIZE.default,
    protect: Sequence[str] | None = None,
    scripts: Collection[str] | str | None = "auto",
    seed: int = 0,
    keep_marks: str = "auto",
    **recipe,
) -> tuple[Path, Adapted]:
    """`vocgraft expand`: load, expand, initialize, and save an HF directory with plan and manifest.

    ``recipe``: overwrite, inputs, method_inputs, options, dtype, device, surgery
    (:func:`~vocgraft.recipes.adapt.adapt_model`)."""
    step = ExpandStep(k, None, aux_tokenizer_spec, aux_vocab_size, protect, scripts, keep_marks)
    return adapt_model(model_spec, lines, step, init, out_dir, seed=seed, **recipe)
