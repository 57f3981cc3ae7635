"""LAPT speed: `vocgraft train`'s trainer against a bare transformers loop on the same batches, in float32 and under
bfloat16 autocast, what MTP costs, and how far a short run's loss curve under bf16 autocast is from float32's.

Eight arms on one model and one batch order: {trainer, bare loop} x {CLM, CLM + MTP} x {float32, bf16 autocast},
run one after another in this process, ``--repeats`` times each, interleaved: each round runs every arm once, and
within a (precision, objective) pair the side that goes first alternates between rounds, so a drift of the
machine's state hits both sides alike. The trainer is ``vocgraft.train.lapt.train`` with ``mixed_precision`` "no"
or "bf16" (what ``--mixed-precision auto`` picks on a CPU with bfloat16 instructions); the bare loop is forward,
backward, clipping and an AdamW step over the same trainable parameters, its forward and losses inside one
``torch.autocast(dtype=bfloat16)`` as accelerate wraps the trainer's. Master weights and optimizer state are
float32 on both sides. The bare loop takes the trainer's batches (``BatchOrder`` over the same packed chunks).
Step times exclude each run's first step (allocator and kernel warm-up); the trainer's per-step times come from
its log, so its model loading, validation and saving are reported apart.

Achieved FLOP/s: one step's matmul FLOPs over its median time, as a share of the roofline in the arm's dtype
(``roofline_lib``: model-shaped ``nn.Linear`` products in float32 or bfloat16, measured by roofline.py). A step's
FLOPs are counted from the configured model, nn.Linear by nn.Linear, as the roofline counts them: 2 per weight
per token forward, 2 for the input's gradient (every layer: the trained embeddings sit below them all) and 2 for
the weight's gradient where the weight trains (6 x params x tokens for full training); the LM head counts as a
Linear (tied or not), the embedding lookup as none. MTP adds its head's 6 x hidden x vocabulary x (seq - 2) per
sequence. Attention's own products (QK^T, AV) are left out, as in the roofline, so the shares are a lower bound.

The loss curve: the trainer, float32 and bf16 autocast, ``--curve-steps`` updates at ``--curve-seq-len`` from the
same seed; the report gives both curves and their largest difference.

    .venv/bin/python benchmarks/lapt_speed.py                       # 2x2, seq 512, batch 4, 4 steps per arm
    .venv/bin/python benchmarks/lapt_speed.py --strategy full --batch-size 2

Run it with the cores otherwise idle: it prints the load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import new_report
from roofline_lib import MODELS, cpu_results_stem, load_roofline, results_file_name

from vocgraft.corpus import SHARED_CORPORA, read_corpus
from vocgraft.devices import bf16_supported, cpu_runs_bf16_natively
from vocgraft.models import load_model
from vocgraft.outdir import write_json
from vocgraft.report import markdown_table
from vocgraft.settings.train import DEFAULT_JOIN
from vocgraft.train.data import BatchOrder, pack_tokens, split_validation
from vocgraft.train.lapt import TrainConfig, train
from vocgraft.train.objectives import next_token_loss
from vocgraft.train.strategies import configure

RESULTS = Path(__file__).resolve().parent / "results"
PRECISIONS = {"float32": "no", "bfloat16": "bf16"}  # the roofline's dtype -> accelerate's mixed_precision
# the loss curves' goal: bf16 autocast's mean loss over the last steps within this share of float32's
CURVE_TOLERANCE = 0.02


def training_chunks(tokenizer, args, corpus: str, seq_len: int) -> torch.Tensor:
    """The packed training sequences exactly as the trainer builds them (same sample, same validation split)."""
    lines = read_corpus(corpus, sample=args.lines, seed=args.seed)
    train_lines, _ = split_validation(lines, args.val_lines)
    return pack_tokens(tokenizer, train_lines, seq_len, join=DEFAULT_JOIN)  # the trainer's default join


def step_flops(model, tokens: int, mtp_tokens: int = 0) -> int:
    """Matmul FLOPs of one training step over ``tokens`` tokens (module docstring): every ``nn.Linear`` (the head
    included) forward and input gradient, plus the weight gradient where it trains; MTP's head on ``mtp_tokens``."""
    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            weights = module.weight.numel()
            total += (6 if module.weight.requires_grad else 4) * weights * tokens
    head = model.get_output_embeddings().weight
    return total + 6 * head.numel() * mtp_tokens


