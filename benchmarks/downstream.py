"""Downstream benchmark: generation speed and few-shot MT chrF of SmolLM2 and one expanded model per language.

Per language: expand SmolLM2 with k new tokens (Align, no training) on the shared train split, then measure both
models in the same process (`vocgraft downstream`'s code): greedy and sampled generation on prompts cut from
held-out lines (tokens/s, characters/s, and how the model uses its new tokens: the share it emits, the share the
canonical encoding of the same text has, the canonical rate, matched and non-canonical new tokens, with the share
in the prompts as context) and MT en->xx and xx->en on the shared parallel pairs.

    .venv/bin/python benchmarks/downstream.py [--langs el hi] [--k 1000] [--mt-limit 50] [--prompts 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from common import new_report

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval.downstream import DownstreamSpec, evaluate_downstream, markdown_summary
from vocgraft.eval.generation import prompts_from_lines
from vocgraft.eval.mt import read_pairs
from vocgraft.outdir import write_json
from vocgraft.recipes.expand import expand_model

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--langs", nargs="*", default=["el", "hi"])
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--init", default="align")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--mt-limit", type=int, default=10, help="test pairs per direction (CPU: ~15 s each)")
    parser.add_argument("--mt-directions", nargs="+", default=["en-xx"], choices=["en-xx", "xx-en"])
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "downstream"))
    args = parser.parse_args()

    report = new_report(args.model, args, langs={})
    with tempfile.TemporaryDirectory(prefix="vocgraft-downstream-") as scratch:
        work = Path(scratch)
        for lang in args.langs:
            expanded = work / f"{lang}-k{args.k}-{args.init}"
            start = time.perf_counter()
            expand_model(args.model, read_lines(SHARED_CORPORA / lang / "train.txt"), args.k, args.init, expanded,
                         aux_vocab_size=32000)  # fmt: skip
            spec = DownstreamSpec(
                lang=lang,
                prompts=prompts_from_lines(read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=args.prompts)),
                max_new_tokens=args.max_new_tokens,
                mt_pairs=read_pairs(SHARED_CORPORA / "parallel" / f"en-{lang}.tsv"),
                mt_directions=tuple(args.mt_directions),
                mt_shots=args.shots,
                mt_limit=args.mt_limit,
            )
            results = [evaluate_downstream(str(expanded), spec), evaluate_downstream(args.model, spec)]
            results[0]["model"] = f"expanded k={args.k} {args.init}"
            report["langs"][lang] = {"expand_seconds": time.perf_counter() - start, "results": results}
            print(f"## {lang}\n\n{markdown_summary(results)}\n", flush=True)
            write_json(f"{args.out}.json", report)
        write_markdown(report, f"{args.out}.md")


def write_markdown(report: dict, path: str) -> None:
    a = report["args"]
    text = [
        f"# Downstream: {report['model']} vs expanded (k={a['k']}, {a['init']}, no training)\n",
        f"{report['machine']}, {report['date']}. Generation: {a['prompts']} prompts cut from held-out lines, "
        f"{a['max_new_tokens']} new tokens at most, batch 1, greedy and sampled (temperature 0.8, top-k 40, "
        f"top-p 0.9, repetition penalty 1.1). MT: {a['shots']}-shot, greedy, first line of the answer, "
        f"{a['mt_limit']} pairs per direction ({', '.join(a['mt_directions'])}), 256 new tokens at most.\n",
    ]
    for lang, entry in report["langs"].items():
        text.append(f"\n## {lang}\n\n{markdown_summary(entry['results'])}\n")
        mt = entry["results"][0]["mt"]
        if mt:
            text.append(f"\nPrompt (first test pair, {mt[0]['direction']}):\n\n```\n{mt[0]['prompt_example']}\n```\n")
    Path(path).write_text("\n".join(text) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
