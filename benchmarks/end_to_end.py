"""End to end: init -> LAPT -> faster generation at kept quality (issue 16's proof, or a reduced run of it).

Per language, rows for: the source; the source after LAPT; and for each k x init, the expanded model right after
initialization and after LAPT. LAPT is ``vocgraft train``'s code path with the papers' recommended recipe by
default (2x2 layers + MTP, sequence length 512, |D| = 2^12 sampled lines, one epoch). Each model is measured on:
held-out bits/byte (with the uniform reference); greedy and sampled generation on held-out prompts (the share of
generated tokens that are new, characters/s relative to the source on the same prompts in the same run,
characters per generated token); few-shot MT en->xx chrF. Next to the greedy share: the share of new tokens the
expanded tokenizer gives the held-out text (issue 16's goal: greedy reaches at least half of it).

The auxiliary tokenizer, the expansion and the corpus of corpus-based inits come from the first ``--aux-lines``
training lines; LAPT samples |D| lines of the whole training file. Every size is a flag; the md states them.

    nice -n 10 .venv/bin/python benchmarks/end_to_end.py                     # the issue's run (hours on a CPU)
    nice -n 10 .venv/bin/python benchmarks/end_to_end.py --langs el --ks 1000 --lines 256 --eval-lines 50 \\
        --prompts 10 --mt-pairs 20 --out benchmarks/results/end_to_end            # a reduced run
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import new_report
from distill import parse_init

from vocgraft.cli import SHARED_CORPORA, write_json
from vocgraft.corpus import read_lines
from vocgraft.eval import bits_per_byte
from vocgraft.eval.generation import generation_speed, prompts_from_lines
from vocgraft.eval.mt import read_pairs, translate_and_score
from vocgraft.models import load_model
from vocgraft.recipes.common import save_adapted
from vocgraft.recipes.expand import expand_loaded, train_aux_tokenizer
from vocgraft.report import markdown_table, speedup_quality_png
from vocgraft.train.lapt import TrainConfig, train

RESULTS = Path(__file__).resolve().parent / "results"
XLABEL = "greedy generation: characters/s relative to the source (same prompts, same run)"


def measure(model_dir: str, heldout, prompts, pairs, lang: str, args, new_ids=None) -> dict:
    """Every column of one row, for the model saved in ``model_dir``."""
    model, tokenizer = load_model(model_dir)
    start = time.perf_counter()
    out = {"bpb": bits_per_byte(model, tokenizer, heldout, show_progress=False)}
    for mode in ("greedy", "sampled"):
        out[mode] = generation_speed(
            model,
            tokenizer,
            prompts,
            sampled=mode == "sampled",
            max_new_tokens=args.max_new_tokens,
            new_token_ids=set(new_ids) if new_ids else None,
            seed=args.seed,
        )
    mt = translate_and_score(
        model, tokenizer, pairs, lang, shots=args.shots, limit=args.mt_pairs, max_new_tokens=args.mt_max_new_tokens
    )
    out["mt"] = {k: mt[k] for k in ("direction", "shots", "pairs", "chrf")} | {"rows": mt["rows"][:3]}
    out["eval_seconds"] = time.perf_counter() - start
    return out


def lapt(model_dir: str, out: str, corpus: str, args) -> dict:
    config = TrainConfig(
        model=model_dir, corpus=corpus, out=out, strategy=args.strategy, objective=args.objective,
        seq_len=args.seq_len, batch_size=args.batch_size, epochs=args.epochs, max_steps=args.max_steps, lr=args.lr,
        sample=args.lines, val_lines=args.val_lines, seed=args.seed, show_progress=False, overwrite=True,
    )  # fmt: skip
    summary = train(config)
    keep = ("steps", "epochs", "tokens_per_second", "train_seconds", "wall_seconds", "val_loss_start", "val_loss_end")
    return {k: summary.get(k) for k in keep}


def new_share(tokenizer, lines, new_ids) -> float:
    new = set(new_ids)
    ids = [t for row in tokenizer(list(lines), add_special_tokens=False)["input_ids"] for t in row]
    return sum(t in new for t in ids) / max(len(ids), 1)


def run_language(lang: str, args, report: dict, save) -> None:
    corpus = str(SHARED_CORPORA / lang / "train.txt")
    aux_lines = read_lines(corpus, limit=args.aux_lines)
    held = read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=args.eval_lines + args.prompts)
    heldout, prompts = held[: args.eval_lines], prompts_from_lines(held[args.eval_lines :])
    pairs = read_pairs(SHARED_CORPORA / "parallel" / f"en-{lang}.tsv")
    entry = report["langs"][lang] = {"rows": []}
    source_tokenizer = load_model(args.model)[1]

    def add(row: dict) -> None:
        entry["rows"].append(row)
        src = entry["rows"][0]
        for mode in ("greedy", "sampled"):
            row[mode]["chars_per_second_vs_source"] = row[mode]["chars_per_second"] / src[mode]["chars_per_second"]
        print(
            f"{lang} {row['name']}: {row['bpb']['bits_per_byte']:.3f} bits/byte, greedy new share "
            f"{row['greedy']['new_token_share'] or 0:.3f}, chars/s x{row['greedy']['chars_per_second_vs_source']:.2f}"
            f" (greedy) x{row['sampled']['chars_per_second_vs_source']:.2f} (sampled), chrF {row['mt']['chrf']:.1f}"
            f", {row['seconds']:.0f} s",
            flush=True,
        )
        save()

    def measured(name: str, stage: str, model_dir: str, start: float, new_ids=None, **fields) -> None:
        row = measure(model_dir, heldout, prompts, pairs, lang, args, new_ids)
        add(
            {
                "name": name,
                "stage": stage,
                "k": None,
                "init": None,
                **fields,
                **row,
                "seconds": time.perf_counter() - start,
            }
        )

    with tempfile.TemporaryDirectory(prefix="vocgraft-e2e-") as scratch:
        work = Path(scratch)
        measured("source", "source", args.model, time.perf_counter())
        start = time.perf_counter()
        trained = lapt(args.model, str(work / "source-lapt"), corpus, args)
        measured("source + LAPT", "LAPT", str(work / "source-lapt"), start, lapt=trained)
        aux = train_aux_tokenizer(source_tokenizer, aux_lines, args.aux_vocab_size)
        for k in args.ks:
            for spec in args.inits:
                label, method, options, _ = parse_init(spec)
                start = time.perf_counter()
                model, _ = load_model(args.model)
                done = expand_loaded(model, source_tokenizer, aux_lines, k, method, aux_tokenizer=aux, options=options)
                expanded = work / f"k{k}-{label}"
                manifest = {"method": {"init": method, "options": options, "new_tokens": k}}
                save_adapted(model, done.tokenizer, done.plan, expanded, overwrite=True, manifest=manifest)
                del model
                new_ids = done.plan.new_ids
                base = {"k": k, "init": label, "options": options, "init_seconds": done.timings["init_seconds"]}
                base["tokenizer_new_share"] = new_share(done.tokenizer, heldout, new_ids)
                measured(f"k={k} {label}", "init", str(expanded), start, new_ids, **base)
                start = time.perf_counter()
                trained = lapt(str(expanded), str(work / f"k{k}-{label}-lapt"), corpus, args)
                measured(f"k={k} {label} + LAPT", "LAPT", str(work / f"k{k}-{label}-lapt"), start, new_ids,
                         lapt=trained, **base)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--langs", nargs="*", default=["el", "hi", "ru"])
    parser.add_argument("--ks", nargs="*", type=int, default=[1000, 5000])
    parser.add_argument(
        "--inits", nargs="*", default=["mean", "align", "distill"], help="as in benchmarks/distill.py: label=key:value"
    )
    parser.add_argument("--aux-lines", type=int, default=8192, help="training lines for aux tokenizer and inits")
    parser.add_argument("--aux-vocab-size", type=int, default=16000)
    # LAPT: the papers' recipe
    parser.add_argument("--lines", type=int, default=4096, help="|D|: LAPT lines sampled from the training file")
    parser.add_argument("--strategy", default="2x2")
    parser.add_argument("--objective", default="mtp")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=None, help="overrides --epochs")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--val-lines", type=int, default=64)
    # evaluation
    parser.add_argument("--eval-lines", type=int, default=200, help="held-out lines for bits/byte")
    parser.add_argument("--prompts", type=int, default=20, help="held-out lines after them, cut into prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--mt-pairs", type=int, default=50)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--mt-max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a shared 2-core machine: 1)")
    parser.add_argument("--note", default="", help="a line for the md (e.g. why this is a reduced run)")
    parser.add_argument("--out", default=str(RESULTS / "end_to_end"))
    parser.add_argument("--markdown-only", action="store_true", help="write --out.md from --out.json (a stopped run)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.markdown_only:
        write_markdown(json.loads(Path(f"{args.out}.json").read_text(encoding="utf-8")), Path(f"{args.out}.md"))
        return

    report = new_report(args.model, args, gpu="none", langs={}, finished=False)
    start = time.perf_counter()

    def save() -> None:
        report["wall_seconds"] = time.perf_counter() - start
        write_json(f"{args.out}.json", report)

    for lang in args.langs:
        run_language(lang, args, report, save)
    report["finished"] = True
    save()
    write_markdown(report, Path(f"{args.out}.md"))


def write_markdown(report: dict, path: Path) -> None:
    a = report["args"]
    full = (
        a["lines"] == 4096 and a["ks"] == [1000, 5000] and a["epochs"] == 1.0 and a["max_steps"] is None
        and len(a["langs"]) >= 3 and a["eval_lines"] >= 200 and a["prompts"] == 20 and a["mt_pairs"] == 50
    )  # fmt: skip
    parts = [
        f"# End to end: init -> LAPT -> generation, {report['model']}\n",
        ("The issue's configuration." if full else "**A reduced run, not the issue's configuration** (see settings).")
        + (f" {a['note']}" if a["note"] else "")
        + (
            ""
            if report.get("finished")
            else " **The run was stopped before it finished: the rows below are the ones it completed.** "
            + report.get("stopped", "")
        )
        + "\n",
        f"{report['machine']}, no GPU, {report['date']}; the run took {report['wall_seconds'] / 60:.0f} "
        "minutes of wall time on a CPU shared with other jobs (speeds are relative to the source measured in the "
        "same run, on the same prompts).\n",
        f"Settings: languages {', '.join(a['langs'])}; k {', '.join(map(str, a['ks']))}; inits {', '.join(a['inits'])}"
        f"; auxiliary BPE of {a['aux_vocab_size']} on the first {a['aux_lines']} training lines (also the inits' "
        f"corpus). LAPT: {a['strategy']} + {a['objective']}, sequence length {a['seq_len']}, batch {a['batch_size']}"
        f", |D| = {a['lines']} sampled lines ({a['val_lines']} held out for validation), "
        + (f"{a['max_steps']} steps" if a["max_steps"] else f"{a['epochs']:g} epoch(s)")
        + f", lr {a['lr']}. Bits/byte on the first {a['eval_lines']} held-out lines; greedy and sampled generation "
        f"({a['max_new_tokens']} new tokens at most) on {a['prompts']} prompts cut from the held-out lines after "
        f"them; {a['shots']}-shot MT en->xx chrF on {a['mt_pairs']} pairs.\n",
        "Columns: 'greedy new' / 'sampled new': share of generated tokens that are new ids; 'text new': share of "
        "the held-out text's tokens that are new under the expanded tokenizer; 'x chars/s': characters per second "
        "relative to the source; 'c/tok': characters per generated token (greedy).\n",
        "Full run:\n\n    nice -n 10 .venv/bin/python benchmarks/end_to_end.py\n",
    ]
    for lang, entry in report["langs"].items():
        rows = [
            [
                r["name"], r["bpb"]["bits_per_byte"], r["bpb"]["uniform_bits_per_byte"],
                r["greedy"]["new_token_share"], r["sampled"]["new_token_share"], r.get("tokenizer_new_share"),
                r["greedy"]["chars_per_second_vs_source"], r["sampled"]["chars_per_second_vs_source"],
                r["greedy"]["chars_per_token"], r["mt"]["chrf"],
                r.get("lapt", {}).get("steps"), r["seconds"],
            ]
            for r in entry["rows"]
        ]  # fmt: skip
        header = ["model", "bits/byte", "uniform", "greedy new", "sampled new", "text new", "x chars/s greedy"]
        header += ["x chars/s sampled", "c/tok", "chrF en->xx", "LAPT steps", "seconds"]
        parts.append(f"\n## {lang}\n\n" + markdown_table(header, rows) + "\n")
        points = [
            {"init": f"{r['init'] or 'source'} ({r['stage']})", "speedup": r["greedy"]["chars_per_second_vs_source"],
             "bits_per_byte": r["bpb"]["bits_per_byte"], "new_tokens": r["k"]}
            for r in entry["rows"]
        ]  # fmt: skip
        png = path.with_name(f"{path.stem}-{lang}.png")
        png.write_bytes(speedup_quality_png(points, entry["rows"][0]["bpb"]["bits_per_byte"], 0.02, XLABEL))
        parts.append(f"![{lang}: greedy chars/s vs bits/byte]({png.name})\n")
    path.write_text("\n".join(parts), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
