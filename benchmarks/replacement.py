"""Replacement benchmark: SmolLM2's tokenizer swapped for a target-language one, right after initialization.

For each language: train a byte-level BPE target tokenizer (like SmolLM2's pre-tokenization) on the training lines,
plan the replacement (overlap copied), and for each init method report overlap size, tokens/line and speedup vs the
source, bits/byte on the first N held-out lines next to the uniform reference of the target tokenizer, init wall time
(fastText / PLM training split out) and peak extra RAM. SALT needs a target-language PLM: a small GPT-2-style model is
trained here on the same lines with the target tokenizer (time reported separately); ``salt`` (paper 001's plain
linear map) and ``salt-centered`` (our variant) run on the same PLM and fastText vectors. For the languages in
--deepfocus-langs the same target tokenizer and lines also go through the official ``deepfocus`` (timed end to end
against ours, parity on the same fastText vectors; see focus_speed.py).

    .venv/bin/python benchmarks/replacement.py [--langs el hi] [--vocab-size 50000] [--plm-minutes 5] [--plm-steps N]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from peak_memory import PeakRSS

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval import bits_per_byte, encode_lines, fertility, speedup
from vocgraft.models import load_model
from vocgraft.outdir import write_json
from vocgraft.plan import VocabPlan, raw_tokens
from vocgraft.recipes.common import init_and_graft, method_stats
from vocgraft.recipes.replace import with_source_specials
from vocgraft.report import markdown_table
from vocgraft.tokenization import train_tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ["random", "multivariate", "mean", "merge", "align", "focus", "salt", "salt-centered"]  # registry methods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--langs", nargs="*", default=["el", "hi"])
    parser.add_argument("--methods", nargs="*", default=METHODS)
    parser.add_argument("--vocab-size", type=int, default=50000)
    parser.add_argument("--train-lines", type=int, default=32768)
    parser.add_argument("--eval-lines", type=int, default=500)
    parser.add_argument("--plm-minutes", type=float, default=5.0)
    parser.add_argument(
        "--plm-steps", type=int, help="also stop the PLM after N steps (a step budget does not depend on machine load)"
    )
    parser.add_argument(
        "--fasttext-min-count", type=int, default=10, help="FOCUS/SALT fastText minCount (paper 002: 10)"
    )
    parser.add_argument("--deepfocus-langs", nargs="*", default=["el"])
    parser.add_argument("--out", default=str(RESULTS / "replacement"))
    args = parser.parse_args()

    report = {
        "model": args.model,
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "languages": {},
    }
    _, source_tokenizer = load_model(args.model)
    for lang in args.langs:
        lang_start = time.perf_counter()
        train = read_lines(SHARED_CORPORA / lang / "train.txt", limit=args.train_lines)
        heldout = read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=args.eval_lines)
        entry = report["languages"][lang] = {"train_lines": len(train), "eval_lines": len(heldout), "runs": []}
        model, _ = load_model(args.model)
        entry["source"] = bits_per_byte(model, source_tokenizer, heldout, show_progress=False)
        del model
        start = time.perf_counter()
        target = train_tokenizer(train, "bytelevel-bpe", args.vocab_size, like=source_tokenizer)
        target = with_source_specials(source_tokenizer, target)
        entry["tokenizer_seconds"] = time.perf_counter() - start
        plan = VocabPlan.from_tokenizers(source_tokenizer, target, "replace")
        entry["plan"] = plan.summary()
        before = fertility(encode_lines(source_tokenizer, heldout), heldout)
        after = fertility(encode_lines(target, heldout), heldout)
        entry["tokens_per_line_before"], entry["tokens_per_line_after"] = (
            before["tokens_per_line_mean"],
            after["tokens_per_line_mean"],
        )
        entry["speedup"] = speedup(before["tokens_per_line_mean"], after["tokens_per_line_mean"])
        print(
            f"{lang}: source {entry['source']['bits_per_byte']:.3f} bits/byte; target {len(target)} tokens, "
            f"{len(plan.copied)} copied, speedup {entry['speedup']:.2f}",
            flush=True,
        )
        resources = {"fasttext": {"min_count": args.fasttext_min_count}}
        if any(m.startswith("salt") for m in args.methods):
            from vocgraft.train.plm import train_small_plm

            start = time.perf_counter()
            plm = train_small_plm(
                target, train, steps=args.plm_steps, max_seconds=args.plm_minutes * 60, show_progress=False
            )
            entry["plm_seconds"] = time.perf_counter() - start
            log = plm.vocgraft_training
            entry["plm"] = {k: log[k] for k in ("steps", "tokens_seen", "epochs", "first_loss", "last_loss")}
            resources["target_embeddings"] = plm.get_input_embeddings().weight.detach().float()
            resources["target_plm_tokens"] = raw_tokens(target)  # what --target-plm gives: rows matched by string
        for method in args.methods:
            model, _ = load_model(args.model)
            with PeakRSS() as memory:
                seconds, used = init_and_graft(
                    model, plan, source_tokenizer, target, method, corpus=train, resources=resources
                )
            if "token_vectors" in used:  # fastText vectors serve FOCUS and SALT alike: train them once
                resources["token_vectors"] = used["token_vectors"]
            bpb = bits_per_byte(model, target, heldout, show_progress=False)
            stats = method_stats(used)
            fasttext_seconds = stats.get("focus_stats", {}).get("fasttext_seconds", 0.0)
            salt = _salt_stats(stats)
            if salt.get("token_vectors_trained_here"):
                fasttext_seconds = salt["token_vectors_seconds"]
            run = {
                "method": method,
                "init_seconds": seconds,
                "fasttext_seconds": fasttext_seconds,  # part of init_seconds (0 where vectors were reused)
                "init_peak_extra_mib": memory.extra_mib,
                "stats": stats,
                "bpb": bpb,
            }
            entry["runs"].append(run)
            print(
                f"{lang} {method}: {bpb['bits_per_byte']:.3f} bits/byte (uniform "
                f"{bpb['uniform_bits_per_byte']:.3f}), init {seconds:.1f} s",
                flush=True,
            )
            write_json(f"{args.out}.json", report)
        if lang in args.deepfocus_langs:
            from focus_speed import compare_with_deepfocus

            model, _ = load_model(args.model)
            entry["deepfocus"] = compare_with_deepfocus(model, source_tokenizer, target, train)
            end = entry["deepfocus"]["end_to_end"]
            print(f"{lang} deepfocus: ours {end['ours_s']:.1f} s vs {end['deepfocus_s']:.1f} s", flush=True)
        entry["wall_seconds"] = time.perf_counter() - lang_start
        write_json(f"{args.out}.json", report)
    write_markdown(report, f"{args.out}.md")


def write_markdown(report: dict, path: str) -> None:
    parts = [
        f"# Vocabulary replacement right after initialization: {report['model']}\n",
        f"{report['machine']}, {report['date']}. Bits/byte on the first {report['args']['eval_lines']} held-out "
        "lines; the uniform reference is what a model knowing only the target tokenizer scores. FOCUS and SALT: "
        f"fastText minCount {report['args'].get('fasttext_min_count', 10)}. SALT's target PLM: GPT-2-style, 2 layers, "
        f"budget {_plm_budget(report['args'])}, trained on the training lines with the target tokenizer.\n",
    ]
    if not report["args"].get("deepfocus_langs"):
        parts.append("The comparison with the official deepfocus package was not run (--deepfocus-langs empty).\n")
    for lang, e in report["languages"].items():
        parts.append(
            f"\n## {lang}\n\nsource: {e['source']['bits_per_byte']:.3f} bits/byte at "
            f"{e['tokens_per_line_before']:.1f} tokens/line; target tokenizer {e['plan']['target_size']} "
            f"tokens ({e['plan']['copied']} copied), {e['tokens_per_line_after']:.1f} tokens/line, speedup "
            f"{e['speedup']:.2f}; PLM training for SALT {e.get('plm_seconds', 0):.0f} s "
            f"({e.get('plm', {}).get('steps', 0)} steps, loss {e.get('plm', {}).get('first_loss') or 0:.2f} -> "
            f"{e.get('plm', {}).get('last_loss') or 0:.2f})"
            + (f"; wall time {e['wall_seconds'] / 60:.1f} min" if "wall_seconds" in e else "")
            + "\n"
        )
        rows = [
            [
                r["method"],
                r["bpb"]["bits_per_byte"],
                r["bpb"]["uniform_bits_per_byte"],
                r["bpb"]["bits_per_byte"] < r["bpb"]["uniform_bits_per_byte"],
                r["init_seconds"] - r["fasttext_seconds"],
                r["fasttext_seconds"],
                r["init_peak_extra_mib"],
                _fallback_share(r["stats"]),
            ]
            for r in e["runs"]
        ]
        parts.append(
            markdown_table(
                [
                    "init",
                    "bits/byte",
                    "uniform",
                    "beats uniform",
                    "init s (no fastText)",
                    "fastText s",
                    "init MiB",
                    "fell back to Random",
                ],
                rows,
            )
        )
        if "deepfocus" in e:
            d = e["deepfocus"]
            end, parity, wrong = d["end_to_end"], d["parity_same_vectors"], d["deepfocus_misassigned_tokens"]
            parts.append(
                f"\nOfficial deepfocus on the same tokenizer and lines (exact overlap, same fastText settings): ours "
                f"{end['ours_s']:.1f} s end to end vs {end['deepfocus_s']:.1f} s (ratio "
                f"{end['ratio_ours_over_deepfocus']:.2f}); FOCUS step on the same vectors "
                f"{d['focus_step_same_vectors']['ours_s']:.2f} s vs {d['focus_step_same_vectors']['deepfocus_s']:.2f}"
                f" s. Parity on those vectors: {parity['rows_within_1e-4']} of {parity['rows_compared']} rows within "
                f"1e-4 ({parity['rows_touching_disputed_keys']} rows draw on a token deepfocus mis-copies and cannot "
                f"agree; with deepfocus's own overlap max abs diff "
                f"{parity['with_deepfocus_overlap']['max_abs_diff'] or float('nan'):.1e}). deepfocus copies a wrong "
                "source row "
                f"for {wrong['total']} target tokens ({wrong['partial_utf8']} partial UTF-8, {wrong['whitespace']} "
                "whitespace).\n"
            )
    Path(path).write_text("\n".join(parts) + "\n", encoding="utf-8")


def _plm_budget(args: dict) -> str:
    """The PLM's training budget as the run set it: steps and/or minutes, whichever ran out first."""
    steps, minutes = args.get("plm_steps"), args.get("plm_minutes")
    return " or ".join(part for part in (steps and f"{steps} steps", minutes and f"{minutes:g} minutes") if part)


def _fallback_share(stats: dict) -> float | None:
    """Share of new tokens a method could not place by its own rule and gave a Random row."""
    if "focus_stats" in stats:
        return stats["focus_stats"]["fallback_share"]
    salt = _salt_stats(stats)
    if salt:
        return salt["random_fallback"] / salt["new"] if salt.get("new") else None
    return None


def _salt_stats(stats: dict) -> dict:
    """The statistics of salt or salt-centered (same fields), or {}."""
    return stats.get("salt_stats") or stats.get("salt_centered_stats") or {}


if __name__ == "__main__":
    main()
