"""VocADT benchmark: adapter training vs untrained Mean / FOCUS and vs embeddings-only LAPT, same target tokenizer.

Per language: one target tokenizer (byte-level BPE like SmolLM2's, trained on the shared train split), then

- Mean and FOCUS replacement without training (the starts everybody has);
- VocADT (sparse adapter, K candidates) for N steps at alpha 0 and 0.1 (`vocgraft vocadt`);
- embeddings-only LAPT for the same N steps from the Mean replacement (`vocgraft train --strategy embeddings`):
  VocADT's A0 E_old is the Mean start, so this isolates "learn rows directly" vs "learn mixing weights".

Every training runs as its own `vocgraft` process, so the peak RSS it records is that run's alone. Reports
held-out bits/byte next to the uniform reference, tokens/line, step time, peak RSS, and the dense adapter's memory
(computed: it does not fit this machine).

    .venv/bin/python benchmarks/vocadt.py [--langs el] [--steps 30] [--lines 4096] [--eval-lines 200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import new_report

from vocgraft.cli import SHARED_CORPORA, write_json
from vocgraft.corpus import read_lines
from vocgraft.eval import bits_per_byte, encode_lines, fertility
from vocgraft.models import load_model, load_tokenizer
from vocgraft.recipes.replace import replace_model
from vocgraft.report import markdown_table
from vocgraft.tokenization import train_tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
VOCGRAFT = [sys.executable, "-m", "vocgraft.cli"]


def heldout(model_dir: str, lines: list[str]) -> dict:
    model, tokenizer = load_model(model_dir)
    result = bits_per_byte(model, tokenizer, lines, show_progress=False)
    tokens = fertility(encode_lines(tokenizer, lines), lines)["tokens_per_line_mean"]
    return {
        "bits_per_byte": result["bits_per_byte"],
        "uniform": result["uniform_bits_per_byte"],
        "tokens_per_line": tokens,
    }


def run_cli(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(VOCGRAFT + args, check=True, env={**os.environ, "VOCGRAFT_NO_PROGRESS": "1"})
    return time.perf_counter() - start


def trained_facts(out: Path) -> dict:
    manifest = json.loads((out / "vocgraft.json").read_text(encoding="utf-8"))
    m = manifest["metrics"]
    facts = {
        "steps": m["steps"],
        "seconds_per_step": m["train_seconds"] / m["steps"],
        "tokens_per_second": m["tokens_per_second"],
        "peak_rss_mib": m["peak_rss_mib"],
        "trainable_parameters": m["trainable_parameters"],
        "val_loss_start": m["val_loss_start"],
        "val_loss_end": m["val_loss_end"],
    }
    if "vocadt" in manifest:
        facts["adapter"] = manifest["vocadt"]
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--langs", nargs="*", default=["el"])
    parser.add_argument("--vocab-size", type=int, default=50000)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lines", type=int, default=4096, help="|D|: sampled training lines")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--vocadt-lr", type=float, default=3e-4)
    parser.add_argument("--lapt-lrs", nargs="*", type=float, default=[1e-4, 3e-4], help="embeddings-only LAPT lrs")
    parser.add_argument("--alphas", nargs="*", type=float, default=[0.0, 0.1])
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--eval-lines", type=int, default=200)
    parser.add_argument("--out", default=str(RESULTS / "vocadt"))
    args = parser.parse_args()

    report = new_report(args.model, args, langs={})
    with tempfile.TemporaryDirectory(prefix="vocgraft-vocadt-") as scratch:
        work = Path(scratch)
        for lang in args.langs:
            train = str(SHARED_CORPORA / lang / "train.txt")
            lines = read_lines(train)
            text = read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=args.eval_lines)
            tokenizer_dir = work / f"{lang}-tokenizer"
            like = load_tokenizer(args.model)
            train_tokenizer(lines, "bytelevel-bpe", args.vocab_size, like=like).save_pretrained(tokenizer_dir)
            entry = {"source": heldout(args.model, text), "runs": []}
            report["langs"][lang] = entry
            print(f"{lang} source: {entry['source']}", flush=True)
            for init in ("mean", "focus"):
                out = work / f"{lang}-{init}"
                start = time.perf_counter()
                replace_model(args.model, lines, init, out, tokenizer_spec=str(tokenizer_dir))
                run = {"name": f"{init} (no training)", "init_seconds": time.perf_counter() - start}
                entry["runs"].append(run | heldout(str(out), text))
                print(f"{lang} {entry['runs'][-1]}", flush=True)
                write_json(f"{args.out}.json", report)
            budget = ["--max-steps", str(args.steps), "--sample", str(args.lines), "--batch-size", str(args.batch_size)]
            budget += ["--seq-len", str(args.seq_len), "--val-lines", "64", "--eval-every", str(args.steps)]
            trainings = [
                (
                    f"VocADT alpha={alpha}",
                    ["vocadt", "--model", args.model, "--tokenizer", str(tokenizer_dir), "--alpha", str(alpha)]
                    + ["--max-candidates", str(args.candidates), "--lr", str(args.vocadt_lr)],
                )
                for alpha in args.alphas
            ]
            trainings += [
                (
                    f"Mean + embeddings-only LAPT lr={lr}",
                    ["train", "--model", str(work / f"{lang}-mean"), "--strategy", "embeddings", "--lr", str(lr)],
                )
                for lr in args.lapt_lrs
            ]
            for name, command in trainings:
                out = work / f"{lang}-trained"
                shutil.rmtree(out, ignore_errors=True)
                wall = run_cli(command + ["--corpus", train, "--out", str(out)] + budget)
                run = {"name": name, "wall_seconds": wall, **trained_facts(out), **heldout(str(out), text)}
                entry["runs"].append(run)
                print(f"{lang} {name}: {run['bits_per_byte']:.3f} bits/byte, {run['seconds_per_step']:.1f} s/step, "
                      f"peak RSS {run['peak_rss_mib']:.0f} MiB", flush=True)  # fmt: skip
                write_json(f"{args.out}.json", report)
        write_markdown(report, f"{args.out}.md")


def write_markdown(report: dict, path: str) -> None:
    a = report["args"]
    text = [
        f"# VocADT vs Mean, FOCUS and embeddings-only LAPT: {report['model']}\n",
        f"{report['machine']}, {report['date']}. Target tokenizer: byte-level BPE, {a['vocab_size']} requested, "
        f"trained on the shared train split. Training: {a['steps']} steps of {a['batch_size']} x {a['seq_len']} "
        f"tokens on {a['lines']} sampled lines; VocADT lr {a['vocadt_lr']} (sparse, K={a['candidates']}), "
        f"embeddings-only LAPT at the lrs named. Bits/byte on the first {a['eval_lines']} held-out lines.\n",
    ]
    for lang, entry in report["langs"].items():
        s = entry["source"]
        text.append(
            f"\n## {lang}\n\nsource: {s['bits_per_byte']:.3f} bits/byte at {s['tokens_per_line']:.1f} tokens/line\n"
        )
        rows = [
            [
                r["name"],
                r["bits_per_byte"],
                r["uniform"],
                r["tokens_per_line"],
                r.get("val_loss_start", "–"),
                r.get("val_loss_end", "–"),
                r.get("seconds_per_step", "–"),
                r.get("peak_rss_mib", "–"),
                r.get("trainable_parameters", "–"),
            ]
            for r in entry["runs"]
        ]
        header = ["run", "bits/byte", "uniform", "tokens/line", "val loss start", "val loss end", "s/step"]
        header += ["peak RSS MiB", "trainable"]
        text.append(markdown_table(header, rows))
        adapter = next((r["adapter"] for r in entry["runs"] if "adapter" in r), None)
        if adapter:
            m = adapter["memory"]
            text.append(
                f"\nAdapter: {adapter['form']}, width {adapter['width']}, "
                f"rows started as {adapter['rows_started_as']}; "
                f"training state (weights, gradient, AdamW moments) {m['sparse_training_bytes'] / 2**20:,.0f} MiB "
                f"sparse vs {m['dense_training_bytes'] / 2**30:,.1f} GiB dense (computed; the dense weights alone "
                f"{m['dense_weight_bytes'] / 2**30:,.1f} GiB).\n"
            )
    Path(path).write_text("\n".join(text) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
