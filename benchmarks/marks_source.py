"""How the rewritten split regex alone (--keep-marks, no new tokens) changes each byte-level source's tokenization.

For every byte-level family in ../shared/tokenizers and SmolLM2: on all held-out lines of every shared language,
the share of lines whose ids change, tokens/line before and after, whether every line round-trips, and how many of
the tokens are ones the source never produced before. English (and every language without combining marks) must
show no change at all. Then, per family, an expansion by k tokens (tokenizer only: auxiliary BPE trained like the
source, with and without marks kept) of each of --expand-langs: tokens added, speedup on held-out text, English
unchanged, and what ``auto`` decides. Tokenizers only, no model.

    .venv/bin/python benchmarks/marks_source.py [--expand-langs hi th] [--expand-k 2000]
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

from common import new_report
from expansion import english_changed_share
from marks import source_change

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.models import load_tokenizer
from vocgraft.outdir import write_json
from vocgraft.recipes.expand import train_aux_tokenizer
from vocgraft.recipes.expansion_checks import expansion_summary
from vocgraft.report import markdown_table
from vocgraft.tokenization import expand_tokenizer
from vocgraft.tokenization.marks import (
    choose_keep_marks,
    cuts_marks,
    mark_share,
    never_produced,
    with_marks,
)
from vocgraft.tokenization.scripts import dominant_scripts

RESULTS = Path(__file__).resolve().parent / "results"
TOKENIZERS = Path(os.environ.get("VOCGRAFT_TOKENIZERS") or SHARED_CORPORA.parent / "tokenizers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "marks_source"))
    parser.add_argument("--expand-langs", nargs="*", default=["hi", "th"])
    parser.add_argument("--expand-k", type=int, default=2000)
    parser.add_argument("--aux-vocab-size", type=int, default=16000)
    args = parser.parse_args()
    report = new_report("byte-level families", args, sources={}, never_produced={}, expansions={})
    langs = sorted(p.name for p in SHARED_CORPORA.iterdir() if (p / "heldout.txt").is_file())
    heldout = {lang: read_lines(SHARED_CORPORA / lang / "heldout.txt") for lang in langs}
    report["mark_share"] = {lang: mark_share(lines, max_lines=len(lines)) for lang, lines in heldout.items()}
    names = sorted(p.name for p in TOKENIZERS.iterdir() if (p / "tokenizer.json").is_file()) + ["smollm2"]
    for name in names:
        source = load_tokenizer(name if name == "smollm2" else TOKENIZERS / name)
        if not cuts_marks(source):
            print(f"{name}: does not cut marks from letters (not rewritten)", flush=True)
            continue
        kept = with_marks(source)
        dead = never_produced(source)
        report["never_produced"][name] = len(dead)
        entry = report["sources"][name] = {}
        for lang, lines in heldout.items():
            change = source_change(source, kept, lines)
            ids = kept(lines, add_special_tokens=False)["input_ids"]
            change["roundtrip_exact"] = all(kept.decode(row) == line for row, line in zip(ids, lines))
            change["never_produced_share"] = sum(i in dead for row in ids for i in row) / sum(map(len, ids))
            entry[lang] = change
        changed = {lang: f"{c['changed_line_share']:.1%}" for lang, c in entry.items() if c["changed_line_share"]}
        print(f"{name}: lines changed {changed or 'none'}", flush=True)
        report["expansions"][name] = {
            lang: expansions(args, source, kept, lang, heldout[lang], heldout["en"]) for lang in args.expand_langs
        }
        write_json(f"{args.out}.json", report)
    write_json(f"{args.out}.json", report)
    write_markdown(report, f"{args.out}.md")


def expansions(args, source, kept, lang: str, heldout: list[str], english: list[str]) -> dict:
    """Expand ``source`` by k tokens of ``lang`` with marks cut (as it is) and kept; tokenizer only."""
    train = read_lines(SHARED_CORPORA / lang / "train.txt")
    out = {"auto": choose_keep_marks("auto", source, train).to_dict()}
    for keep, splitting in (("off", source), ("on", kept)):
        aux = train_aux_tokenizer(splitting, train, args.aux_vocab_size)
        with warnings.catch_warnings():  # "only N of k could be added" is what is measured
            warnings.simplefilter("ignore")
            expansion = expand_tokenizer(splitting, aux, train, args.expand_k, scripts=dominant_scripts(train))
        tokenizer = expansion.tokenizer
        new_ids = expansion.new_ids
        out[keep] = {
            "added": len(expansion.new_tokens),
            **expansion_summary(source, tokenizer, new_ids, heldout),
            "english_changed_share": english_changed_share(source, tokenizer, english),
        }
        print(
            f"  {lang} keep marks {keep}: added {out[keep]['added']} of {args.expand_k}, speedup "
            f"{out[keep]['speedup']:.3f}, English changed {out[keep]['english_changed_share']:.1%}",
            flush=True,
        )
    return out


def write_markdown(report: dict, path: str) -> None:
    parts = [
        "# The rewritten split regex alone: how each byte-level source tokenizes the shared held-out text\n",
        f"{report['machine']}, {report['date']}. All 2,000 held-out lines per language; no new tokens. A cell is "
        "the share of lines whose ids change, then tokens/line before -> after (only where something changed); "
        "'-' = identical ids on every line. Every line round-trips with the rewritten regex: "
        f"{all(c['roundtrip_exact'] for e in report['sources'].values() for c in e.values())}.\n",
    ]
    langs = list(report["mark_share"])
    rows = [["combining marks / letters", *(f"{report['mark_share'][lang]:.1%}" for lang in langs)]]
    for name, entry in report["sources"].items():
        cells = []
        for lang in langs:
            c = entry[lang]
            cells.append(
                f"{c['changed_line_share']:.1%}: {c['tokens_per_line_before']:.2f} -> {c['tokens_per_line_after']:.2f}"
                if c["changed_line_share"]
                else "-"
            )
        rows.append([name, *cells])
    parts.append(markdown_table(["", *langs], rows))
    parts.append(
        "\nTokens spanning a letter and the mark after it, which a regex that cuts marks off never produces (a "
        "model trained through such a regex never saw them), and their share of the tokens each language gets with "
        "marks kept ('-' = none):\n"
    )
    rows = []
    for name, entry in report["sources"].items():
        shares = [entry[lang]["never_produced_share"] for lang in langs]
        rows.append([name, report["never_produced"][name], *(f"{x:.1%}" if x else "-" for x in shares)])
    parts.append(markdown_table(["", "tokens", *langs], rows))
    args = report["args"]
    parts.append(
        f"\nExpansion by k={args['expand_k']} (auxiliary byte-level BPE of {args['aux_vocab_size']} tokens on all "
        "training lines, trained like the source with marks cut or kept; new tokens in the corpus's script; speedup "
        "on all held-out lines; 'en changed': English held-out lines whose ids differ from the source's). `auto` is "
        "what `--keep-marks auto` decides for that source and corpus.\n"
    )
    rows = []
    for name, per_lang in report["expansions"].items():
        for lang, e in per_lang.items():
            auto = "on" if e["auto"]["keep"] else f"off ({e['auto']['reason']})"
            for keep in ("off", "on"):
                r = e[keep]
                rows.append([name, lang, keep, r["added"], r["speedup"], r["english_changed_share"], auto])
    parts.append(markdown_table(["source", "lang", "keep marks", "added", "speedup", "en changed", "auto"], rows))
    Path(path).write_text("\n".join(parts) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
