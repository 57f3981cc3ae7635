"""The `vocgraft` command: one subcommand per stage."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vocgraft.corpus import CorpusError
from vocgraft.models import DEFAULT_MODEL, ModelLoadError
from vocgraft.outdir import OutputExistsError

SHARED_CORPORA = Path(__file__).resolve().parents[3] / "shared" / "corpora"


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


def run_eval(model_spec: str, text: str, *, baseline: str | None, limit: int | None, with_bpb: bool = True,
             max_length: int = 512, batch_size: int = 8, field: str = "text") -> dict:
    from vocgraft.corpus import read_lines
    from vocgraft.eval import evaluate
    from vocgraft.models import describe, load_tokenizer, timed_load

    lines = read_lines(text, limit=limit, field=field)
    model, tokenizer, load_seconds = timed_load(model_spec)
    baseline_tokenizer = load_tokenizer(baseline) if baseline else None
    result = evaluate(model, tokenizer, lines, baseline_tokenizer=baseline_tokenizer, with_bpb=with_bpb,
                      max_length=max_length, batch_size=batch_size)
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

    result = run_eval(args.model, args.text, baseline=args.baseline_tokenizer, limit=args.limit,
                      with_bpb=not args.no_bpb, max_length=args.max_length, batch_size=args.batch_size,
                      field=args.field)
    if args.json:
        write_json(args.json, result)
    print(eval_markdown(result, name=Path(args.model).name or args.model))


def cmd_demo(args) -> None:
    from vocgraft.report import eval_markdown

    text = Path(args.text) if args.text else SHARED_CORPORA / "el" / "heldout.txt"
    print(f"vocgraft demo: {args.model} on the first {args.limit} lines of {text}", file=sys.stderr)
    result = run_eval(args.model, str(text), baseline=None, limit=args.limit)
    print(eval_markdown(result, name=args.model))


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help="HF directory, hub id, .gguf file, or 'smollm2' (default)")


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

    p = sub.add_parser("demo", help="the main job on the embedded defaults (packaged SmolLM2, shared Greek text)")
    add_model_arg(p)
    p.add_argument("--text", help=f"held-out text (default {SHARED_CORPORA / 'el' / 'heldout.txt'})")
    p.add_argument("--limit", type=int, default=200)
    p.set_defaults(func=cmd_demo)
    return parser


USER_ERRORS = (CorpusError, ModelLoadError, OutputExistsError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars drown our own output
    try:
        args.func(args)
    except USER_ERRORS as exc:
        print(f"vocgraft {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