def bare_step_seconds(model_spec: str, corpus: str, args, mtp: bool, bf16: bool) -> tuple[list[float], int]:
    """(seconds per optimizer step, matmul FLOPs per step) of the plainest correct loop: transformers forward with
    labels-free logits, the same loss, backward, clipping and AdamW over the parameters the strategy trains."""
    device = torch.device(args.device)
    model, tokenizer = load_model(model_spec, "float32", device)
    model = configure(model, args.strategy)
    chunks = training_chunks(tokenizer, args, corpus, args.seq_len)
    order = BatchOrder(len(chunks), args.batch_size, args.seed)
    head = None
    if mtp:
        weight = model.get_output_embeddings().weight
        head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=device)
        head.weight.data.copy_(weight.data.float())
    params = [p for p in model.parameters() if p.requires_grad] + (list(head.parameters()) if head else [])
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    flops = step_flops(model, args.batch_size * args.seq_len, args.batch_size * (args.seq_len - 2) if mtp else 0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model.train()
    times = []
    for step in range(args.steps):
        tick = time.perf_counter()
        batch = chunks[order.indices(step)].to(device=device, dtype=torch.long)
        with autocast:  # one autocast region per forward, as accelerate's wrapper makes
            out = model(input_ids=batch, output_hidden_states=mtp)
            loss = next_token_loss(out.logits, batch[:, 1:])  # the trainer's loss: whole logits, no copy
            if head is not None:
                loss = loss + next_token_loss(head(out.hidden_states[-1][:, :-2]), batch[:, 2:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - tick)
    return times, flops


def trainer_run(model_spec: str, corpus: str, args, out: Path, *, mtp: bool, bf16: bool, **overrides) -> tuple:
    """(the run's per-step log, its summary) of the trainer."""
    settings = dict(
        model=model_spec, corpus=corpus, out=str(out), strategy=args.strategy, objective="mtp" if mtp else "clm",
        seq_len=args.seq_len, batch_size=args.batch_size, max_steps=args.steps, lr=args.lr, sample=args.lines,
        val_lines=args.val_lines, eval_every=args.steps, seed=args.seed, show_progress=False, overwrite=True,
        device=args.device, dtype="float32", mixed_precision=PRECISIONS["bfloat16" if bf16 else "float32"],
    )  # fmt: skip
    summary = train(TrainConfig(**(settings | overrides)))
    steps = json.loads((out / "train_log.json").read_text(encoding="utf-8"))["steps"]
    return steps, summary


def bf16_runs_natively(device: str) -> bool:
    return cpu_runs_bf16_natively() if device == "cpu" else bf16_supported(torch.device(device))


def loss_curves(model_spec: str, corpus: str, args, scratch: Path) -> dict:
    """The trainer's per-step losses in float32 and under bf16 autocast: same seed, data and schedule."""
    curves = {}
    for dtype in PRECISIONS:
        steps, summary = trainer_run(
            model_spec, corpus, args, scratch / f"curve-{dtype}", mtp=False, bf16=dtype == "bfloat16",
            seq_len=args.curve_seq_len, max_steps=args.curve_steps, eval_every=args.curve_steps,
            lr=args.curve_lr, warmup_steps=max(1, args.curve_steps // 10),
        )  # fmt: skip
        curves[dtype] = {"loss": [s["loss"] for s in steps], "val": summary["val"]}
        print(f"loss curve {dtype}: {curves[dtype]['loss']}", flush=True)
    a, b = curves["float32"]["loss"], curves["bfloat16"]["loss"]
    tail = max(1, len(a) // 4)
    last32, last16 = statistics.mean(a[-tail:]), statistics.mean(b[-tail:])
    return {
        **curves,
        "max_abs_difference": max(abs(x - y) for x, y in zip(a, b)),
        "tail_steps": tail,
        "tail_mean": {"float32": last32, "bfloat16": last16},
        "tail_relative_difference": abs(last16 - last32) / abs(last32),
        "tolerance": CURVE_TOLERANCE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lang", default="el")
    parser.add_argument("--corpus", help="default: the shared corpus of --lang")
    parser.add_argument("--strategy", default="2x2")
    parser.add_argument("--lines", type=int, default=2048)
    parser.add_argument("--val-lines", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per run (the first is not timed)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over every arm")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--curve-steps", type=int, default=20, help="updates of each loss curve (0: none)")
    parser.add_argument("--curve-seq-len", type=int, default=128)
    parser.add_argument("--curve-lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: every core")
    parser.add_argument("--dtypes", nargs="*", choices=list(PRECISIONS), default=None,
                        help="default: float32, and bfloat16 where the device runs it natively")  # fmt: skip
    parser.add_argument("--roofline", help="roofline.py's results (default: results/roofline-cpu-<this CPU>.json)")
    parser.add_argument("--out", help="default: results/lapt_speed-cpu-<this CPU> (a GPU: results/lapt_speed_gpu)")
    args = parser.parse_args()
    on_cpu = args.device.split(":")[0] == "cpu"
    args.out = args.out or (cpu_results_stem("lapt_speed") if on_cpu else str(RESULTS / "lapt_speed_gpu"))
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step of each run is not timed)")
    torch.set_num_threads(args.threads)
    if args.dtypes is None:  # an emulated bfloat16 (AVX2 CPUs) would time the emulation, at 1/100 of float32's rate
        args.dtypes = ["float32"] + (["bfloat16"] if bf16_runs_natively(args.device) else [])
    corpus = args.corpus or str(SHARED_CORPORA / args.lang / "train.txt")
    report = new_report(args.model, args, argv=sys.argv[1:], load_before=os.getloadavg(), arms={},
                        roofline_file=args.roofline or results_file_name(args.device))  # fmt: skip
    print(f"load average before: {report['load_before']}", flush=True)
    tokens = args.batch_size * args.seq_len
    with tempfile.TemporaryDirectory(prefix="vocgraft-lapt-speed-") as scratch:
        for repeat in range(args.repeats):
            for mtp in (False, True):
                for dtype in args.dtypes:
                    objective, bf16 = "mtp" if mtp else "clm", dtype == "bfloat16"
                    # alternate which side goes first, so a slow drift favours neither
                    sides = ("trainer", "bare") if repeat % 2 == 0 else ("bare", "trainer")
                    for side in sides:
                        if side == "trainer":
                            out = Path(scratch) / "out"
                            steps, summary = trainer_run(args.model, corpus, args, out, mtp=mtp, bf16=bf16)
                            times, flops = [s["seconds"] for s in steps], None  # the bare arm's (summarize)
                            extra = {"wall_seconds": summary["wall_seconds"], "train_seconds": summary["train_seconds"],
                                     "mixed_precision": summary["mixed_precision"]}  # fmt: skip
                        else:
                            (times, flops), extra = bare_step_seconds(args.model, corpus, args, mtp, bf16), {}
                        name = f"{side} {objective} {dtype}"
                        arm = report["arms"].setdefault(name, {"step_seconds": [], "runs": [], "step_flops": flops})
                        arm["step_seconds"] += times[1:]
                        arm["runs"].append({"all_step_seconds": times, **extra})
                        median = statistics.median(times[1:])
                        print(f"{name}: median {median:.2f} s/step, {tokens / median:.0f} tokens/s, "
                              f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
                        write_json(f"{args.out}.json", report)
        if args.curve_steps and len(args.dtypes) == len(PRECISIONS):
            report["loss_curves"] = loss_curves(args.model, corpus, args, Path(scratch))
    summarize(report, args)
    report["load_after"] = os.getloadavg()
    write_json(f"{args.out}.json", report)
    write_markdown(report, Path(f"{args.out}.md"))
    print(f"trainer / bare: {report['trainer_vs_bare']}; MTP cost per step: {report['mtp_cost']}")


def summarize(report: dict, args) -> None:
    """Medians, tokens/s and roofline shares per arm; trainer/bare ratios, bf16 speed-ups and MTP's costs."""
    tokens = args.batch_size * args.seq_len
    roofline_model = args.model if args.model in MODELS else None
    a = report["arms"]
    for name, arm in a.items():
        if name.startswith("trainer "):  # the trainer computes the products the bare loop does, on the same model
            arm["step_flops"] = a[name.replace("trainer ", "bare ", 1)]["step_flops"]
        dtype = name.split()[-1]
        arm["median_step_seconds"] = statistics.median(arm["step_seconds"])
        arm["tokens_per_second"] = tokens / arm["median_step_seconds"]
        arm["gflops"] = arm["step_flops"] / arm["median_step_seconds"] / 1e9
        peak = load_roofline(args.device, dtype, model=roofline_model, path=args.roofline)
        arm["roofline_gflops"] = peak
        arm["roofline_share"] = arm["gflops"] / peak if peak else None
    dtypes = args.dtypes  # the arms measured: float32, and bfloat16 where it is native
    pairs = [(o, d) for o in ("clm", "mtp") for d in dtypes]
    report["trainer_vs_bare"] = {
        f"{o} {d}": a[f"trainer {o} {d}"]["tokens_per_second"] / a[f"bare {o} {d}"]["tokens_per_second"]
        for o, d in pairs
    }
    seconds = {name: arm["median_step_seconds"] for name, arm in a.items()}
    report["bf16_speedup"] = {
        f"{side} {o}": seconds[f"{side} {o} float32"] / seconds[f"{side} {o} bfloat16"]
        for side in ("trainer", "bare")
        for o in ("clm", "mtp")
        if len(dtypes) == len(PRECISIONS)
    }
    report["mtp_cost"] = {}
    for side in ("trainer", "bare"):
        for d in dtypes:
            mtp, clm = a[f"{side} mtp {d}"], a[f"{side} clm {d}"]
            extra = mtp["median_step_seconds"] - clm["median_step_seconds"]
            head_flops = mtp["step_flops"] - clm["step_flops"]
            # the head's FLOPs at the rate the CLM step reaches: what MTP should cost at most
            report["mtp_cost"][f"{side} {d}"] = {
                "share": extra / clm["median_step_seconds"],
                "seconds": extra,
                "head_gflop": head_flops / 1e9,
                "head_seconds_at_clm_rate": head_flops / (clm["step_flops"] / clm["median_step_seconds"]),
            }


def loads(averages) -> str:
    return " / ".join(f"{x:.1f}" for x in averages)


def write_markdown(report: dict, path: Path) -> None:
    a = report["args"]
    rows = [
        [name, len(arm["step_seconds"]), arm["median_step_seconds"], min(arm["step_seconds"]),
         max(arm["step_seconds"]), arm["tokens_per_second"], arm["gflops"],
         "" if arm["roofline_share"] is None else f"{arm['roofline_share']:.0%}"]
        for name, arm in report["arms"].items()
    ]  # fmt: skip
    ratio, speedup = report["trainer_vs_bare"], report["bf16_speedup"]
    text = [
        f"# LAPT speed: trainer vs a bare loop, {' and '.join(a['dtypes'])}, {report['model']}\n",
        f"{report['machine']}, {report['date']}, device {a['device']}; load average (1, 5, 15 min) "
        f"{loads(report['load_before'])} before and {loads(report['load_after'])} after. Strategy {a['strategy']}, "
        f"{a['corpus'] or a['lang']} |D| = {a['lines']} lines, sequence length {a['seq_len']}, batch "
        f"{a['batch_size']}, {a['steps']} steps per run (first untimed), {a['repeats']} round(s) over the arms, "
        "alternating which side goes first. Same packed chunks and batch order on both sides; master weights and "
        "optimizer state float32 in every arm.\n",
        "GFLOP/s: one step's matmul FLOPs (every nn.Linear incl. the head: 2 per weight per token forward, 2 for "
        "the input's gradient, 2 more for the weight's gradient where it trains; MTP adds 6 x hidden x vocabulary "
        "per predicted token; attention's QK^T and AV left out) over the median step time. Roofline: "
        f"{report['roofline_file']}'s step figure in the arm's dtype.\n",
        markdown_table(["arm", "timed steps", "median s/step", "min", "max", "tokens/s", "GFLOP/s", "of roofline"],
                       rows),  # fmt: skip
        "\nTrainer / bare loop tokens/s (goal: at least 0.9): "
        + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items())
        + ".",
        "bf16 autocast speed-up over float32 (step time): "
        + (", ".join(f"{k} {v:.2f}x" for k, v in speedup.items()) or "not measured (float32 only: --dtypes)"),
        "\nMTP's cost per step over CLM, against its extra head's FLOPs at the CLM step's rate (goal: at most that):\n",
        markdown_table(
            ["arm", "extra s/step", "share", "head GFLOP", "head s at CLM rate"],
            [[k, v["seconds"], f"{v['share']:+.1%}", v["head_gflop"], v["head_seconds_at_clm_rate"]]
             for k, v in report["mtp_cost"].items()],
        ),  # fmt: skip
    ]
    curves = report.get("loss_curves")
    if curves:
        text += [
            f"\nLoss curves, the trainer at sequence length {a['curve_seq_len']}, batch {a['batch_size']}, "
            f"{a['curve_steps']} updates, lr {a['curve_lr']}, same seed: largest per-step difference "
            f"{curves['max_abs_difference']:.4f}; mean of the last {curves['tail_steps']} steps float32 "
            f"{curves['tail_mean']['float32']:.4f}, bf16 {curves['tail_mean']['bfloat16']:.4f} "
            f"({curves['tail_relative_difference']:.2%} apart; goal: within {curves['tolerance']:.0%}).\n",
            markdown_table(
                ["step", "float32", "bf16 autocast"],
                [[i + 1, x, y] for i, (x, y) in enumerate(zip(curves["float32"]["loss"], curves["bfloat16"]["loss"]))],
            ),
        ]
    command = " ".join([".venv/bin/python benchmarks/lapt_speed.py", *report["argv"]])
    text += [f"\nCommand:\n\n    {command}\n"]
    path.write_text("\n".join(text), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
