"""Baseline: the packaged SmolLM2 on the first N held-out lines of every shared language.

Writes benchmarks/results/baseline.json and baseline.md: per language tokens/line, bytes/token, bits/byte (next to
the uniform reference), perplexity and eval throughput, plus a bare forward loop (batch 8 x 512, no masking, no
loss) timed in the same run, so eval speed is read as a ratio rather than an absolute number.

    .venv/bin/python benchmarks/baseline.py [--limit 500] [--langs el hi] [--model smollm2]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval import evaluate
from vocgraft.models import describe, timed_load
from vocgraft.outdir import write_json
from vocgraft.report import markdown_table

RESULTS = Path(__file__).resolve().parent / "results"


@torch.inference_mode()
def bare_forward_tokens_per_second(
    model, token_stream: list[int], batch: int = 8, length: int = 512, batches: int = 3
) -> float:
    """Plain forward passes over full 8 x 512 blocks of real tokens: the ceiling eval is compared with."""
    need = batch * length * batches
    stream = (token_stream * (need // max(len(token_stream), 1) + 1))[:need]
    blocks = torch.tensor(stream).view(batches, batch, length)
    model(input_ids=blocks[0][:1, :16])  # warm-up: the first call pays for lazy initialisation
    start = time.perf_counter()
    for block in blocks:
        model(input_ids=block)
    return need / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--limit", type=int, default=500)
    parser.add_argument("--langs", nargs="*", help="default: every language folder in the shared corpora")
    parser.add_argument("--out", default=str(RESULTS / "baseline"))
    args = parser.parse_args()

    langs = args.langs or sorted(p.name for p in SHARED_CORPORA.iterdir() if (p / "heldout.txt").is_file())
    model, tokenizer, load_seconds = timed_load(args.model)
    greek = read_lines(SHARED_CORPORA / "el" / "heldout.txt", limit=args.limit)
    stream = [t for ids in tokenizer(greek, add_special_tokens=False)["input_ids"] for t in ids]
    bare_runs = []

    report = {
        "model": args.model,
        "model_info": describe(model, tokenizer).to_dict(),
        "load_seconds": load_seconds,
        "limit": args.limit,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch threads {torch.get_num_threads()}",
        "date": time.strftime("%Y-%m-%d"),
        "languages": {},
    }
    for lang in langs:
        lines = read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=args.limit)
        # the bare loop is timed right before each language: on a shared machine the load changes during a run
        bare = bare_forward_tokens_per_second(model, stream, batches=1)
        bare_runs.append(bare)
        result = evaluate(model, tokenizer, lines, show_progress=False)
        result["bare_forward_tokens_per_second"] = bare
        result["throughput_vs_bare"] = result["bpb"]["forward_tokens_per_second"] / bare
        report["languages"][lang] = result
        print(
            f"{lang}: {result['bpb']['bits_per_byte']:.3f} bits/byte, "
            f"{result['tokenizer']['tokens_per_line_mean']:.1f} tokens/line, "
            f"{result['bpb']['forward_tokens_per_second']:.0f} tokens/s (bare loop {bare:.0f})",
            flush=True,
        )
        write_json(f"{args.out}.json", report)  # after every language, so a long run keeps what it measured

    rows = [
        [
            lang,
            r["tokenizer"]["tokens_per_line_mean"],
            r["tokenizer"]["bytes_per_token"],
            r["bpb"]["bits_per_byte"],
            r["bpb"]["uniform_bits_per_byte"],
            r["bpb"]["perplexity"],
            r["bpb"]["forward_tokens_per_second"],
            r["throughput_vs_bare"],
        ]
        for lang, r in report["languages"].items()
    ]
    table = markdown_table(
        [
            "lang",
            "tokens/line",
            "bytes/token",
            "bits/byte",
            "uniform bits/byte",
            "perplexity",
            "eval tokens/s",
            "vs bare loop",
        ],
        rows,
        digits=2,
    )
    header = (
        f"# Baseline: {args.model}, first {args.limit} held-out lines per language\n\n"
        f"{report['machine']}, {report['date']}; bare forward loop (8 x 512, timed before each language): "
        f"{min(bare_runs):.0f}-{max(bare_runs):.0f} tokens/s; "
        f"model load {load_seconds:.1f} s.\n\n"
    )
    Path(f"{args.out}.md").write_text(header + table + "\n", encoding="utf-8")
    print(table)


if __name__ == "__main__":
    main()
