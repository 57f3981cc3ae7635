"""The `vocgraft` command: one subcommand per stage."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vocgraft.corpus import (
    SHARED_CORPORA,  # noqa: F401  (benchmarks import it from here too)
    CorpusError,
)
from vocgraft.models import DEFAULT_MODEL, ModelLoadError
from vocgraft.outdir import OutputExistsError


def write_json(path: str | Path, data: dict) -> None:
    """Write JSON atomically so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def cmd_info(args) -> None:
    from vocgraft.models import describe, timed_load

    model, tokenizer, seconds = timed_load(args.model)
    info = describe(model, tokenizer).to_dict() | {"load_seconds": round(seconds, 2)}
    print(json.dumps(info, indent=2))


def run_eval(
    model_spec: str,
    text: str,
    *,
    baseline: str | None,
    limit: int | None,
    with_bpb: bool = True,
    max_length: int = 512,
    batch_size: int = 8,
    field: str = "text",
) -> dict:
    from vocgraft.corpus import read_lines
    from vocgraft.eval import evaluate
    from vocgraft.models import describe, load_tokenizer, timed_load

    lines = read_lines(text, limit=limit, field=field)
    model, tokenizer, load_seconds = timed_load(model_spec)
    baseline_tokenizer = load_tokenizer(baseline) if baseline else None
    result = evaluate(
        model,
        tokenizer,
        lines,
        baseline_tokenizer=baseline_tokenizer,
        with_bpb=with_bpb,
        max_length=max_length,
        batch_size=batch_size,
    )
    return {
        "model": model_spec,
        "text": str(text),
        "limit": limit,
        "baseline_tokenizer_spec": baseline,
        "model_info": describe(model, tokenizer).to_dict(),
        "load_seconds": load_seconds,
        **result,
    }


def cmd_eval(args) -> None:
    from vocgraft.report import eval_markdown

    result = run_eval(
        args.model,
        args.text,
        baseline=args.baseline_tokenizer,
        limit=args.limit,
        with_bpb=not args.no_bpb,
        max_length=args.max_length,
        batch_size=args.batch_size,
        field=args.field,
    )
    if args.json:
        write_json(args.json, result)
    print(eval_markdown(result, name=Path(args.model).name or args.model))


def cmd_tokenizer_train(args) -> None:
    from vocgraft.corpus import read_lines
    from vocgraft.models import load_tokenizer
    from vocgraft.outdir import check_writable
    from vocgraft.tokenization import save_tokenizer, train_tokenizer

    check_writable(args.out, args.overwrite)
    lines = read_lines(args.corpus, sample=args.sample, seed=args.seed, field=args.field)
    like = load_tokenizer(args.like) if args.like else None
    tokenizer = train_tokenizer(lines, args.kind, args.vocab_size, like=like, seed=args.seed, show_progress=True)
    save_tokenizer(
        tokenizer,
        args.out,
        overwrite=args.overwrite,
        manifest={"inputs": {"corpus": args.corpus, "lines": len(lines), "like": args.like}},
    )
    print(f"{args.kind} tokenizer with {len(tokenizer)} tokens trained on {len(lines)} lines -> {args.out}")


def expansion_summary(source_tokenizer, tokenizer, new_ids, lines) -> dict:
    """Tokens/line before and after, speedup proxy, and the share of new tokens that the text actually uses."""
    from vocgraft.eval import encode_lines, fertility, speedup

    before, after = encode_lines(source_tokenizer, lines), encode_lines(tokenizer, lines)
    used = {t for ids in after for t in ids} & set(new_ids)
    source, target = fertility(before, lines), fertility(after, lines)
    return {
        "lines": len(lines),
        "tokens_per_line_before": source["tokens_per_line_mean"],
        "tokens_per_line_after": target["tokens_per_line_mean"],
        "speedup": speedup(source["tokens_per_line_mean"], target["tokens_per_line_mean"]),
        "new_tokens_used_share": len(used) / len(new_ids) if new_ids else 0.0,
        "roundtrip_exact": all(tokenizer.decode(ids) == line for ids, line in zip(after, lines)),
    }


def parse_scripts(value: str):
    if value in ("auto", "any"):
        return None if value == "any" else "auto"
    return [name.strip().upper() for name in value.split(",") if name.strip()]


