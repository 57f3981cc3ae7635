"""Keeping combining marks with their letters (--keep-marks): SmolLM2 expanded with and without it, Mean init.

For each language whose letters include combining marks: one auxiliary byte-level BPE per arm (trained like the
source, or like the source with marks kept), how many new tokens can be added at all, and for each k the tokens that
were added, speedup vs the source, the share of the new tokens the held-out text uses and of its tokens that are
new, bits/byte right after Mean initialization, and whether English held-out text tokenizes exactly as before. The
expansion runs through the recipe (`expand_loaded`, as `vocgraft expand` does). Also measured once per language:
how the source's own tokenization of the target text changes under the rewritten regex alone, and what ``auto``
decides.

    .venv/bin/python benchmarks/marks.py [--langs hi si te th ar] [--ks 1000 5000] [--eval-lines 500]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

from common import new_report
from expansion import english_changed_share

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval import bits_per_byte, encode_lines
from vocgraft.models import load_model
from vocgraft.outdir import write_json
from vocgraft.recipes.expand import expand_loaded, train_aux_tokenizer
from vocgraft.recipes.expansion_checks import expansion_summary
from vocgraft.report import markdown_table
from vocgraft.tokenization import expand_tokenizer
from vocgraft.tokenization.marks import choose_keep_marks, mark_share, split_patterns, with_marks
from vocgraft.tokenization.scripts import dominant_scripts

RESULTS = Path(__file__).resolve().parent / "results"


def source_change(source_tokenizer, kept, lines: list[str]) -> dict:
    """How the source's own tokenization of ``lines`` changes when only the split regex keeps marks."""
    before, after = encode_lines(source_tokenizer, lines), encode_lines(kept, lines)
    return {
        "lines": len(lines),
        "changed_line_share": sum(a != b for a, b in zip(before, after)) / len(lines),
        "tokens_per_line_before": sum(map(len, before)) / len(lines),
        "tokens_per_line_after": sum(map(len, after)) / len(lines),
    }


def new_token_text_share(tokenizer, new_ids, lines: list[str]) -> float:
    """Share of the held-out text's tokens that are new tokens."""
    new = set(new_ids)
    ids = encode_lines(tokenizer, lines)
    total = sum(map(len, ids))
    return sum(t in new for row in ids for t in row) / total if total else 0.0


def run_arm(args, lang, keep, source_tokenizer, train, heldout, english, protect, scripts) -> dict:
    splitting = with_marks(source_tokenizer) if keep else source_tokenizer
    start = time.perf_counter()
    aux = train_aux_tokenizer(splitting, train, args.aux_vocab_size)
    arm = {"keep_marks": keep, "aux_tokenizer_seconds": time.perf_counter() - start, "runs": []}
    # everything the auxiliary tokenizer offers: the most rows an expansion of these lines can add
    with warnings.catch_warnings():  # "only N of k could be added" is what this call measures
        warnings.simplefilter("ignore")
        everything = expand_tokenizer(splitting, aux, train, args.aux_vocab_size, protect=protect, scripts=scripts)
    arm["addable"] = len(everything.new_tokens)
    arm["addable_wanted"] = len(everything.wanted)
    print(f"{lang} keep_marks={keep}: {arm['addable']} tokens addable ({arm['addable_wanted']} wanted)", flush=True)
    for k in args.ks:
        model, _ = load_model(args.model)
        start = time.perf_counter()
        result = expand_loaded(
            model, source_tokenizer, train, k, "mean", aux_tokenizer=aux, protect=protect, scripts=scripts
        )
        seconds = time.perf_counter() - start
        if result.marks.keep != keep:  # auto follows the given aux tokenizer: the recipe must see the arm
            raise RuntimeError(f"the recipe chose {result.marks.describe()} for the keep_marks={keep} arm")
        tokenizer, new_ids = result.tokenizer, result.plan.new_ids
        run = {
            "k": k,
            "added": len(result.expansion.new_tokens),
            "intermediates": len(result.expansion.intermediates),
            "expand_and_init_seconds": seconds,
            **expansion_summary(source_tokenizer, tokenizer, new_ids, heldout),
            "new_token_text_share": new_token_text_share(tokenizer, new_ids, heldout),
            "english_changed_share": english_changed_share(source_tokenizer, tokenizer, english),
            "recipe_choice": result.marks.to_dict(),
            "bpb": bits_per_byte(model, tokenizer, heldout, show_progress=False),
        }
        arm["runs"].append(run)
        print(
            f"{lang} k={k} keep_marks={keep}: added {run['added']} ({run['intermediates']} intermediates), speedup "
            f"{run['speedup']:.3f}, {run['bpb']['bits_per_byte']:.3f} bits/byte, new used "
            f"{run['new_tokens_used_share']:.0%}, English changed {run['english_changed_share']:.1%}",
            flush=True,
        )
        del model
    return arm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--langs", nargs="*", default=["hi", "si", "te", "th", "ar"])
    parser.add_argument("--ks", nargs="*", type=int, default=[1000, 5000])
    parser.add_argument("--train-lines", type=int, default=32768)
    parser.add_argument("--eval-lines", type=int, default=500)
    parser.add_argument("--aux-vocab-size", type=int, default=32000)
    parser.add_argument("--protect-lines", type=int, default=8192, help="English training lines expansion keeps")
    parser.add_argument("--out", default=str(RESULTS / "marks"))
    parser.add_argument("--resume", action="store_true", help="keep the languages already in OUT.json")
    args = parser.parse_args()

    report = new_report(args.model, args, languages={})
    if args.resume and Path(f"{args.out}.json").is_file():
        report["languages"] = json.loads(Path(f"{args.out}.json").read_text(encoding="utf-8"))["languages"]
    english = read_lines(SHARED_CORPORA / "en" / "heldout.txt")
    protect = read_lines(SHARED_CORPORA / "en" / "train.txt", limit=args.protect_lines) if args.protect_lines else None
    model, source_tokenizer = load_model(args.model)
    kept = with_marks(source_tokenizer)
    report["split_patterns"] = {"source": split_patterns(source_tokenizer), "keep_marks": split_patterns(kept)}
    for lang in args.langs:
        if lang in report["languages"]:
            continue
        train = read_lines(SHARED_CORPORA / lang / "train.txt", limit=args.train_lines)
        full_heldout = read_lines(SHARED_CORPORA / lang / "heldout.txt")
        heldout = full_heldout[: args.eval_lines]
        scripts = dominant_scripts(train)
        auto = choose_keep_marks("auto", source_tokenizer, train)
        entry = report["languages"][lang] = {
            "train_lines": len(train),
            "eval_lines": len(heldout),
            "scripts": sorted(scripts),
            "mark_share": mark_share(train),
            "auto": auto.to_dict(),
            "source_change": source_change(source_tokenizer, kept, full_heldout),
            "source": bits_per_byte(model, source_tokenizer, heldout, show_progress=False),
        }
        change = entry["source_change"]
        if change["changed_line_share"]:  # the source model reading the rewritten regex's pieces
            entry["source_with_marks"] = bits_per_byte(model, kept, heldout, show_progress=False)
        print(
            f"{lang}: marks {entry['mark_share']:.1%} of letters, auto -> {auto.describe()}; source "
            f"{entry['source']['bits_per_byte']:.3f} bits/byte; rewritten regex alone changes "
            f"{change['changed_line_share']:.1%} of held-out lines",
            flush=True,
        )
        entry["arms"] = [
            run_arm(args, lang, keep, source_tokenizer, train, heldout, english, protect, scripts)
            for keep in (False, True)
        ]
        write_json(f"{args.out}.json", report)
    write_markdown(report, f"{args.out}.md")


