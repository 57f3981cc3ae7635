"""Replace a model's tokenizer: target tokenizer (given or trained) -> plan (overlap copied) -> init -> surgery -> save.

replace_model("smollm2", corpus_lines, init="focus", out_dir="out/el-focus", target_vocab_size=50000)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vocgraft.compat import add_extra_special_tokens
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
from vocgraft.tokenization import train_tokenizer
from vocgraft.tokenization.marks import MarksChoice, check_setting, choose_keep_marks, follow_given
from vocgraft.tokenization.spec import tokenizer_family
from vocgraft.tokenization.train import keep_ignore_merges

ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")
# the target tokenizer kind trained by default: the source's own family, so pre-tokenization stays familiar
KIND_LIKE_SOURCE = {"byte-level-bpe": "bytelevel-bpe", "sentencepiece-bpe": "sp-bpe", "unigram": "sp-unigram"}


class ReplaceError(UserError, ValueError):
    """A replacement that cannot be done as asked; the message says what to change."""


@dataclass
class Replaced:
    model: Any
    tokenizer: Any
    plan: VocabPlan
    timings: dict[str, float] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    marks: MarksChoice | None = None  # whether the trained target tokenizer's split regex keeps combining marks


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
        family = tokenizer_family(source_tokenizer)
        kind = kind or KIND_LIKE_SOURCE.get(family)
        if kind is None:
            raise ReplaceError(f"no default target tokenizer kind for a {family} source; pass --kind or --tokenizer.")
        # a byte-level target can only copy a byte-level source's pipeline; SentencePiece kinds take any source's
        # special-token strings (and a SentencePiece source's whole layout)
        like = source_tokenizer if kind != "bytelevel-bpe" or family == "byte-level-bpe" else None
        if kind == "bytelevel-bpe" and like is not None and marks:
            like = marks.apply(source_tokenizer)
        given = train_tokenizer(lines, kind, vocab_size, like=like, seed=seed)
        if kind == "bytelevel-bpe" and like is not None:
            keep_ignore_merges(source_tokenizer, given)
    return with_source_specials(source_tokenizer, given)


def target_marks(setting: str, source_tokenizer, lines: Sequence[str], given=None, kind: str | None = None):
    """Whether the target tokenizer keeps combining marks with their letters (see ``--keep-marks``): a given one
    is followed; a trained byte-level one keeps them as :func:`~vocgraft.tokenization.marks.choose_keep_marks`
    decides; SentencePiece kinds keep them anyway."""
    if given is not None:
        return follow_given(setting, source_tokenizer, given, "target")
    kind = kind or KIND_LIKE_SOURCE.get(tokenizer_family(source_tokenizer))
    if kind != "bytelevel-bpe":
        check_setting(setting)
        return MarksChoice(setting, False, f"a {kind} target tokenizer does not split marks from letters")
    return choose_keep_marks(setting, source_tokenizer, lines)


def replace_loaded(
    model,
    source_tokenizer,
    lines: Sequence[str],
    init: str,
    *,
    target_tokenizer=None,
    target_kind: str | None = None,
    target_vocab_size: int = 50000,
    resources: dict[str, Any] | None = None,
    seed: int = 0,
    options: dict[str, Any] | None = None,
    keep_marks: str = "auto",
) -> Replaced:
    """Replace the tokenizer of an in-memory model in place (no I/O): the core of `vocgraft replace`.

    ``keep_marks``: auto/on/off for a trained byte-level target tokenizer (:func:`target_marks`). The init
    method sees the source tokenizer as it was."""
    options = method_options(init, options)  # fail on a typo before any work
    timings = {}
    start = time.perf_counter()
    marks = target_marks(keep_marks, source_tokenizer, lines, target_tokenizer, target_kind)
    target_tokenizer = target_tokenizer_for(
        source_tokenizer,
        lines,
        target_tokenizer,
        kind=target_kind,
        vocab_size=target_vocab_size,
        seed=seed,
        marks=marks,
    )
    timings["target_tokenizer_seconds"] = time.perf_counter() - start

    start = time.perf_counter()
    plan = VocabPlan.from_tokenizers(source_tokenizer, target_tokenizer, "replace")
    timings["plan_seconds"] = time.perf_counter() - start
    timings["init_seconds"], resources = init_and_graft(
        model,
        plan,
        source_tokenizer,
        target_tokenizer,
        init,
        corpus=lines,
        seed=seed,
        resources=resources,
        options=options,
    )
    return Replaced(model, target_tokenizer, plan, timings, method_stats(resources), marks)


def replace_model(
    model_spec: str,
    lines: Sequence[str],
    init: str,
    out_dir: str | Path,
    *,
    tokenizer_spec: str | None = None,
    target_kind: str | None = None,
    target_vocab_size: int = 50000,
    seed: int = 0,
    overwrite: bool = False,
    inputs: dict | None = None,
    method_inputs: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    dtype: str = "auto",
    device: str = "auto",
    surgery: str = "auto",
    keep_marks: str = "auto",
) -> tuple[Path, Replaced]:
    """`vocgraft replace`: load, replace the tokenizer, initialize, and save an HF directory with plan and manifest.

    ``method_inputs``: the init method's user inputs (``{"target_plm": DIR}``); ``options``: its settings.
    ``dtype`` (auto: the source's) is the saved model's; ``surgery`` picks how the model is edited
    (:func:`~vocgraft.recipes.common.open_source`: on its files without loading it, or loaded on ``device``)."""
    check_writable(out_dir, overwrite)  # before minutes of work
    method_inputs = dict(method_inputs or {})
    options = method_options(init, options)
    check_method_inputs(init, method_inputs)
    check_setting(keep_marks)
    model, source_tokenizer, surgery_facts = open_source(model_spec, init, dtype=dtype, device=device, surgery=surgery)
    target = load_tokenizer(tokenizer_spec) if tokenizer_spec else None
    resources = method_resources(init, method_inputs)
    result = replace_loaded(
        model,
        source_tokenizer,
        lines,
        init,
        target_tokenizer=target,
        target_kind=target_kind,
        target_vocab_size=target_vocab_size,
        resources=resources,
        seed=seed,
        options=options,
        keep_marks=keep_marks,
    )
    manifest = {
        "inputs": {"model": model_spec, "tokenizer": tokenizer_spec, **method_inputs, **(inputs or {})},
        "method": {
            "stage": "replace",
            "init": init,
            "options": options,
            "target_kind": target_kind,
            "target_vocab_size": len(result.tokenizer),
            "keep_marks": result.marks.to_dict(),
        },
        "seed": seed,
        "source_model": model_spec,
        "plan": result.plan.summary(),
        "timings": result.timings,
        "init_stats": result.stats,
        "surgery": surgery_facts,
    }
    out = save_adapted(result.model, result.tokenizer, result.plan, out_dir, overwrite=overwrite, manifest=manifest)
    return out, result
