"""Align and Merge on SmolLM2 + Greek: how far they are from Mean, how varied the aligned tuples are, and bits/byte
right after initialization (no training), for several corpus sizes |D| and k.

For each |D|: one auxiliary byte-level BPE on the first |D| Greek training lines; for each k: expand SmolLM2 (new
tokens restricted to Greek script), initialize with mean / merge / align (and the extra arms asked for), graft,
and score the first N held-out Greek lines. Row statistics first (cheap), bits/byte after (one model forward
pass over the held-out lines per arm).

``--before REV`` adds the Align and Merge of an earlier commit (their modules read with ``git show``) as arms
``align@REV`` and ``merge@REV``: the before/after comparison of the change that moved both methods onto the
auxiliary tokenizer. Extra arms: ``random``, and ``align-contain``, Align with the authors' alignment rule (a
source token counts only when it contains or is contained in the new token; straddling tokens are dropped).

    .venv/bin/python benchmarks/align_merge.py [--lines 4096 32768] [--ks 300 1000] [--before 28d93fd]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch

import vocgraft.init as init_package
import vocgraft.init.align as align_module
from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval import bits_per_byte
from vocgraft.init import InitContext, initialize
from vocgraft.models import load_model
from vocgraft.plan import VocabPlan
from vocgraft.recipes.expand import train_aux_tokenizer
from vocgraft.report import markdown_table
from vocgraft.surgery import graft
from vocgraft.tokenization.expand import expand_tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def modules_at(rev: str) -> dict:
    """``{"align": module, "merge": module}`` as they were at ``rev``, loaded without registering their methods."""
    found = {}
    real = init_package.register
    init_package.register = lambda *a, **k: lambda fn: fn  # the current methods keep their names
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("align", "merge"):
                text = subprocess.run(
                    ["git", "show", f"{rev}:src/vocgraft/init/{name}.py"], cwd=REPO, check=True, capture_output=True
                ).stdout
                path = Path(tmp) / f"{name}_at_{rev}.py"
                path.write_bytes(text)
                spec = importlib.util.spec_from_file_location(path.stem, path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                found[name] = module
    finally:
        init_package.register = real
    return found


def contained_batch(source, aligned, wanted, counts) -> None:
    """Align's batch counter with the authors' rule: keep a source token that contains or is contained in the
    new token's span (a token straddling its edge is dropped)."""
    hit = np.isin(aligned.ids, wanted)
    starts, ends, ids = aligned.start[hit], aligned.end[hit], aligned.ids[hit]
    lo = np.searchsorted(source.end, starts, side="right")
    hi = np.searchsorted(source.start, ends, side="left")
    s_start, s_end, s_ids = source.start.tolist(), source.end.tolist(), source.ids.tolist()
    for tid, a, b, t0, t1 in zip(ids.tolist(), lo.tolist(), hi.tolist(), starts.tolist(), ends.tolist()):
        kept = tuple(
            s_ids[j]
            for j in range(a, b)
            if (s_start[j] >= t0 and s_end[j] <= t1) or (s_start[j] <= t0 and s_end[j] >= t1)
        )
        if kept:
            counts[(tid, kept)] += 1


