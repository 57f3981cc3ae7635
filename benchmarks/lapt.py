"""LAPT benchmark: every strategy x objective on SmolLM2 expanded with 1000 Greek tokens (Align) and on the source.

For each (model, strategy, objective): train with `vocgraft train`'s code path on |D| sampled lines (validation
slice held out of them) for a fixed number of steps, and report training tokens/s, wall time, the validation loss
at the start and end, and bits/byte on held-out Greek before and after (with the uniform reference). Then the
trainer's overhead: tokens/s of our `full` strategy against a bare PyTorch loop (same model, batch, sequence length,
AdamW, clipping) in the same run.

    .venv/bin/python benchmarks/lapt.py [--steps 4] [--batch-size 2] [--seq-len 512] [--lines 4096]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import new_report

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval import bits_per_byte
from vocgraft.eval.downstream import new_token_ids
from vocgraft.models import load_model
from vocgraft.outdir import write_json
from vocgraft.recipes.expand import expand_model
from vocgraft.report import markdown_table
from vocgraft.train.data import pack_tokens
from vocgraft.train.lapt import TrainConfig, train
from vocgraft.train.objectives import OBJECTIVES
from vocgraft.train.strategies import STRATEGIES

RESULTS = Path(__file__).resolve().parent / "results"


def heldout_bpb(model_dir: str, lines: list[str], new_ids: set[int] | None) -> dict:
    """Bits/byte, and with ``new_ids`` the teacher-forced argmax rate of the new tokens from the same pass."""
    model, tokenizer = load_model(model_dir)
    result = bits_per_byte(model, tokenizer, lines, show_progress=False, new_token_ids=new_ids)
    keys = ["bits_per_byte", "uniform_bits_per_byte", "tokens_scored", "seconds"]
    keys += ["argmax_new_positions", "argmax_new_share", "argmax_first_piece_share"] if new_ids is not None else []
    return {k: result[k] for k in keys}


def bare_loop_tokens_per_second(model_spec: str, corpus: str, args) -> float:
    """The baseline: the plainest correct loop over the same model, batch and sequence length."""
    model, tokenizer = load_model(model_spec)
    lines = read_lines(corpus, sample=args.lines, seed=0)
    chunks = pack_tokens(tokenizer, lines, args.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    model.train()
    start = time.perf_counter()
    for step in range(args.steps):
        batch = chunks[step * args.batch_size : (step + 1) * args.batch_size]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return args.steps * args.batch_size * args.seq_len / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lang", default="el")
    parser.add_argument("--lines", type=int, default=4096, help="|D|: sampled training lines (2^12)")
    parser.add_argument("--val-lines", type=int, default=256)
    parser.add_argument("--eval-lines", type=int, default=100, help="held-out lines for bits/byte")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--strategies", nargs="*", default=list(STRATEGIES))
    parser.add_argument("--objectives", nargs="*", default=list(OBJECTIVES))
    parser.add_argument("--out", default=str(RESULTS / "lapt"))
    args = parser.parse_args()

    corpus = str(SHARED_CORPORA / args.lang / "train.txt")
    heldout = read_lines(SHARED_CORPORA / args.lang / "heldout.txt", limit=args.eval_lines)
    report = new_report(args.model, args, gpu="none lent to this session", models={}, runs=[])
    with tempfile.TemporaryDirectory(prefix="vocgraft-lapt-") as scratch:
        work = Path(scratch)
        start = time.perf_counter()
        expanded = str(work / f"expanded-k{args.k}")
        expand_model(args.model, read_lines(corpus, limit=32768), args.k, "align", expanded, aux_vocab_size=32000)
        report["expand_seconds"] = time.perf_counter() - start
        for name, spec in ((f"expanded k={args.k} align", expanded), ("source", args.model)):
            new_ids = new_token_ids(spec)  # the expanded model's plan; None for the source
            report["models"][name] = {"spec": spec, "before": heldout_bpb(spec, heldout, new_ids)}
            print(f"{name}: {report['models'][name]['before']['bits_per_byte']:.3f} bits/byte before", flush=True)
            for strategy in args.strategies:
                for objective in args.objectives:
                    out = work / f"trained-{strategy}-{objective}"
                    config = TrainConfig(
                        model=spec, corpus=corpus, out=str(out), strategy=strategy, objective=objective,
                        seq_len=args.seq_len, batch_size=args.batch_size, max_steps=args.steps, lr=args.lr,
                        sample=args.lines, val_lines=args.val_lines, eval_every=args.steps, show_progress=False,
                    )  # fmt: skip
                    summary = train(config)
                    run = {
                        "model": name,
                        "strategy": strategy,
                        "objective": objective,
                        **{k: summary[k] for k in ("steps", "tokens_per_second", "train_seconds", "wall_seconds")},
                        **{k: summary[k] for k in ("trainable_parameters", "total_parameters", "val_loss_start")},
                        "val_loss_end": summary["val_loss_end"],
                        "after": heldout_bpb(str(out), heldout, new_ids),
                    }
                    shutil.rmtree(out)
                    report["runs"].append(run)
                    print(
                        f"{name} {strategy}/{objective}: {run['tokens_per_second']:.0f} tok/s, val loss "
                        f"{run['val_loss_start']:.3f} -> {run['val_loss_end']:.3f}, bits/byte "
                        f"{run['after']['bits_per_byte']:.3f}",
                        flush=True,
                    )
                    write_json(f"{args.out}.json", report)
        ours = next(r for r in report["runs"] if r["model"] == "source" and r["strategy"] == "full")
        bare = bare_loop_tokens_per_second(args.model, corpus, args)
        report["overhead"] = {
            "ours_tokens_per_second": ours["tokens_per_second"],
            "bare_tokens_per_second": bare,
            "ratio": ours["tokens_per_second"] / bare,
        }
        print(f"trainer vs bare loop: {ours['tokens_per_second']:.0f} / {bare:.0f} tok/s", flush=True)
        write_json(f"{args.out}.json", report)
        write_markdown(report, f"{args.out}.md")


def write_markdown(report: dict, path: str) -> None:
    a = report["args"]
    rows = [
        [
            r["model"],
            r["strategy"],
            r["objective"],
            r["trainable_parameters"],
            r["tokens_per_second"],
            r["wall_seconds"],
            r["val_loss_start"],
            r["val_loss_end"],
            report["models"][r["model"]]["before"]["bits_per_byte"],
            r["after"]["bits_per_byte"],
            r["after"]["uniform_bits_per_byte"],
            r["after"].get("argmax_new_share"),
        ]
        for r in report["runs"]
    ]
    header = ["model", "strategy", "objective", "trainable", "tokens/s", "wall s", "val loss start", "val loss end"]
    header += ["bits/byte before", "bits/byte after", "uniform", "argmax new after"]
    o = report["overhead"]
    text = [
        f"# LAPT on {a['lang']}: {report['model']}\n",
        f"{report['machine']}, {report['date']}; GPU: {report['gpu']}. |D| = {a['lines']} sampled lines "
        f"({a['val_lines']} of them held out for the validation loss), seq-len {a['seq_len']}, "
        f"batch {a['batch_size']}, "
        f"{a['steps']} optimizer steps per run at lr {a['lr']} (warmup capped at 10% of the steps); bits/byte on the "
        f"first {a['eval_lines']} held-out lines; argmax new: where that text has a new token, the share of those "
        "positions where the trained model's argmax is that token (teacher-forced).\n",
        markdown_table(header, rows),
        f"\nTrainer overhead (source model, full, clm): {o['ours_tokens_per_second']:.0f} tokens/s vs a bare PyTorch "
        f"loop {o['bare_tokens_per_second']:.0f} tokens/s: ratio {o['ratio']:.3f}.\n",
    ]
    Path(path).write_text("\n".join(text) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