def cmd_expand(args) -> None:
    from vocgraft.corpus import read_lines
    from vocgraft.recipes.expand import expand_model

    lines = read_lines(args.corpus, sample=args.sample, seed=args.seed, field=args.field)
    protect = read_lines(args.protect) if args.protect else None
    out, result = expand_model(
        args.model,
        lines,
        args.new_tokens,
        args.init,
        args.out,
        aux_tokenizer_spec=args.aux_tokenizer,
        aux_vocab_size=args.aux_vocab_size,
        protect=protect,
        scripts=parse_scripts(args.scripts),
        seed=args.seed,
        overwrite=args.overwrite,
        inputs={"corpus": args.corpus, "corpus_lines": len(lines), "protect": args.protect},
    )
    added = result.expansion.to_dict()
    scripts = ", ".join(result.scripts) if result.scripts else "any script"
    print(
        f"added {added['added']} tokens ({added['intermediate_count']} intermediates; wanted tokens in {scripts}) "
        f"with init={args.init} -> {out}"
    )
    if args.heldout:
        from vocgraft.models import load_tokenizer

        summary = expansion_summary(
            load_tokenizer(args.model),
            result.tokenizer,
            result.plan.new_ids,
            read_lines(args.heldout, limit=args.eval_limit),
        )
        print(json.dumps(summary, indent=2))


def cmd_replace(args) -> None:
    from vocgraft.corpus import read_lines
    from vocgraft.recipes.replace import replace_model

    lines = read_lines(args.corpus, sample=args.sample, seed=args.seed, field=args.field)
    out, result = replace_model(
        args.model,
        lines,
        args.init,
        args.out,
        tokenizer_spec=args.tokenizer,
        target_kind=args.kind,
        target_vocab_size=args.vocab_size,
        target_plm=args.target_plm,
        seed=args.seed,
        overwrite=args.overwrite,
        inputs={"corpus": args.corpus, "corpus_lines": len(lines)},
    )
    summary = result.plan.summary()
    print(
        f"replaced the tokenizer: {summary['target_size']} tokens, {summary['copied']} copied from the source, "
        f"{summary['new']} initialized with {args.init} -> {out}"
    )
    if result.stats:
        print(json.dumps(result.stats, indent=2, default=str))
    if args.heldout:
        from vocgraft.eval import encode_lines, fertility, speedup
        from vocgraft.models import load_tokenizer

        text = read_lines(args.heldout, limit=args.eval_limit)
        before = fertility(encode_lines(load_tokenizer(args.model), text), text)
        after = fertility(encode_lines(result.tokenizer, text), text)
        print(
            f"tokens/line on {len(text)} held-out lines: {before['tokens_per_line_mean']:.2f} -> "
            f"{after['tokens_per_line_mean']:.2f} (speedup proxy "
            f"{speedup(before['tokens_per_line_mean'], after['tokens_per_line_mean']):.3f})"
        )


def cmd_plm_train(args) -> None:
    from vocgraft.train.plm import plm_train_main

    out = plm_train_main(
        args.corpus,
        args.tokenizer,
        args.out,
        args.minutes,
        steps=args.steps,
        max_lines=args.max_lines,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    print(f"small target-language PLM -> {out}")


def cmd_train(args) -> None:
    from vocgraft.train.lapt import TrainConfig, train

    names = TrainConfig.__dataclass_fields__.keys() - {"show_progress", "inputs"}
    summary = train(TrainConfig(**{name: getattr(args, name) for name in names}))
    if not summary["main_process"]:  # under accelerate launch: one report, from the main process
        return
    if summary["resumed_from_step"] is not None:
        print(f"resumed from step {summary['resumed_from_step']}")
    print(
        f"{summary['strategy']}/{summary['objective']}: {summary['steps']} steps "
        f"({summary['epochs']} epochs of {summary['train_sequences']} sequences of {summary['seq_len']} tokens), "
        f"{summary['tokens_per_second']:.0f} tokens/s, validation loss {summary['val_loss_start']:.3f} -> "
        f"{summary['val_loss_end']:.3f} -> {args.out}"
    )


def cmd_demo(args) -> None:
    """Expand SmolLM2 with k Greek tokens (Align) and compare source and expanded model on held-out Greek."""

    from vocgraft.corpus import read_lines
    from vocgraft.eval import evaluate
    from vocgraft.models import load_model
    from vocgraft.recipes.expand import expand_loaded
    from vocgraft.report import markdown_table

    corpus, heldout = SHARED_CORPORA / args.lang / "train.txt", SHARED_CORPORA / args.lang / "heldout.txt"
    lines = read_lines(corpus, sample=args.sample, seed=0)
    text = read_lines(heldout, limit=args.limit)
    # English training text: the new merges must not change how the source language tokenizes
    protect = read_lines(SHARED_CORPORA / "en" / "train.txt", limit=8192) if args.lang != "en" else None
    print(
        f"vocgraft demo: {args.model} + {args.new_tokens} {args.lang} tokens ({args.init}), trained on "
        f"{len(lines)} lines of {corpus}, measured on the first {len(text)} lines of {heldout}",
        file=sys.stderr,
    )
    model, source_tokenizer = load_model(args.model)
    source = evaluate(model, source_tokenizer, text)
    result = expand_loaded(
        model, source_tokenizer, lines, args.new_tokens, args.init, aux_vocab_size=args.aux_vocab_size, protect=protect
    )
    expanded = evaluate(result.model, result.tokenizer, text, baseline_tokenizer=source_tokenizer)
    usage = expansion_summary(source_tokenizer, result.tokenizer, result.plan.new_ids, text)
    rows = [
        [
            name,
            r["tokenizer"]["tokens_per_line_mean"],
            r["tokenizer"]["bytes_per_token"],
            r["bpb"]["bits_per_byte"],
            r["bpb"]["uniform_bits_per_byte"],
        ]
        for name, r in (("source", source), (f"expanded k={args.new_tokens} {args.init}", expanded))
    ]
    print(markdown_table(["model", "tokens/line", "bytes/token", "bits/byte", "uniform bits/byte"], rows))
    print(
        f"\nspeedup proxy {expanded['speedup']:.3f}x; {usage['new_tokens_used_share']:.0%} of the new tokens "
        f"occur in the held-out text; round trip exact: {usage['roundtrip_exact']}; "
        f"init took {result.timings['init_seconds']:.1f} s"
    )
    if args.out:
        from vocgraft.surgery import save_model_dir

        save_model_dir(
            result.model,
            result.tokenizer,
            args.out,
            overwrite=True,
            manifest={
                "job": "demo",
                "source_model": args.model,
                "source_eval": source,
                "expanded_eval": expanded,
                "usage": usage,
            },
        )
        print(f"saved the expanded model to {args.out}")


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help="HF directory, hub id, .gguf file, or 'smollm2' (default)")


