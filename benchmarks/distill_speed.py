"""Distillation init speed: the float32 path against the fast path (bfloat16 forward passes), same snippets.

Per k: one expanded tokenizer (auxiliary BPE on the first ``--lines`` training lines, which are also the init's
corpus, as ``end_to_end.py`` does), then per arm a fresh model expanded by the recipe's own path
(``init_and_graft``, ``--distill-merge all``): ``float32`` (``distill_dtype float32``: every forward pass in
float32, today's plain path) and ``fast`` (the defaults: ``distill_dtype auto``, bfloat16 where the CPU or GPU
runs it natively). Both arms draw the same snippets (same corpus and seed; the report checks their fingerprint).

Measured per arm: the init's wall time and its phases as the method reports them (snippets, teacher pass, input
rows, head states, output fit), each phase's matmul FLOPs over its time as a share of the roofline in the phase's
dtype (``roofline_lib``; FLOPs of the linear layers only: 2 x body parameters per token forward, twice that for the
student's forward + input-gradient backward), and the quality right after init: bits/byte on the held-out lines
(with the paired bootstrap difference fast - float32 over lines) and the greedy canonical rate (new ids emitted /
new ids in the canonical re-encoding of the same text) on prompts cut from held-out lines; and how far the fast
arm's rows are from float32's. Rows are written as they finish; ``--resume`` keeps the finished ones.

    .venv/bin/python benchmarks/distill_speed.py                 # Greek, k = 1000 and 5000, both arms
    .venv/bin/python benchmarks/distill_speed.py --ks 1000       # one k now, the other later with --resume
    .venv/bin/python benchmarks/distill_speed.py --ks 20 --lines 256 --eval-lines 20 --prompts 4 \\
        --out /tmp/distill_speed                                 # a smoke run of a few minutes

Run it with the cores otherwise idle: it records the load average before and after each row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import roofline_lib
import torch
from common import new_report
from distill import greedy, parse_init

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval import bits_per_byte
from vocgraft.eval.bpb import paired_bits_per_byte_difference
from vocgraft.eval.generation import prompts_from_lines
from vocgraft.models import load_model
from vocgraft.outdir import write_json
from vocgraft.plan import VocabPlan
from vocgraft.recipes.common import init_and_graft, method_stats
from vocgraft.recipes.expand import train_aux_tokenizer
from vocgraft.report import markdown_table
from vocgraft.tokenization import expand_tokenizer
from vocgraft.tokenization.scripts import dominant_scripts

# label=key:value,... over distill's settings (as benchmarks/distill.py parses them); float32 is the plain path
ARMS = ["float32=distill_dtype:float32", "fast="]
GOAL_SECONDS = {1000: 300, 5000: 1200}  # the goals on 2 CPU cores
# results equal within: bits/byte relative to float32's, canonical rate absolute
TOLERANCE = {"bits_per_byte_relative": 0.01, "canonical_rate": 0.05}
# settings that decide what a row measures: a resumed run keeps only rows made with the same ones
ROW_SETTINGS = ("model", "lang", "lines", "aux_vocab_size", "eval_lines", "prompts", "max_new_tokens", "options",
                "seed", "threads")  # fmt: skip


def body_parameters(model) -> int:
    """Parameters of the decoder body (what a forward pass multiplies each token by): the base model without its
    input embeddings, which are a lookup."""
    embed = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.base_model.parameters() if p is not embed)


def snippet_fingerprint(resources: dict) -> str:
    """A hash of the snippets the init trained on (student and teacher ids): equal arms drew the same."""
    digest = hashlib.sha256()
    for snippet in resources["distill_data"]["snippets"]:
        digest.update(snippet.student.tobytes())
        digest.update(snippet.teacher.tobytes())
    return digest.hexdigest()[:16]


def phases(stats: dict, body: int, hidden: int, n_old: int, n_new: int) -> dict:
    """Seconds, matmul FLOPs and the share of the roofline of each phase of the init."""
    head, inputs = stats.get("head", {}), stats.get("input", {})
    dtype = stats["compute_dtype"]
    fit_dtype = dtype if dtype == "bfloat16" else "float32"  # the fit's matmuls: bfloat16 inputs where forwards are
    positions = head.get("positions", 0)
    epochs = len(inputs.get("epochs", []))
    table = {
        "snippets": (stats["snippet_seconds"], 0, None, None),
        "teacher": (stats["teacher_seconds"], 2 * body * stats["teacher_tokens"], dtype, "forward"),
        "input rows": (inputs.get("seconds", 0.0), 4 * body * stats["student_tokens"] * epochs, dtype, "train"),
        # the student's forward over the canonical windows, then the old logits once (float32 in both arms)
        "head states": (head.get("states_seconds", 0.0), 2 * positions * (body + hidden * n_old), dtype, "forward"),
        "output fit": (head.get("fit_seconds", 0.0), 4 * positions * n_new * hidden * (head.get("evaluations", 0) + 2),
                       fit_dtype, "forward"),
    }  # fmt: skip
    out = {}
    for name, (seconds, flops, roof_dtype, kind) in table.items():
        entry = {"seconds": seconds, "flops": flops}
        if flops and seconds > 0:
            rate = flops / seconds
            entry |= {"gflops": rate / 1e9, "roofline_dtype": roof_dtype,
                      "roofline_share": roofline_lib.roofline_fraction(rate, "cpu", roof_dtype, model="smollm2",
                                                                        kind=kind)}  # fmt: skip
        out[name] = entry
    return out


def run_arm(args, arm: str, options: dict, case: dict, work: Path) -> dict:
    model, _ = load_model(args.model)
    body = body_parameters(model)
    hidden = model.get_input_embeddings().weight.shape[1]
    plan, tokenizer = case["plan"], case["tokenizer"]
    load_before, started = os.getloadavg(), time.perf_counter()
    seconds, resources = init_and_graft(model, plan, case["source_tokenizer"], tokenizer, "distill",
                                        corpus=case["train"], aux_tokenizer=case["aux"], options=options,
                                        seed=args.seed)  # fmt: skip
    init_load_after = os.getloadavg()
    stats = method_stats(resources)["distill_stats"]
    new_ids = list(plan.new_ids)
    rows = {
        "input": model.get_input_embeddings().weight.detach()[new_ids].float().clone(),
        "head": model.get_output_embeddings().weight.detach()[new_ids].float().clone(),
    }
    torch.save(rows, work / f"{args.lang}-k{case['k']}-{arm}.pt")
    bpb = bits_per_byte(model, tokenizer, case["heldout"], show_progress=False, new_token_ids=set(new_ids),
                        per_line=True)  # fmt: skip
    generated = greedy(model, tokenizer, case["prompts"], args.max_new_tokens, set(new_ids))
    return {
        "arm": arm,
        "options": options,
        "init_seconds": seconds,
        "load_before": load_before,
        "load_after_init": init_load_after,
        "load_after": os.getloadavg(),
        "wall_seconds": time.perf_counter() - started,
        "compute_dtype": stats.get("compute_dtype"),
        "compute_dtype_why": stats.get("compute_dtype_why"),
        "snippets": stats["snippets"],
        "snippet_fingerprint": snippet_fingerprint(resources),
        "teacher_tokens": stats["teacher_tokens"],
        "student_tokens": stats["student_tokens"],
        "tokens_trained": stats["tokens_trained"],
        "phases": phases(stats, body, hidden, len(plan.target_tokens) - len(new_ids), len(new_ids)),
        "distill_mse": [e["distill_mse"] for e in stats.get("input", {}).get("epochs", [])],
        "head_fit": {k: stats.get("head", {}).get(k) for k in ("head_ce_start", "head_ce_end", "evaluations")},
        "bpb": {k: v for k, v in bpb.items() if k not in ("bits_per_line", "bytes_per_line")},
        "bits_per_line": bpb["bits_per_line"],
        "bytes_per_line": bpb["bytes_per_line"],
        "greedy": generated,
        "torch_threads": torch.get_num_threads(),
        "commit": commit(),
    }


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def compare(rows: dict[str, dict], work: Path, lang: str, k: int) -> dict | None:
    """fast against float32 on one k: speedup, quality differences, tolerance check, row distances."""
    if "float32" not in rows or "fast" not in rows:
        return None
    old, new = rows["float32"], rows["fast"]
    diff = paired_bits_per_byte_difference(
        {"bits_per_line": new["bits_per_line"], "bytes_per_line": new["bytes_per_line"]},
        {"bits_per_line": old["bits_per_line"], "bytes_per_line": old["bytes_per_line"]},
    )
    b_old, b_new = old["bpb"]["bits_per_byte"], new["bpb"]["bits_per_byte"]
    r_old, r_new = old["greedy"].get("canonical_rate"), new["greedy"].get("canonical_rate")
    out = {
        "same_snippets": old["snippet_fingerprint"] == new["snippet_fingerprint"],
        "speedup": old["init_seconds"] / new["init_seconds"],
        "bits_per_byte_difference": diff,
        "bits_per_byte_relative": b_new / b_old - 1,
        "canonical_rate_difference": None if r_old is None or r_new is None else r_new - r_old,
        "argmax_new_difference": _difference(new["bpb"].get("argmax_new_share"), old["bpb"].get("argmax_new_share")),
    }
    out["within_tolerance"] = abs(out["bits_per_byte_relative"]) <= TOLERANCE["bits_per_byte_relative"] and (
        out["canonical_rate_difference"] is None or abs(out["canonical_rate_difference"]) <= TOLERANCE["canonical_rate"]
    )
    saved = [work / f"{lang}-k{k}-{arm}.pt" for arm in ("float32", "fast")]
    if all(p.exists() for p in saved):
        a, b = (torch.load(p) for p in saved)
        for space in ("input", "head"):
            rel = ((b[space] - a[space]).norm(dim=1) / a[space].norm(dim=1).clamp(min=1e-12)).tolist()
            out[f"{space}_rows_relative_difference"] = {"median": statistics.median(rel), "max": max(rel)}
    return out


def _difference(a, b):
    return None if a is None or b is None else a - b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lang", default="el")
    parser.add_argument("--ks", nargs="*", type=int, default=[1000, 5000])
    parser.add_argument("--arms", nargs="*", default=ARMS, help="label=key:value,... (float32 and fast are compared)")
    parser.add_argument("--lines", type=int, default=8192, help="training lines: the auxiliary BPE's and the init's")
    parser.add_argument("--aux-vocab-size", type=int, default=16000)
    parser.add_argument("--eval-lines", type=int, default=200)
    parser.add_argument("--prompts", type=int, default=20, help="held-out lines after the evaluation lines")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--options", default="", help="distill settings for every arm, key:value,... (a smoke run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: every core")
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "vocgraft" / "distill_speed"),
                        help="where each arm's rows are kept (compared across arms and resumed runs)")  # fmt: skip
    parser.add_argument("--out", default=roofline_lib.cpu_results_stem("distill_speed"),
                        help="default: results/distill_speed-cpu-<this CPU>")  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="keep the finished rows of --out.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    _, _, shared, _ = parse_init(f"x={args.options}")
    # the CPU too: a row from another machine lent here (bfloat16 native or not) is not comparable
    settings = {name: getattr(args, name) for name in ROW_SETTINGS} | {"cpu": roofline_lib.cpu_model()}
    old = {}
    if args.resume and Path(f"{args.out}.json").exists():
        kept = json.loads(Path(f"{args.out}.json").read_text(encoding="utf-8"))
        if kept.get("settings") == settings:
            old = kept.get("ks", {})
    report = new_report(args.model, args, settings=settings, roofline_file=roofline_lib.results_file_name("cpu"),
                        tolerance=TOLERANCE, goal_seconds=GOAL_SECONDS, ks={})  # fmt: skip
    # a resumed run keeps the ks it does not run again (--ks 1000, later --ks 5000 --resume: one report)
    report["ks"].update({k: v for k, v in old.items() if int(k) not in args.ks})
    print(f"load average before: {os.getloadavg()}", flush=True)

    _, source_tokenizer = load_model(args.model)
    train = read_lines(SHARED_CORPORA / args.lang / "train.txt", limit=args.lines)
    held = read_lines(SHARED_CORPORA / args.lang / "heldout.txt", limit=args.eval_lines + args.prompts)
    heldout, prompts = held[: args.eval_lines], prompts_from_lines(held[args.eval_lines :])
    aux = train_aux_tokenizer(source_tokenizer, train, args.aux_vocab_size)
    scripts = dominant_scripts(train)
    for k in args.ks:
        tokenizer = expand_tokenizer(source_tokenizer, aux, train, k, scripts=scripts).tokenizer
        plan = VocabPlan.from_tokenizers(source_tokenizer, tokenizer, "expand")
        case = {"k": k, "plan": plan, "tokenizer": tokenizer, "source_tokenizer": source_tokenizer, "aux": aux,
                "train": train, "heldout": heldout, "prompts": prompts}  # fmt: skip
        entry = report["ks"][str(k)] = {"new_tokens": len(plan.new_ids), "runs": {}}
        for spec in args.arms:
            arm, _, options, _ = parse_init(spec)
            done = old.get(str(k), {}).get("runs", {}).get(arm)
            if done is not None and done.get("new_tokens_plan") == len(plan.new_ids):
                entry["runs"][arm] = done
                print(f"k={k} {arm}: kept from the earlier run", flush=True)
            else:
                options = {"distill_merge": "all", **shared, **options}
                run = run_arm(args, arm, options, case, work) | {"new_tokens_plan": len(plan.new_ids)}
                entry["runs"][arm] = run
                rate = run["greedy"].get("canonical_rate")
                print(f"k={k} {arm} ({run['compute_dtype']}): init {run['init_seconds']:.1f} s ("
                      + ", ".join(f"{n} {p['seconds']:.1f}" for n, p in run["phases"].items())
                      + f"), {run['bpb']['bits_per_byte']:.4f} bits/byte, canonical rate "
                      + ("-" if rate is None else f"{rate:.3f}"), flush=True)  # fmt: skip
            entry["comparison"] = compare(entry["runs"], work, args.lang, k)
            write_json(f"{args.out}.json", report)  # a stop before the next row must not lose this one
    report["load_after"] = os.getloadavg()
    write_json(f"{args.out}.json", report)
    write_markdown(report, Path(f"{args.out}.md"))
    print(f"wrote {args.out}.json and {args.out}.md")


def _share(phase: dict) -> str:
    share = phase.get("roofline_share")
    return "-" if share is None else f"{phase['gflops']:.0f} ({share:.0%} of {phase['roofline_dtype']})"


def write_markdown(report: dict, path: Path) -> None:
    a = report["args"]
    text = [
        f"# Distillation init speed: float32 path vs fast path, {report['model']}, {a['lang']}\n",
        f"{report['machine']}, {report['date']}. {a['lines']} training lines (auxiliary BPE of "
        f"{a['aux_vocab_size']} and the init's corpus), `--distill-merge all`"
        + (f", settings {a['options']}" if a["options"] else ", distill's default budget")
        + f"; bits/byte on {a['eval_lines']} held-out lines, greedy canonical rate on {a['prompts']} prompts "
        f"({a['max_new_tokens']} new tokens at most). Roofline: `{report['roofline_file']}` (matmul FLOPs of the "
        "linear layers only; the old-logit pass in 'head states' is float32 in both arms).\n",
        f"Tolerance: bits/byte within {TOLERANCE['bits_per_byte_relative']:.0%} of float32's, canonical rate within "
        f"{TOLERANCE['canonical_rate']} (absolute; one greedy sample per prompt, whose text diverges after the first "
        "different token: read it with the teacher-forced 'argmax new', the share of the held-out text's new-token "
        "positions where that token is the argmax). Goals on 2 cores: "
        + ", ".join(f"k={k} in {s / 60:.0f} min" for k, s in GOAL_SECONDS.items())
        + ".\n",
    ]
    header = ["k", "arm", "dtype", "init s", "snippets", "teacher", "input rows", "head states", "output fit",
              "bits/byte", "argmax new", "canon. rate", "load before / after"]  # fmt: skip
    rows, flops_rows = [], []
    for k, entry in report["ks"].items():
        for arm, r in entry["runs"].items():
            p = r["phases"]
            rows.append([int(k), arm, r["compute_dtype"], r["init_seconds"]] + [p[n]["seconds"] for n in p]
                        + [r["bpb"]["bits_per_byte"], r["bpb"].get("argmax_new_share"),
                           r["greedy"].get("canonical_rate"),
                           f"{r['load_before'][0]:.1f} / {r['load_after_init'][0]:.1f}"])  # fmt: skip
            flops_rows.append([int(k), arm] + [_share(p[n]) for n in p if n != "snippets"])
    if rows:
        text += ["## Time (seconds) and quality\n", markdown_table(header, rows), ""]
        text += ["## Achieved GFLOP/s per phase (share of the roofline)\n",
                 markdown_table(["k", "arm", "teacher", "input rows", "head states", "output fit"], flops_rows), ""]
    cmp_rows = []
    for k, entry in report["ks"].items():
        c = entry.get("comparison")
        if not c:
            continue
        d = c["bits_per_byte_difference"]
        goal = GOAL_SECONDS.get(int(k))
        fast = entry["runs"]["fast"]["init_seconds"]
        cmp_rows.append([
            int(k), c["speedup"], f"{d['estimate']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]",
            f"{c['bits_per_byte_relative']:+.2%}",
            "-" if c["canonical_rate_difference"] is None else f"{c['canonical_rate_difference']:+.3f}",
            "-" if c.get("argmax_new_difference") is None else f"{c['argmax_new_difference']:+.3f}",
            "yes" if c["within_tolerance"] else "**no**", "yes" if c["same_snippets"] else "**no**",
            _rows(c, "input"), _rows(c, "head"),
            "-" if goal is None else ("yes" if fast <= goal else f"**no** ({fast:.0f} s > {goal} s)"),
        ])  # fmt: skip
    if cmp_rows:
        text += ["## fast vs float32\n", markdown_table(
            ["k", "speedup", "bits/byte fast - float32 [95%]", "relative", "canon. rate diff.", "argmax new diff.",
             "within tolerance",
             "same snippets", "input rows rel. diff. (median / max)", "head rows rel. diff.", "goal met"],
            cmp_rows), ""]  # fmt: skip
    text += ["Command:\n", "    .venv/bin/python benchmarks/distill_speed.py "
             + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in _non_default(a).items()), ""]
    path.write_text("\n".join(text), encoding="utf-8")


def _rows(c: dict, space: str) -> str:
    d = c.get(f"{space}_rows_relative_difference")
    return "-" if d is None else f"{d['median']:.4f} / {d['max']:.4f}"


def _non_default(args: dict) -> dict:
    """The arguments a run changed from their defaults (the command line that reproduces it)."""
    defaults = {"ks": [1000, 5000], "lines": 8192, "eval_lines": 200, "prompts": 20, "options": "", "lang": "el",
                "model": "smollm2", "aux_vocab_size": 16000, "max_new_tokens": 48, "seed": 0, "arms": ARMS,
                "threads": len(os.sched_getaffinity(0))}  # fmt: skip
    out = {}
    for key, default in defaults.items():
        if args.get(key) != default:
            value = args[key]
            out[key] = " ".join(map(str, value)) if isinstance(value, list) else value
    return out


if __name__ == "__main__":
    sys.exit(main())
