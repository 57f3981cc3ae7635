"""Replace a model's tokenizer: target tokenizer (given or trained) -> plan (overlap copied) -> init -> surgery -> save.

replace_model("smollm2", corpus_lines, init="focus", out_dir="out/el-focus", target_vocab_size=50000)

The vocabulary step is :class:`ReplaceStep`; the rest of the recipe is :mod:`vocgraft.recipes.adapt`'s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from vocgraft.compat import add_extra_special_tokens
from vocgraft.errors import UserError
from vocgraft.init.choice import choose
from vocgraft.models import load_tokenizer
from vocgraft.plan import VocabPlan
from vocgraft.recipes.adapt import Adapted, Vocabulary, adapt_loaded, adapt_model
from vocgraft.settings.common import VOCAB_SIZE
from vocgraft.tokenization import train_tokenizer
from vocgraft.tokenization.family_rules import kind_like, marks_rule_applies, trained_like
from vocgraft.tokenization.marks import MarksChoice, check_setting, choose_keep_marks, follow_given
from vocgraft.tokenization.spec import tokenizer_family
from vocgraft.tokenization.train import keep_ignore_merges

ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")
Replaced = Adapted  # replace's result: the one recipe's (older name)


class ReplaceError(UserError, ValueError):
    """A replacement that cannot be done as asked; the message says what to change."""


def with_source_specials(source_tokenizer, target_tokenizer):
    """The target tokenizer in the source's conventions: the source's special and added tokens it lacks (chat
    markers, control tokens) are added, so they are copied by name rather than lost; each role the source has
    (bos, eos, unk, pad) is held by the source's own token, so the model still ends its text with the token it was
    trained to end with; the source's chat template replaces the target's."""
    from vocgraft.plan import missing_special_tokens

    missing = missing_special_tokens(source_tokenizer, target_tokenizer)
    if missing:
        add_extra_special_tokens(target_tokenizer, missing)
    for role in ROLES:
        token = getattr(source_tokenizer, role, None)
        if token is not None and getattr(target_tokenizer, role, None) != token:
            setattr(target_tokenizer, role, token)
    if getattr(source_tokenizer, "chat_template", None):
        target_tokenizer.chat_template = source_tokenizer.chat_template
    return target_tokenizer


def target_tokenizer_for(
    source_tokenizer,
    lines: Sequence[str],
    given=None,
    *,
    kind: str | None,
    vocab_size: int,
    seed: int = 0,
    marks: MarksChoice | None = None,
):
    """The tokenizer that replaces the source's: ``given``, or one trained on ``lines`` (by default of the
    source's own family, resembling the source: its pre-tokenization or SentencePiece layout and its special
    tokens; a byte-level one keeps combining marks if ``marks`` says so, and the source's ``ignore_merges``), plus
    the source's special tokens and roles (:func:`with_source_specials`)."""
    if given is None:
        kind = kind or kind_like(source_tokenizer)
        if kind is None:
            family = tokenizer_family(source_tokenizer)
            raise ReplaceError(f"no default target tokenizer kind for a {family} source; pass --kind or --tokenizer.")
        like = trained_like(kind, source_tokenizer)
        copies_regex = marks_rule_applies(kind, like)  # a byte-level target copying the source's split regex
        if copies_regex and marks:
            like = marks.apply(source_tokenizer)
        given = train_tokenizer(lines, kind, vocab_size, like=like, seed=seed)
        if copies_regex:
            keep_ignore_merges(source_tokenizer, given)
    return with_source_specials(source_tokenizer, given)


def target_marks(setting: str, source_tokenizer, lines: Sequence[str], given=None, kind: str | None = None):
    """Whether the target tokenizer keeps combining marks with their letters (see ``--keep-marks``): a given one
    is followed; a trained byte-level one keeps them as :func:`~vocgraft.tokenization.marks.choose_keep_marks`
    decides; SentencePiece kinds keep them anyway."""
    if given is not None:
        return follow_given(setting, source_tokenizer, given, "target")
    kind = kind or kind_like(source_tokenizer)
    if not marks_rule_applies(kind, source_tokenizer):
        check_setting(setting)
        return MarksChoice(setting, False, f"a {kind} target tokenizer does not split marks from letters")
    return choose_keep_marks(setting, source_tokenizer, lines)