def add_train_args(p: argparse.ArgumentParser) -> None:
    from vocgraft.train.objectives import OBJECTIVES
    from vocgraft.train.strategies import STRATEGIES

    p.add_argument(
        "--model", required=True, help="model directory (e.g. the output of vocgraft expand), hub id or alias"
    )
    p.add_argument("--corpus", required=True, help="target-language text: file, folder, JSONL or hf:dataset spec")
    p.add_argument("--out", required=True, help="where the trained model directory goes")
    p.add_argument("--strategy", default="full", choices=STRATEGIES)
    p.add_argument("--objective", default="clm", choices=OBJECTIVES, help="mtp adds a head predicting t+2")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per process and micro-batch")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--epochs", type=float, default=2.0)
    budget.add_argument("--max-steps", type=int, help="optimizer steps (instead of --epochs)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (cosine schedule)")
    p.add_argument("--warmup-steps", type=int, default=100, help="capped at 10%% of each phase's steps")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--stage1-share", type=float, default=0.5, help="two-stage: share of steps for embeddings only")
    p.add_argument("--sample", type=int, help="|D|: train on a seeded sample of this many lines")
    p.add_argument("--val-lines", type=int, default=256, help="lines held out for the validation loss")
    p.add_argument("--eval-every", type=int, help="steps between validation losses (default: 10 over the run)")
    p.add_argument("--save-every", type=int, default=200, help="steps between checkpoints")
    p.add_argument("--checkpoint-dir", help="default: <out>.checkpoints")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep the last checkpoint after success")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint (if any)")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--field", default="text", help="JSONL/dataset field holding the text")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vocgraft", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="load a source model and describe it")
    add_model_arg(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("eval", help="token counts, speedup proxy, bits per byte and perplexity on a text")
    add_model_arg(p)
    p.add_argument("--text", required=True, help="text file, folder, .jsonl, or hf:NAME[:SPLIT]")
    p.add_argument("--field", default="text", help="JSONL / dataset field holding the text")
    p.add_argument("--baseline-tokenizer", help="tokenizer (or model) to compare token counts with: the speedup proxy")
    p.add_argument("--limit", type=int, help="only the first N lines")
    p.add_argument("--max-length", type=int, default=512, help="context window for bits/byte (longer lines: strided)")
    p.add_argument("--batch-size", type=int, default=8, help="batch budget = batch size x max length tokens")
    p.add_argument("--no-bpb", action="store_true", help="token counts only; skip the model forward passes")
    p.add_argument("--json", help="also write the full result as JSON to this path")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("tokenizer", help="tokenizer stage")
    tsub = p.add_subparsers(dest="tokenizer_command", required=True)
    t = tsub.add_parser("train", help="train an auxiliary target-language tokenizer")
    t.add_argument("--corpus", required=True, help="text file, folder, .jsonl, or hf:NAME[:SPLIT]")
    t.add_argument("--field", default="text")
    t.add_argument("--kind", required=True, choices=["bytelevel-bpe", "sp-bpe", "sp-unigram"])
    t.add_argument("--vocab-size", type=int, default=50000)
    t.add_argument("--like", help="source model/tokenizer whose pre-tokenization and special tokens to copy")
    t.add_argument("--sample", type=int, help="train on a seeded sample of N lines")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", required=True)
    t.add_argument("--overwrite", action="store_true")
    t.set_defaults(func=cmd_tokenizer_train)

    from vocgraft.init import METHODS

    p = sub.add_parser("expand", help="add the top-k target-language tokens as real merges and initialize them")
    add_model_arg(p)
    p.add_argument("--corpus", required=True, help="target-language training text")
    p.add_argument("--field", default="text")
    p.add_argument("--new-tokens", type=int, required=True, help="k: vocabulary rows to add (intermediates count)")
    p.add_argument("--init", required=True, choices=sorted(METHODS))
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--aux-tokenizer", help="a trained auxiliary tokenizer (default: train one on --corpus)")
    p.add_argument("--aux-vocab-size", type=int, default=16000)
    p.add_argument("--sample", type=int, help="use a seeded sample of N corpus lines")
    p.add_argument("--protect", help="text whose tokenization must not change (e.g. source-language text)")
    p.add_argument(
        "--scripts",
        default="auto",
        help="writing systems new tokens must use: auto (the corpus's dominant ones, e.g. DEVANAGARI), any, "
        "or a comma list of Unicode name prefixes such as GREEK or HIRAGANA,KATAKANA,CJK",
    )
    p.add_argument("--heldout", help="held-out text: report tokens/line before/after and new-token usage")
    p.add_argument("--eval-limit", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_expand)

    p = sub.add_parser("replace", help="replace the tokenizer with a target-language one and initialize the new rows")
    add_model_arg(p)
    p.add_argument("--corpus", required=True, help="target-language training text (tokenizer, FOCUS, Align...)")
    p.add_argument("--field", default="text")
    p.add_argument("--tokenizer", help="the target tokenizer (default: train one on --corpus)")
    p.add_argument(
        "--kind",
        choices=["bytelevel-bpe", "sp-bpe", "sp-unigram"],
        help="kind of the trained target tokenizer (default: the source's family)",
    )
    p.add_argument("--vocab-size", type=int, default=50000, help="size of the trained target tokenizer")
    p.add_argument("--init", required=True, choices=sorted(METHODS))
    p.add_argument("--target-plm", help="a target-language model whose tokenizer is the target tokenizer (SALT)")
    p.add_argument("--out", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--sample", type=int, help="use a seeded sample of N corpus lines")
    p.add_argument("--heldout", help="held-out text: report tokens/line before/after")
    p.add_argument("--eval-limit", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_replace)

    p = sub.add_parser("plm", help="a small target-language LM (SALT's target PLM when none can be downloaded)")
    psub = p.add_subparsers(dest="plm_command", required=True)
    t = psub.add_parser("train", help="train a small GPT-2-style LM from scratch with the target tokenizer")
    t.add_argument("--corpus", required=True)
    t.add_argument("--tokenizer", required=True, help="the target tokenizer (a directory)")
    t.add_argument("--out", required=True)
    t.add_argument("--minutes", type=float, default=5.0, help="time budget")
    t.add_argument("--steps", type=int, help="step budget (whichever runs out first)")
    t.add_argument("--max-lines", type=int)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--overwrite", action="store_true")
    t.set_defaults(func=cmd_plm_train)

    p = sub.add_parser("train", help="language-adaptive pre-training (LAPT) of a model on the target corpus")
    add_train_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("demo", help="the main job on the embedded defaults: expand SmolLM2 with Greek tokens")
    add_model_arg(p)
    p.add_argument("--lang", default="el", help="a language folder of the shared corpora")
    p.add_argument("--new-tokens", type=int, default=100)
    p.add_argument("--init", default="align", choices=sorted(METHODS))
    p.add_argument("--sample", type=int, default=8192, help="training lines for the aux tokenizer and Align")
    p.add_argument("--aux-vocab-size", type=int, default=8000)
    p.add_argument("--limit", type=int, default=200, help="held-out lines to measure on")
    p.add_argument("--out", help="also save the expanded model here")
    p.set_defaults(func=cmd_demo)
    return parser


def user_errors() -> tuple[type[Exception], ...]:
    from vocgraft.recipes.expand import ExpandError
    from vocgraft.recipes.replace import ReplaceError
    from vocgraft.surgery import SurgeryError
    from vocgraft.train.data import TrainingError

    return (CorpusError, ModelLoadError, OutputExistsError, ExpandError, ReplaceError, SurgeryError, TrainingError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars drown our own output
    try:
        args.func(args)
    except user_errors() as exc:
        print(f"vocgraft {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