def write_markdown(report: dict, path: str) -> None:
    args = report["args"]
    parts = [
        f"# Keeping combining marks with their letters: {report['model']} expansion, Mean init\n",
        f"{report['machine']}, {report['date']}. Auxiliary byte-level BPE of {args['aux_vocab_size']} tokens on up "
        f"to {args['train_lines']} training lines, trained like the source (keep marks off) or like the source with "
        f"marks kept (on); {args['protect_lines']} English training lines protected; new tokens restricted to the "
        "corpus's script. Bits/byte on the first held-out lines (their number is given per language) right after "
        "initialization; "
        "speedup = source tokens / expanded tokens on the same lines; 'new used' = share of the added tokens that "
        "occur there, 'new of text' = share of the text's tokens that are new; 'en changed' = share of the 2,000 "
        "English held-out lines whose ids differ from the source's.\n",
        f"Source split regex: `{report['split_patterns']['source'][0]}`\n",
        f"With marks kept: `{report['split_patterns']['keep_marks'][0]}`\n",
    ]
    summary = []
    for lang, entry in report["languages"].items():
        change = entry["source_change"]
        addable = ", ".join(f"{'on' if a['keep_marks'] else 'off'} {a['addable']:,}" for a in entry["arms"])
        extra = ""
        if "source_with_marks" in entry:
            extra = f", source model {entry['source_with_marks']['bits_per_byte']:.3f} bits/byte on them"
        parts.append(
            f"\n## {lang}\n\n{entry['eval_lines']} held-out lines. Combining marks: {entry['mark_share']:.1%} of the "
            "letters; `auto`: "
            f"{entry['auto']['reason']} -> {'on' if entry['auto']['keep'] else 'off'}. Source: "
            f"{entry['source']['bits_per_byte']:.3f} bits/byte. The rewritten regex alone (no new tokens) changes "
            f"the source's ids on {change['changed_line_share']:.1%} of the {change['lines']} held-out lines "
            f"({change['tokens_per_line_before']:.2f} -> {change['tokens_per_line_after']:.2f} tokens/line{extra}). "
            f"Addable at all: {addable}.\n"
        )
        rows = []
        for arm in entry["arms"]:
            for r in arm["runs"]:
                row = [
                    r["k"],
                    "on" if arm["keep_marks"] else "off",
                    r["added"],
                    r["intermediates"],
                    r["tokens_per_line_after"],
                    r["speedup"],
                    r["new_tokens_used_share"],
                    r["new_token_text_share"],
                    r["bpb"]["bits_per_byte"],
                    r["bpb"]["uniform_bits_per_byte"],
                    r["roundtrip_exact"],
                    r["english_changed_share"],
                ]
                rows.append(row)
                summary.append([lang, *row[:3], row[5], row[8], row[11]])
        rows.sort(key=lambda row: (row[0], row[1]))
        parts.append(
            markdown_table(
                [
                    "k",
                    "keep marks",
                    "added",
                    "intermediates",
                    "tokens/line",
                    "speedup",
                    "new used",
                    "new of text",
                    "bits/byte",
                    "uniform",
                    "round trip",
                    "en changed",
                ],
                rows,
            )
        )
    summary.sort(key=lambda row: (row[0], row[1], row[2]))
    parts.insert(
        4,
        "\n## Summary\n\n"
        + markdown_table(["lang", "k", "keep marks", "added", "speedup", "bits/byte", "en changed"], summary)
        + "\n",
    )
    Path(path).write_text("\n".join(parts) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
