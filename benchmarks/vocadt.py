"""VocADT benchmark: separate vs shared input/output adapters, and (``--baselines``) vs untrained Mean / FOCUS and
vs embeddings-only LAPT, all with the same target tokenizer and the same budget.

Per language: one target tokenizer (byte-level BPE like SmolLM2's, trained on the first ``--tokenizer-lines`` lines
of the shared train split), then

- Mean replacement without training (A0 E_old is the Mean start: where every VocADT run begins);
- VocADT (sparse adapter, K candidates) in each ``--forms`` form at each ``--alphas`` value, for N steps
  (`vocgraft vocadt --adapters FORM`): same steps, batch, sequence length, corpus sample and seed;
- with ``--baselines``: FOCUS without training, and embeddings-only LAPT for the same N steps from the Mean
  replacement (`vocgraft train --strategy embeddings`): "learn rows directly" vs "learn mixing weights".

Every training runs as its own `vocgraft` process, so the peak RSS it records is that run's alone. Reports
held-out bits/byte next to the uniform reference, tokens/line, the validation loss curve, step time, peak RSS,
trainable parameters and whether the saved model is tied, and the dense adapter's memory (computed: it does not fit
this machine).

    .venv/bin/python benchmarks/vocadt.py [--langs el hi] [--forms separate shared] [--steps 40] [--baselines]
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

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval import bits_per_byte, encode_lines, fertility
from vocgraft.models import load_model, load_tokenizer
from vocgraft.outdir import write_json
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
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    log = json.loads((out / "train_log.json").read_text(encoding="utf-8"))
    m = manifest["metrics"]
    facts = {
        "tied_output": bool(config.get("tie_word_embeddings", False)),
        "val_curve": [[v["step"], v["loss"]] for v in log["summary"]["val"]],
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


def step_timing(model_name: str, tokenizer_dir: Path, lines: list[str], args) -> dict:
    """Seconds per training step (forward, backward, AdamW) of each adapter form on one SmolLM2, the forms
    interleaved ``--timing-reps`` times so that each sees the same machine load; the shared form also without its
    once-per-forward reuse of ``A @ E_old`` (what every step paid before). Each timing is the second step after
    attaching (the first warms up)."""
    import statistics

    import torch
    from torch.nn.utils import parametrize

    from vocgraft.plan import VocabPlan
    from vocgraft.train.data import pack_tokens
    from vocgraft.train.objectives import LMObjective
    from vocgraft.train.strategies import configure
    from vocgraft.train.vocadt import adapter_start, attach_adapters, aux_loss

    model, source = load_model(model_name)
    target = load_tokenizer(str(tokenizer_dir))
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    start = adapter_start(emb.weight, plan, source, target, candidates=args.candidates, seed=0)
    batch = pack_tokens(target, lines[:400], args.seq_len)[: args.batch_size]
    times: dict[str, list[float]] = {"separate": [], "shared": [], "shared, A @ E_old per side": []}
    for _ in range(args.timing_reps):
        for form, seconds in times.items():
            adapters = attach_adapters(model, start, start if form == "separate" else None)
            if form == "shared, A @ E_old per side":
                for hook in adapters[0].scope_hooks:
                    hook.remove()
            objective = LMObjective(configure(model, "vocadt"), "clm", aux_loss(adapters, 0.1))
            optimizer = torch.optim.AdamW([a.adapter for a in adapters], lr=args.vocadt_lr)
            for step in range(2):
                tick = time.perf_counter()
                loss, _ = objective(batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                if step:
                    seconds.append(time.perf_counter() - tick)
            for module in (emb, head):  # back to the plain tied source for the next form
                for hook in module.parametrizations.weight[0].scope_hooks:
                    hook.remove()
                parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
            emb.num_embeddings = head.out_features = emb.weight.shape[0]
            assert head.weight is emb.weight
            print(f"timing {form}: {seconds[-1]:.2f} s/step", flush=True)
    return {form: {"median": statistics.median(s), "all": s} for form, s in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--langs", nargs="*", default=["el", "hi"])
    parser.add_argument("--vocab-size", type=int, default=50000)
    parser.add_argument("--tokenizer-lines", type=int, default=4096, help="train-split lines the tokenizer learns on")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--lines", type=int, default=4096, help="|D|: sampled training lines")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--vocadt-lr", type=float, default=3e-4)
    parser.add_argument("--forms", nargs="*", default=["separate", "shared"], help="VocADT --adapters forms")
    parser.add_argument("--alphas", nargs="*", type=float, default=[0.1], help="paper 004: 0.1 for non-Latin")
    parser.add_argument("--references", action="store_true", help="also the source model and untrained Mean")
    parser.add_argument("--baselines", action="store_true", help="also FOCUS, embeddings-only LAPT (and the above)")
    parser.add_argument("--val-lines", type=int, default=64)
    parser.add_argument("--timing-reps", type=int, default=3, help="interleaved step timings per form (0: none)")
    parser.add_argument("--timing-only", action="store_true", help="only the interleaved step timings")
    parser.add_argument("--lapt-lrs", nargs="*", type=float, default=[1e-4, 3e-4], help="embeddings-only LAPT lrs")
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
            target = train_tokenizer(lines[: args.tokenizer_lines], "bytelevel-bpe", args.vocab_size, like=like)
            target.save_pretrained(tokenizer_dir)
            entry = {"target_vocab": len(target), "runs": []}
            if args.references or args.baselines:
                entry["source"] = heldout(args.model, text)
            report["langs"][lang] = entry
            print(f"{lang} source: {entry.get('source')}; target vocabulary {len(target)}", flush=True)
            inits = ("mean", "focus") if args.baselines else ("mean",) if args.references else ()
            for init in () if args.timing_only else inits:
                out = work / f"{lang}-{init}"
                start = time.perf_counter()
                replace_model(args.model, lines, init, out, tokenizer_spec=str(tokenizer_dir))
                run = {"name": f"{init} (no training)", "init_seconds": time.perf_counter() - start}
                entry["runs"].append(run | heldout(str(out), text))
                print(f"{lang} {entry['runs'][-1]}", flush=True)
                write_json(f"{args.out}.json", report)
            budget = ["--max-steps", str(args.steps), "--sample", str(args.lines), "--batch-size", str(args.batch_size)]
            budget += ["--seq-len", str(args.seq_len), "--val-lines", str(args.val_lines)]
            budget += ["--eval-every", str(args.eval_every), "--seed", "0"]
            trainings = [
                (
                    f"VocADT {form} alpha={alpha}",
                    ["vocadt", "--model", args.model, "--tokenizer", str(tokenizer_dir), "--alpha", str(alpha)]
                    + ["--max-candidates", str(args.candidates), "--lr", str(args.vocadt_lr), "--adapters", form],
                )
                for alpha in args.alphas
                for form in args.forms
            ]
            trainings += [
                (
                    f"Mean + embeddings-only LAPT lr={lr}",
                    ["train", "--model", str(work / f"{lang}-mean"), "--strategy", "embeddings", "--lr", str(lr)],
                )
                for lr in (args.lapt_lrs if args.baselines else [])
            ]
            for name, command in [] if args.timing_only else trainings:
                out = work / f"{lang}-trained"
                shutil.rmtree(out, ignore_errors=True)
                wall = run_cli(command + ["--corpus", train, "--out", str(out)] + budget)
                run = {"name": name, "wall_seconds": wall, **trained_facts(out), **heldout(str(out), text)}
                entry["runs"].append(run)
                print(f"{lang} {name}: {run['bits_per_byte']:.3f} bits/byte, {run['seconds_per_step']:.1f} s/step, "
                      f"peak RSS {run['peak_rss_mib']:.0f} MiB", flush=True)  # fmt: skip
                write_json(f"{args.out}.json", report)
            if args.timing_reps:  # last: the trainings' results come first on a busy machine
                entry["step_timing"] = step_timing(args.model, tokenizer_dir, lines, args)
                write_json(f"{args.out}.json", report)
        write_markdown(report, f"{args.out}.md")


def write_markdown(report: dict, path: str) -> None:
    a = report["args"]
    text = [
        f"# VocADT: separate vs shared adapters{' and baselines' if a['baselines'] else ''}: {report['model']}\n",
        f"{report['machine']}, {report['date']}. Target tokenizer: byte-level BPE, {a['vocab_size']} requested, "
        f"trained on the first {a['tokenizer_lines']} lines of the shared train split. Training: {a['steps']} "
        f"steps of {a['batch_size']} x {a['seq_len']} tokens on {a['lines']} sampled lines, seed 0, validation "
        f"every {a['eval_every']} steps on {a['val_lines']} held-back lines; VocADT lr {a['vocadt_lr']} (sparse, "
        f"K={a['candidates']}). Bits/byte of the saved models on the first {a['eval_lines']} held-out lines. "
        "`separate`: input and output adapters (paper 004's form; the saved model is untied); `shared`: one "
        "adapter on both sides (stays tied).\n",
    ]
    for lang, entry in report["langs"].items():
        s = entry.get("source")
        source = f"source: {s['bits_per_byte']:.3f} bits/byte at {s['tokens_per_line']:.1f} tokens/line; " if s else ""
        text.append(f"\n## {lang}\n\n{source}target vocabulary {entry['target_vocab']}\n")
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
                {True: "yes", False: "no"}.get(r.get("tied_output"), "–"),
            ]
            for r in entry["runs"]
        ]
        header = ["run", "bits/byte", "uniform", "tokens/line", "val loss start", "val loss end", "s/step"]
        header += ["peak RSS MiB", "trainable", "tied output"]
        if rows:
            text.append(markdown_table(header, rows))
        curves = [r for r in entry["runs"] if "val_curve" in r]
        if curves:
            steps = [step for step, _ in curves[0]["val_curve"]]
            text.append("\nValidation loss by step:\n")
            rows = [[r["name"]] + [loss for _, loss in r["val_curve"]] for r in curves]
            text.append(markdown_table(["run"] + [str(step) for step in steps], rows))
        timing = entry.get("step_timing")
        if timing:
            text.append(
                f"\nStep time, the forms interleaved {a['timing_reps']} times in one process (same load; the "
                "training runs above ran one after another under whatever load the shared machine had):\n"
            )
            rows = [[form, t["median"], " / ".join(f"{x:.2f}" for x in t["all"])] for form, t in timing.items()]
            text.append(markdown_table(["form", "median s/step", "each"], rows))
        adapter = next((r["adapter"] for r in entry["runs"] if "adapter" in r), None)
        if adapter:
            m, n = adapter["memory"], adapter["adapter_modules"]
            text.append(
                f"\nAdapter: {adapter['form']}, width {adapter['width']}, rows started as "
                f"{adapter['rows_started_as']} (one-hot by match kind {adapter.get('one_hot_by_match_kind')}); aux "
                f"loss over the {adapter.get('aux_loss_rows')} shared-vocabulary rows; training state of one adapter "
                f"(weights, gradient, AdamW moments) {m['sparse_training_bytes'] / n / 2**20:,.0f} MiB sparse vs "
                f"{m['dense_training_bytes'] / n / 2**30:,.1f} GiB dense "
                "(computed).\n"
            )
    Path(path).write_text("\n".join(text) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
