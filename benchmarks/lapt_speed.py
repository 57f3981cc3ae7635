"""LAPT speed: `vocgraft train`'s trainer against a bare transformers loop on the same batches, and what MTP costs.

Four arms on one model and one batch order, run one after another in this process, twice each in alternating
order (so a drift of the machine's state hits both sides): the trainer (``vocgraft.train.lapt.train``) and a bare
loop (forward, backward, clipping, AdamW step over the same trainable parameters), each with the CLM objective and
with CLM + MTP (one extra head predicting t+2). The bare loop takes the trainer's batches (``BatchOrder`` over the
same packed chunks), so both see identical tokens. Step times exclude each run's first step (allocator warm-up);
the trainer's per-step times come from its log, so its model loading, validation and saving are reported apart.

    .venv/bin/python benchmarks/lapt_speed.py                       # 2x2, seq 512, batch 4, 4 steps per arm
    .venv/bin/python benchmarks/lapt_speed.py --strategy full --batch-size 2

Run it with the cores otherwise idle: it prints the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import new_report

from vocgraft.cli import SHARED_CORPORA, write_json
from vocgraft.corpus import read_corpus
from vocgraft.models import load_model
from vocgraft.report import markdown_table
from vocgraft.train.data import DEFAULT_JOIN, BatchOrder, pack_tokens, split_validation
from vocgraft.train.lapt import TrainConfig, train
from vocgraft.train.objectives import next_token_loss
from vocgraft.train.strategies import configure

RESULTS = Path(__file__).resolve().parent / "results"


def training_chunks(tokenizer, args, corpus: str) -> torch.Tensor:
    """The packed training sequences exactly as the trainer builds them (same sample, same validation split)."""
    lines = read_corpus(corpus, sample=args.lines, seed=args.seed)
    train_lines, _ = split_validation(lines, args.val_lines)
    return pack_tokens(tokenizer, train_lines, args.seq_len, join=DEFAULT_JOIN)  # the trainer's default join


def bare_step_seconds(model_spec: str, corpus: str, args, mtp: bool) -> list[float]:
    """Seconds per optimizer step of the plainest correct loop: transformers forward with labels-free logits, the
    same loss, backward, clipping and AdamW over the parameters the strategy trains."""
    model, tokenizer = load_model(model_spec)
    model = configure(model, args.strategy)
    chunks = training_chunks(tokenizer, args, corpus)
    order = BatchOrder(len(chunks), args.batch_size, args.seed)
    head = None
    if mtp:
        weight = model.get_output_embeddings().weight
        head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        head.weight.data.copy_(weight.data.float())
    params = [p for p in model.parameters() if p.requires_grad] + (list(head.parameters()) if head else [])
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    model.train()
    times = []
    for step in range(args.steps):
        tick = time.perf_counter()
        batch = chunks[order.indices(step)].long()
        out = model(input_ids=batch, output_hidden_states=mtp)
        loss = next_token_loss(out.logits[:, :-1], batch[:, 1:])
        if head is not None:
            loss = loss + next_token_loss(head(out.hidden_states[-1][:, :-2]), batch[:, 2:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - tick)
    return times


def trainer_step_seconds(model_spec: str, corpus: str, args, mtp: bool, out: Path) -> tuple[list[float], dict]:
    config = TrainConfig(
        model=model_spec, corpus=corpus, out=str(out), strategy=args.strategy, objective="mtp" if mtp else "clm",
        seq_len=args.seq_len, batch_size=args.batch_size, max_steps=args.steps, lr=args.lr, sample=args.lines,
        val_lines=args.val_lines, eval_every=args.steps, seed=args.seed, show_progress=False, overwrite=True,
    )  # fmt: skip
    summary = train(config)
    steps = json.loads((out / "train_log.json").read_text(encoding="utf-8"))["steps"]
    return [s["seconds"] for s in steps], summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lang", default="el")
    parser.add_argument("--strategy", default="2x2")
    parser.add_argument("--lines", type=int, default=2048)
    parser.add_argument("--val-lines", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per run (the first is not timed)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per arm, alternating trainer and bare")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: every core")
    parser.add_argument("--out", default=str(RESULTS / "lapt_speed"))
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step of each run is not timed)")
    torch.set_num_threads(args.threads)
    corpus = str(SHARED_CORPORA / args.lang / "train.txt")
    report = new_report(args.model, args, load_before=os.getloadavg(), arms={})
    print(f"load average before: {report['load_before']}", flush=True)
    tokens = args.batch_size * args.seq_len
    with tempfile.TemporaryDirectory(prefix="vocgraft-lapt-speed-") as scratch:
        for repeat in range(args.repeats):
            for mtp in (False, True):
                objective = "mtp" if mtp else "clm"
                # alternate which side goes first, so a slow drift favours neither
                sides = ("trainer", "bare") if repeat % 2 == 0 else ("bare", "trainer")
                for side in sides:
                    if side == "trainer":
                        times, summary = trainer_step_seconds(args.model, corpus, args, mtp, Path(scratch) / "out")
                        extra = {"wall_seconds": summary["wall_seconds"], "train_seconds": summary["train_seconds"]}
                    else:
                        times, extra = bare_step_seconds(args.model, corpus, args, mtp), {}
                    arm = report["arms"].setdefault(f"{side} {objective}", {"step_seconds": [], "runs": []})
                    arm["step_seconds"] += times[1:]
                    arm["runs"].append({"all_step_seconds": times, **extra})
                    median = statistics.median(times[1:])
                    print(f"{side} {objective}: median {median:.2f} s/step, {tokens / median:.0f} tokens/s", flush=True)
                    write_json(f"{args.out}.json", report)
    for arm in report["arms"].values():
        arm["median_step_seconds"] = statistics.median(arm["step_seconds"])
        arm["tokens_per_second"] = tokens / arm["median_step_seconds"]
    a = report["arms"]
    report["trainer_vs_bare"] = {
        o: a[f"trainer {o}"]["tokens_per_second"] / a[f"bare {o}"]["tokens_per_second"] for o in ("clm", "mtp")
    }
    report["mtp_cost"] = {
        side: a[f"{side} mtp"]["median_step_seconds"] / a[f"{side} clm"]["median_step_seconds"] - 1
        for side in ("trainer", "bare")
    }
    report["load_after"] = os.getloadavg()
    write_json(f"{args.out}.json", report)
    write_markdown(report, Path(f"{args.out}.md"))
    print(f"trainer / bare: {report['trainer_vs_bare']}; MTP cost per step: {report['mtp_cost']}")


def write_markdown(report: dict, path: Path) -> None:
    a = report["args"]
    rows = [
        [name, len(arm["step_seconds"]), arm["median_step_seconds"], min(arm["step_seconds"]),
         max(arm["step_seconds"]), arm["tokens_per_second"]]
        for name, arm in report["arms"].items()
    ]  # fmt: skip
    ratio, cost = report["trainer_vs_bare"], report["mtp_cost"]
    text = [
        f"# LAPT speed: trainer vs a bare loop, {report['model']}\n",
        f"{report['machine']}, {report['date']}; load average (1, 5, 15 min) {report['load_before']} before and "
        f"{report['load_after']} after. Strategy {a['strategy']}, {a['lang']} |D| = {a['lines']} lines, sequence "
        f"length {a['seq_len']}, batch {a['batch_size']}, {a['steps']} steps per run (first untimed), "
        f"{a['repeats']} runs per arm alternating which side goes first. Same packed chunks and batch order on both "
        "sides.\n",
        markdown_table(["arm", "timed steps", "median s/step", "min", "max", "tokens/s"], rows),
        f"\nTrainer / bare loop tokens/s: CLM {ratio['clm']:.3f}, MTP {ratio['mtp']:.3f} (goal: at least 0.9).",
        f"MTP's cost per step over CLM: trainer {cost['trainer']:+.1%}, bare loop {cost['bare']:+.1%}.\n",
        "Command:\n\n    .venv/bin/python benchmarks/lapt_speed.py\n",
    ]
    path.write_text("\n".join(text), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
