"""Replace a model's tokenizer: target tokenizer (given or trained) -> plan (overlap copied) -> init -> surgery -> save.

replace_model("smollm2", corpus_lines, init="focus", out_dir="out/el-focus", target_vocab_size=50000)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vocgraft.init import method_options
from vocgraft.models import load_model, load_tokenizer, tokenizer_kind
from vocgraft.outdir import check_writable
from vocgraft.plan import VocabPlan
from vocgraft.recipes.common import check_method_inputs, init_and_graft, method_resources, method_stats, save_adapted
from vocgraft.tokenization import train_tokenizer
from vocgraft.tokenization.marks import MarksChoice, check_setting, choose_keep_marks, follow_given

# the target tokenizer kind trained by default: the source's own family, so pre-tokenization stays familiar
KIND_LIKE_SOURCE = {"byte-level-bpe": "bytelevel-bpe", "sentencepiece-bpe": "sp-bpe", "unigram": "sp-unigram"}


class ReplaceError(ValueError):
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
    """The target tokenizer plus the source's special/control tokens it lacks (chat markers, EOS...), so that
    they are copied by name rather than lost; roles (bos/eos/pad/unk) the target lacks are taken over too."""
    from vocgraft.plan import missing_special_tokens

    missing = missing_special_tokens(source_tokenizer, target_tokenizer)
    if missing:
        target_tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    for role in ("bos_token", "eos_token", "pad_token", "unk_token"):
        if getattr(target_tokenizer, role, None) is None and getattr(source_tokenizer, role, None) is not None:
            setattr(target_tokenizer, role, getattr(source_tokenizer, role))
    if getattr(target_tokenizer, "chat_template", None) is None and getattr(source_tokenizer, "chat_template", None):
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
    source's own family; a byte-level one pre-tokenizes like the source, with combining marks kept if ``marks``
    says so), plus the source's special tokens it lacks."""
    if given is None:
        kind = kind or KIND_LIKE_SOURCE.get(tokenizer_kind(source_tokenizer))
        if kind is None:
            raise ReplaceError(
                f"no default target tokenizer kind for a {tokenizer_kind(source_tokenizer)} source; "
                "pass --kind or --tokenizer."
            )
        like = (marks.apply(source_tokenizer) if marks else source_tokenizer) if kind == "bytelevel-bpe" else None
        given = train_tokenizer(lines, kind, vocab_size, like=like, seed=seed)
    return with_source_specials(source_tokenizer, given)


def target_marks(setting: str, source_tokenizer, lines: Sequence[str], given=None, kind: str | None = None):
    """Whether the target tokenizer keeps combining marks with their letters (see ``--keep-marks``): a given one
    is followed; a trained byte-level one keeps them as :func:`~vocgraft.tokenization.marks.choose_keep_marks`
    decides; SentencePiece kinds keep them anyway."""
    if given is not None:
        return follow_given(setting, source_tokenizer, given, "target")
    kind = kind or KIND_LIKE_SOURCE.get(tokenizer_kind(source_tokenizer))
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
    keep_marks: str = "auto",
) -> tuple[Path, Replaced]:
    """`vocgraft replace`: load, replace the tokenizer, initialize, and save an HF directory with plan and manifest.

    ``method_inputs``: the init method's user inputs (``{"target_plm": DIR}``); ``options``: its settings."""
    check_writable(out_dir, overwrite)  # before minutes of work
    method_inputs = dict(method_inputs or {})
    options = method_options(init, options)
    check_method_inputs(init, method_inputs)
    check_setting(keep_marks)
    model, source_tokenizer = load_model(model_spec)
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
    }
    out = save_adapted(result.model, result.tokenizer, result.plan, out_dir, overwrite=overwrite, manifest=manifest)
    return out, result