def differing_rows(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((~torch.isclose(a, b, atol=1e-6).all(dim=1)).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lines", nargs="+", type=int, default=[4096, 32768], help="training lines |D|")
    parser.add_argument("--ks", nargs="+", type=int, default=[300, 1000])
    parser.add_argument("--aux-vocab-size", type=int, default=8000)
    parser.add_argument("--eval-lines", type=int, default=200)
    parser.add_argument("--before", help="a commit whose align.py and merge.py to compare with")
    parser.add_argument("--extra", nargs="*", default=[], choices=["random", "align-contain"])
    parser.add_argument("--out", default=str(RESULTS / "align_merge"))
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # fallback counts are in the stats

    before = modules_at(args.before) if args.before else None
    base, source = load_model(args.model)
    embeddings = base.get_input_embeddings().weight.detach().float()
    heldout = read_lines(SHARED_CORPORA / "el" / "heldout.txt", limit=args.eval_lines)
    report = {
        "model": args.model,
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
        "source_bits_per_byte": bits_per_byte(base, source, heldout, show_progress=False)["bits_per_byte"],
        "runs": [],
    }
    print(f"source: {report['source_bits_per_byte']:.4f} bits/byte", flush=True)
    settings = []
    for n in args.lines:
        lines = read_lines(SHARED_CORPORA / "el" / "train.txt", limit=n)
        aux = train_aux_tokenizer(source, lines, args.aux_vocab_size)
        for k in args.ks:
            expansion = expand_tokenizer(source, aux, lines, k, scripts={"GREEK"})
            target = expansion.tokenizer
            plan = VocabPlan.from_tokenizers(source, target, "expand")
            rows, seconds, resources = {}, {}, {}

            def run(arm, compute):
                start = time.perf_counter()
                rows[arm] = compute()
                seconds[arm] = round(time.perf_counter() - start, 2)

            for method in ["mean", "merge", "align", *(m for m in args.extra if m == "random")]:
                ctx = InitContext(plan, source, target, corpus=lines, aux_tokenizer=aux)
                run(method, lambda: initialize(base, method, ctx)[0])  # noqa: B023 (called at once)
                resources[method] = ctx.resources
            if "align-contain" in args.extra:
                real, align_module._count_batch = align_module._count_batch, contained_batch
                try:
                    ctx = InitContext(plan, source, target, corpus=lines, aux_tokenizer=aux)
                    run("align-contain", lambda: initialize(base, "align", ctx)[0])  # noqa: B023
                finally:
                    align_module._count_batch = real
            entry = {
                "lines": n,
                "k": k,
                "added": len(expansion.new_tokens),
                "intermediates": len(expansion.intermediates),
                "max_abs_align_minus_mean": float((rows["align"] - rows["mean"]).abs().max()),
                "rows_align_not_mean": differing_rows(rows["align"], rows["mean"]),
                "rows_merge_not_mean": differing_rows(rows["merge"], rows["mean"]),
                "align_stats": {k: v for k, v in resources["align"]["align_stats"].items() if not k.endswith("_s")},
                "merge_stats": resources["merge"]["merge_stats"],
            }
            if before:
                tag = f"@{args.before}"
                run("merge" + tag, lambda: before["merge"].merge_rows(embeddings, plan, source, target))  # noqa: B023
                run(
                    "align" + tag,
                    lambda: before["align"].align_rows(embeddings, plan, source, target, lines, show_progress=False),  # noqa: B023
                )
                old_counts = before["align"].count_pairs(source, target, lines, plan.new_ids, show_progress=False)
                entry |= {
                    f"max_abs_align{tag}_minus_mean": float((rows["align" + tag] - rows["mean"]).abs().max()),
                    f"several_tuples{tag}": sum(v > 1 for v in Counter(t for t, _ in old_counts).values()),
                    f"rows_merge_not_merge{tag}": differing_rows(rows["merge"], rows["merge" + tag]),
                }
            if "align-contain" in args.extra:
                entry["rows_align_contain_not_align"] = differing_rows(rows["align-contain"], rows["align"])
            entry |= {"init_seconds": seconds, "bits_per_byte": {}}
            report["runs"].append(entry)
            settings.append((entry, rows, plan, target))
            print(json.dumps({k: v for k, v in entry.items() if k != "bits_per_byte"}), flush=True)
    arms = ["mean", "merge", "align"] + ([f"merge@{args.before}", f"align@{args.before}"] if before else [])
    for arm in arms + args.extra:
        for entry, rows, plan, target in settings:
            model = copy.deepcopy(base)
            graft(model, plan, rows[arm], None, target)
            entry["bits_per_byte"][arm] = bits_per_byte(model, target, heldout, show_progress=False)["bits_per_byte"]
            del model
            print(f"|D|={entry['lines']} k={entry['k']} {arm}: {entry['bits_per_byte'][arm]:.4f} bits/byte", flush=True)
            write(report, args.out)
    write(report, args.out)


def write(report: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    runs = report["runs"]
    arms = list(dict.fromkeys(arm for r in runs for arm in r["bits_per_byte"]))
    rows = [
        [
            r["lines"],
            r["k"],
            r["align_stats"]["seen"],
            r["align_stats"]["several_tuples"],
            r["rows_align_not_mean"],
            r["max_abs_align_minus_mean"],
            *(r["bits_per_byte"].get(arm, "") for arm in arms),
        ]
        for r in runs
    ]
    header = ["lines", "k", "seen", ">1 tuple", "align != mean rows", "max abs(align - mean)", *arms]
    text = (
        f"# Align and Merge right after initialization: {report['model']} + Greek\n\n{report['machine']}, "
        f"{report['date']}. Bits/byte on the first {report['args']['eval_lines']} held-out Greek lines (source "
        f"{report['source_bits_per_byte']:.4f}).\n\n" + markdown_table(header, rows, digits=4)
    )
    Path(f"{out}.md").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