@dataclass
class ReplaceStep:
    """The vocabulary step of `vocgraft replace`: the target tokenizer (given, or trained on the corpus: of
    ``target_kind``, by default the source's own family) and the plan that copies the rows of the tokens both
    have. ``keep_marks``: auto/on/off for a trained byte-level target tokenizer (:func:`target_marks`)."""

    mode: ClassVar[str] = "replace"
    target_tokenizer: Any = None  # loaded; None: trained on the corpus (or loaded from tokenizer_spec)
    tokenizer_spec: str | None = None
    target_kind: str | None = None
    target_vocab_size: int = VOCAB_SIZE.default
    keep_marks: str = "auto"

    def before_load(self, model_spec: str):
        """Loads the given target tokenizer; the model's own tokenizer is loaded with the model."""
        if self.tokenizer_spec:
            self.target_tokenizer = load_tokenizer(self.tokenizer_spec)
        return None

    def train_tokenizer(self, source_tokenizer, lines: Sequence[str], seed: int = 0):
        """(the target tokenizer, marks choice): given or trained on ``lines``; the pipeline's tokenizer stage."""
        given = self.target_tokenizer
        marks = target_marks(self.keep_marks, source_tokenizer, lines, given, self.target_kind)
        tokenizer = target_tokenizer_for(
            source_tokenizer,
            lines,
            given,
            kind=self.target_kind,
            vocab_size=self.target_vocab_size,
            seed=seed,
            marks=marks,
        )
        return tokenizer, marks

    def vocabulary(self, source_tokenizer, lines: Sequence[str], seed: int) -> Vocabulary:
        timings = {}
        start = time.perf_counter()
        tokenizer, marks = self.train_tokenizer(source_tokenizer, lines, seed)
        timings["target_tokenizer_seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        plan = VocabPlan.from_tokenizers(source_tokenizer, tokenizer, "replace")
        timings["plan_seconds"] = time.perf_counter() - start
        return Vocabulary(tokenizer, plan, marks, timings)

    def given(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer_spec}

    def settings(self, result: Adapted) -> dict[str, Any]:
        return {
            "target_kind": self.target_kind,
            "target_vocab_size": len(result.tokenizer),
            "keep_marks": result.marks.to_dict(),
        }

    def facts(self, result: Adapted) -> dict[str, Any]:
        return {}

    def files(self, result: Adapted) -> dict[str, Any]:
        return {}


def replace_loaded(
    model,
    source_tokenizer,
    lines: Sequence[str],
    init: str,
    *,
    target_tokenizer=None,
    target_kind: str | None = None,
    target_vocab_size: int = VOCAB_SIZE.default,
    resources: dict[str, Any] | None = None,
    seed: int = 0,
    options: dict[str, Any] | None = None,
    keep_marks: str = "auto",
) -> Adapted:
    """Replace the tokenizer of an in-memory model in place (no I/O): the core of `vocgraft replace`
    (:class:`ReplaceStep` has the settings)."""
    step = ReplaceStep(target_tokenizer, None, target_kind, target_vocab_size, keep_marks)
    return adapt_loaded(model, source_tokenizer, lines, step, choose(init, options), seed=seed, resources=resources)


def replace_model(
    model_spec: str,
    lines: Sequence[str],
    init: str,
    out_dir: str | Path,
    *,
    tokenizer_spec: str | None = None,
    target_kind: str | None = None,
    target_vocab_size: int = VOCAB_SIZE.default,
    seed: int = 0,
    keep_marks: str = "auto",
    **recipe,
) -> tuple[Path, Adapted]:
    """`vocgraft replace`: load, replace the tokenizer, initialize, and save an HF directory with plan and manifest.

    ``recipe``: overwrite, inputs, method_inputs, options, dtype, device, surgery
    (:func:`~vocgraft.recipes.adapt.adapt_model`)."""
    step = ReplaceStep(None, tokenizer_spec, target_kind, target_vocab_size, keep_marks)
    return adapt_model(model_spec, lines, step, init, out_dir, seed=seed, **recipe)


def describe_replacement(result: Adapted, init: str, out: str | Path) -> str:
    """The new vocabulary's size, the rows copied from the source and those ``init`` made (with its stats)."""
    import json

    summary = result.plan.summary()
    text = (
        f"replaced the tokenizer: {summary['target_size']} tokens, {summary['copied']} copied from the source, "
        f"{summary['new']} initialized with {init} -> {out}"
    )
    return text + (f"\n{json.dumps(result.stats, indent=2, default=str)}" if result.stats else "")


def heldout_tokens(model_spec: str, result: Adapted, lines: Sequence[str]) -> str:
    """Tokens per held-out line with the source's tokenizer and with the new one, and the speedup proxy."""
    from vocgraft.eval import encode_lines, fertility, speedup

    before = fertility(encode_lines(load_tokenizer(model_spec), lines), lines)
    after = fertility(encode_lines(result.tokenizer, lines), lines)
    return (
        f"tokens/line on {len(lines)} held-out lines: {before['tokens_per_line_mean']:.2f} -> "
        f"{after['tokens_per_line_mean']:.2f} (speedup proxy "
        f"{speedup(before['tokens_per_line_mean'], after['tokens_per_line_mean']):.3f})"
    )
