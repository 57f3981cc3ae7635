"""Expansion benchmark: k new tokens x init method on SmolLM2, right after initialization (no training).

For each language: train one auxiliary byte-level BPE on the training lines, expand SmolLM2 by k tokens, and for each
init method (plus transformers' own resize_token_embeddings(mean_resizing=True), the default most users get) report
tokens/line and speedup vs the source, share of new tokens used, bits/byte on the first N held-out lines next to the
uniform reference of that tokenizer, wall time and peak extra RAM of the initialization alone. Invariants checked on
every run: decode(encode(x)) == x on the held-out lines, and English held-out tokenization unchanged.

    .venv/bin/python benchmarks/expansion.py [--langs el hi] [--ks 100 1000 5000] [--eval-lines 500]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peak_memory import PeakRSS  # noqa: E402

from vocgraft.cli import SHARED_CORPORA, expansion_summary, write_json  # noqa: E402
from vocgraft.corpus import read_lines  # noqa: E402
from vocgraft.eval import bits_per_byte, encode_lines  # noqa: E402
from vocgraft.init import InitContext, initialize  # noqa: E402
from vocgraft.models import load_model  # noqa: E402
from vocgraft.plan import VocabPlan  # noqa: E402
from vocgraft.recipes.expand import train_aux_tokenizer  # noqa: E402
from vocgraft.report import markdown_table  # noqa: E402
from vocgraft.surgery import graft, mean_resizing_baseline  # noqa: E402
from vocgraft.tokenization import expand_tokenizer  # noqa: E402
from vocgraft.tokenization.scripts import dominant_scripts  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ["random", "multivariate", "mean", "merge", "align", "transformers-mean-resizing"]


def english_changed_share(source_tokenizer, tokenizer, english: list[str]) -> float:
    before, after = encode_lines(source_tokenizer, english), encode_lines(tokenizer, english)
    return sum(a != b for a, b in zip(before, after)) / len(english)


def run_method(method, source_spec, source_tokenizer, tokenizer, plan, train, heldout, aux):
    model, _ = load_model(source_spec)
    start = time.perf_counter()
    with PeakRSS() as memory:
        if method == "transformers-mean-resizing":
            mean_resizing_baseline(model, tokenizer)
        else:
            # Align and Merge work over the auxiliary tokenizer the new tokens came from, as `vocgraft expand` does
            ctx = InitContext(plan, source_tokenizer, tokenizer, corpus=train, seed=0, aux_tokenizer=aux)
            input_rows, head_rows = initialize(model, method, ctx)
    seconds = time.perf_counter() - start
    if method != "transformers-mean-resizing":
        graft(model, plan, input_rows, head_rows, tokenizer)
    bpb = bits_per_byte(model, tokenizer, heldout, show_progress=False)
    return {"init_seconds": seconds, "init_peak_extra_mib": memory.extra_mib, "bpb": bpb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--langs", nargs="*", default=["el", "hi"])
    parser.add_argument("--ks", nargs="*", type=int, default=[100, 1000, 5000])
    parser.add_argument("--methods", nargs="*", default=METHODS)
    parser.add_argument("--train-lines", type=int, default=32768)
    parser.add_argument("--eval-lines", type=int, default=500)
    parser.add_argument("--aux-vocab-size", type=int, default=32000)
    parser.add_argument(
        "--protect-lines",
        type=int,
        default=8192,
        help="English *training* lines whose tokenization expansion must keep (0: none); English "
        "held-out lines are then measured, never used",
    )
    parser.add_argument(
        "--scripts",
        choices=["auto", "any"],
        default="auto",
        help="restrict new tokens to the "
        "corpus's dominant writing systems (auto, as `vocgraft expand` does) or not (any)",
    )
    parser.add_argument("--out", default=str(RESULTS / "expansion"))
    args = parser.parse_args()

    report = {
        "model": args.model,
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "languages": {},
    }
    english = read_lines(SHARED_CORPORA / "en" / "heldout.txt")
    protect = read_lines(SHARED_CORPORA / "en" / "train.txt", limit=args.protect_lines) if args.protect_lines else None
    _, source_tokenizer = load_model(args.model)
    for lang in args.langs:
        train = read_lines(SHARED_CORPORA / lang / "train.txt", limit=args.train_lines)
        heldout = read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=args.eval_lines)
        model, _ = load_model(args.model)
        entry = report["languages"][lang] = {"train_lines": len(train), "eval_lines": len(heldout), "runs": []}
        entry["source"] = bits_per_byte(model, source_tokenizer, heldout, show_progress=False)
        del model
        start = time.perf_counter()
        aux = train_aux_tokenizer(source_tokenizer, train, args.aux_vocab_size)
        entry["aux_tokenizer_seconds"] = time.perf_counter() - start
        scripts = dominant_scripts(train) if args.scripts == "auto" else None
        entry["scripts"] = sorted(scripts) if scripts else None
        print(
            f"{lang}: source {entry['source']['bits_per_byte']:.3f} bits/byte; aux tokenizer "
            f"{entry['aux_tokenizer_seconds']:.1f} s",
            flush=True,
        )
        for k in args.ks:
            start = time.perf_counter()
            expansion = expand_tokenizer(source_tokenizer, aux, train, k, protect=protect, scripts=scripts)
            tokenizer = expansion.tokenizer
            plan = VocabPlan.from_tokenizers(source_tokenizer, tokenizer, "expand")
            expand_seconds = time.perf_counter() - start
            usage = expansion_summary(source_tokenizer, tokenizer, plan.new_ids, heldout)
            common = {
                "k": k,
                "added": len(expansion.new_tokens),
                "intermediates": len(expansion.intermediates),
                "expand_seconds": expand_seconds,
                **usage,
                "english_changed_share": english_changed_share(source_tokenizer, tokenizer, english),
            }
            for method in args.methods:
                run = {
                    **common,
                    "method": method,
                    **run_method(method, args.model, source_tokenizer, tokenizer, plan, train, heldout, aux),
                }
                entry["runs"].append(run)
                print(
                    f"{lang} k={k} {method}: {run['bpb']['bits_per_byte']:.3f} bits/byte "
                    f"(uniform {run['bpb']['uniform_bits_per_byte']:.3f}), speedup {run['speedup']:.3f}, "
                    f"used {run['new_tokens_used_share']:.0%}, init {run['init_seconds']:.2f} s",
                    flush=True,
                )
                write_json(f"{args.out}.json", report)
    write_markdown(report, f"{args.out}.md")


def write_markdown(report: dict, path: str) -> None:
    parts = [
        f"# Expansion right after initialization: {report['model']}\n",
        f"{report['machine']}, {report['date']}. Bits/byte on the first {report['args']['eval_lines']} "
        "held-out lines; the uniform reference is what a model knowing only the tokenizer scores.\n",
    ]
    for lang, entry in report["languages"].items():
        src = entry["source"]
        parts.append(
            f"\n## {lang}\n\nsource: {src['bits_per_byte']:.3f} bits/byte (uniform "
            f"{src['uniform_bits_per_byte']:.3f}), {entry['train_lines']} training lines, new tokens restricted "
            f"to {', '.join(entry.get('scripts') or ['any script'])}\n"
        )
        rows = [
            [
                r["k"],
                r["method"],
                r["intermediates"],
                r["tokens_per_line_after"],
                r["speedup"],
                r["new_tokens_used_share"],
                r["bpb"]["bits_per_byte"],
                r["bpb"]["uniform_bits_per_byte"],
                r["init_seconds"],
                r["init_peak_extra_mib"],
                r["roundtrip_exact"],
                r["english_changed_share"],
            ]
            for r in entry["runs"]
        ]
        parts.append(
            markdown_table(
                [
                    "k",
                    "init",
                    "intermediates",
                    "tokens/line",
                    "speedup",
                    "new used",
                    "bits/byte",
                    "uniform",
                    "init s",
                    "init MiB",
                    "round trip",
                    "en changed",
                ],
                rows,
            )
        )
    Path(path).write_text("\n".join(parts) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
