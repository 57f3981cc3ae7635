"""Distillation init vs Mean and Align on SmolLM2, right after initialization (no training).

Per language: one auxiliary tokenizer on the training sample, then for each k an expanded tokenizer, and for each
init (``--inits``; ``distill`` variants as ``name=key:value,key:value`` over its settings) a fresh SmolLM2 expanded
by ``vocgraft.recipes.expand``'s own path (``init_and_graft``, so ``untie_head`` unties the model as the CLI does).
Measured: bits/byte on held-out lines (with the uniform reference) and, from the same logits, the teacher-forced
argmax rate of the new tokens; greedy generation on held-out prompts with the canonical use of the new tokens
(``vocgraft.eval.canonical_use``: new ids emitted / new ids in the canonical re-encoding of the same text); the
share of *tokens* (not types) that are new when the expanded tokenizer encodes held-out text; and the init's wall
time with its parts (teacher pass, input rows, output rows) as the method reported them.

    .venv/bin/python benchmarks/distill.py [--langs el hi] [--ks 100 1000] [--eval-lines 300]

Run it with the cores otherwise idle (it uses every core; init times are what the 15-minute goal is read against).

``--resume`` keeps the runs already in ``--out``.json (same language, k and label, the same expanded tokenizer:
its held-out new-token share must match) and runs the rest; ``--redo LABEL`` runs a label again (a method whose
code changed since). Each run records the commit it ran at.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import new_report

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval import bits_per_byte, encode_lines
from vocgraft.eval.generation import GREEDY, generate_one, generation_speed, prompts_from_lines
from vocgraft.init import method_options
from vocgraft.models import load_model
from vocgraft.outdir import write_json
from vocgraft.plan import VocabPlan
from vocgraft.recipes.common import init_and_graft, method_stats
from vocgraft.recipes.expand import train_aux_tokenizer
from vocgraft.report import markdown_table
from vocgraft.tokenization import expand_tokenizer
from vocgraft.tokenization.scripts import dominant_scripts

RESULTS = Path(__file__).resolve().parent / "results"
INITS = [
    "mean",
    "align",
    "distill@100",  # the paper's snippet form (distill_merge one): ~8 snippets per token, too slow at k=1000
    "distill-all=distill_merge:all",
    "distill-all-meaninput=distill_merge:all,distill_epochs:0",  # Mean input rows + fitted output rows
    "distill-all-tied@100=distill_merge:all,untie_head:false",
]


def parse_init(spec: str) -> tuple[str, str, dict, set[str]]:
    """``label[@filter...]=key:value,...`` -> (label, method, options, filters); the method is the label's part
    before the first '-'; a filter is a k (``@100``) or a language (``@el``) the init is run for (all if none)."""
    head, _, settings = spec.partition("=")
    label, *filters = head.split("@")
    options = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition(":")
        try:
            options[key] = json.loads(value)  # numbers, true/false, lists
        except json.JSONDecodeError:
            options[key] = value  # a word: a choice such as distill_target:takeover
    return label, label.split("-")[0], options, set(filters)


def wanted(filters: set[str], lang: str, k: int) -> bool:
    ks = {f for f in filters if f.isdigit()}
    langs = filters - ks
    return (not ks or str(k) in ks) and (not langs or lang in langs)


def new_token_share(tokenizer, lines, new_ids) -> float:
    """Share of the tokens of ``lines`` (as ``tokenizer`` encodes them) that are new ids."""
    new = set(new_ids)
    ids = [t for row in encode_lines(tokenizer, lines) for t in row]
    return sum(t in new for t in ids) / max(len(ids), 1)


def greedy(model, tokenizer, prompts, max_new_tokens: int, new_ids=None) -> dict:
    """Greedy continuations as ``generation_speed`` runs them, with the canonical use of the new tokens; for the
    source (no ``new_ids``) its texts instead, which the expanded tokenizers re-encode."""
    if new_ids is not None:
        return generation_speed(model, tokenizer, prompts, sampled=False, max_new_tokens=max_new_tokens,
                                new_token_ids=new_ids)  # fmt: skip
    eos = tokenizer.eos_token_id
    generated = [[t for t in generate_one(model, tokenizer, p, max_new_tokens, GREEDY) if t != eos] for p in prompts]
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in generated]
    return {"texts": texts, "chars_per_token": sum(map(len, texts)) / max(sum(map(len, generated)), 1)}


def run_one(args, label, method, options, source_tokenizer, tokenizer, plan, aux, train, heldout, prompts, cache):
    model, _ = load_model(args.model)
    options = method_options(method, options)
    seconds, resources = init_and_graft(model, plan, source_tokenizer, tokenizer, method, corpus=train,
                                        aux_tokenizer=aux, options=options, resources=cache)  # fmt: skip
    for key in ("distill_data", "distill_input"):  # the next distill variant reuses the teacher (and input rows)
        if key in resources:
            cache[key] = resources[key]
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    new_ids = set(plan.new_ids)
    bpb = bits_per_byte(model, tokenizer, heldout, show_progress=False, new_token_ids=new_ids)
    generated = greedy(model, tokenizer, prompts, args.max_new_tokens, new_ids)
    stats = method_stats(resources)
    return {
        "init": label,
        "method": method,
        "options": options,
        "init_seconds": seconds,
        "tied": tied,
        "bpb": bpb,
        "greedy": generated,
        "stats": stats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--langs", nargs="*", default=["el", "hi"])
    parser.add_argument("--ks", nargs="*", type=int, default=[100, 1000])
    parser.add_argument("--inits", nargs="*", default=INITS)
    parser.add_argument("--train-lines", type=int, default=8192)
    parser.add_argument("--aux-vocab-size", type=int, default=16000)
    parser.add_argument("--eval-lines", type=int, default=300)
    parser.add_argument("--prompts", type=int, default=20, help="held-out lines after the evaluation lines")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: every core")
    parser.add_argument("--out", default=str(RESULTS / "distill"))
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --out.json")
    parser.add_argument("--redo", nargs="*", default=[], help="labels to run again even with --resume")
    parser.add_argument(
        "--combine", nargs="*", default=[], help="only write --out.{json,md} from these result files' languages"
    )
    parser.add_argument("--note", default="", help="a paragraph for the md (what was run and what was not)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.combine:  # runs split over processes (one per language): one report
        parts = [json.loads(Path(f).read_text()) for f in args.combine]
        report = {**parts[0], "langs": {}, "note": args.note}
        for name, part in zip(args.combine, parts):
            for lang, entry in part["langs"].items():
                key = lang if lang not in report["langs"] else f"{lang} ({Path(name).stem})"  # a second run of it
                report["langs"][key] = entry | {"args": part["args"]}
        write_json(f"{args.out}.json", report)
        write_markdown(report, f"{args.out}.md")
        return

    report = new_report(args.model, args, langs={})
    old = json.loads(Path(f"{args.out}.json").read_text()) if args.resume and Path(f"{args.out}.json").exists() else {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    _, source_tokenizer = load_model(args.model)
    for lang in args.langs:
        train = read_lines(SHARED_CORPORA / lang / "train.txt", limit=args.train_lines)
        held = read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=args.eval_lines + args.prompts)
        heldout, prompts = held[: args.eval_lines], prompts_from_lines(held[args.eval_lines :])
        entry = report["langs"][lang] = {"train_lines": len(train), "eval_lines": len(heldout), "runs": []}
        kept = old.get("langs", {}).get(lang, {})
        if kept.get("eval_lines") != len(heldout) or kept.get("train_lines") != len(train):
            kept = {}
        if kept:
            entry["source"], entry["source_greedy"] = kept["source"], kept["source_greedy"]
        else:
            model, _ = load_model(args.model)
            entry["source"] = bits_per_byte(model, source_tokenizer, heldout, show_progress=False)
            entry["source_greedy"] = greedy(model, source_tokenizer, prompts, args.max_new_tokens)
            del model
        aux = train_aux_tokenizer(source_tokenizer, train, args.aux_vocab_size)
        scripts = dominant_scripts(train)
        print(f"{lang}: source {entry['source']['bits_per_byte']:.3f} bits/byte", flush=True)
        for k in args.ks:
            expansion = expand_tokenizer(source_tokenizer, aux, train, k, scripts=scripts)
            tokenizer = expansion.tokenizer
            plan = VocabPlan.from_tokenizers(source_tokenizer, tokenizer, "expand")
            share = new_token_share(tokenizer, heldout, plan.new_ids)
            retokenized = new_token_share(tokenizer, entry["source_greedy"]["texts"], plan.new_ids)
            entry.setdefault("source_greedy_retokenized", {})[k] = retokenized
            cache: dict = {}
            done = {
                r["init"]: r
                for r in kept.get("runs", [])
                if r["k"] == k and r["tokenizer_new_share"] == share and r["init"] not in args.redo
            }
            for spec in args.inits:
                label, method, options, filters = parse_init(spec)
                if not wanted(filters, lang, k):
                    continue
                if label in done:
                    entry["runs"].append(done[label])
                    print(f"{lang} k={k} {label}: kept from the earlier run", flush=True)
                    write_json(f"{args.out}.json", report)  # a stop before the next run must not lose it
                    continue
                start = time.perf_counter()
                run = run_one(
                    args, label, method, options, source_tokenizer, tokenizer, plan, aux, train, heldout, prompts, cache
                )
                run |= {"k": k, "tokenizer_new_share": share, "wall_seconds": time.perf_counter() - start}
                run["commit"] = commit
                entry["runs"].append(run)
                rate = run["greedy"]["canonical_rate"]
                print(
                    f"{lang} k={k} {label}: {run['bpb']['bits_per_byte']:.3f} bits/byte "
                    f"({run['bpb']['bits_per_byte'] / entry['source']['bits_per_byte'] - 1:+.1%} vs source), "
                    f"greedy canonical rate {'-' if rate is None else f'{rate:.2f}'}, "
                    f"init {run['init_seconds']:.0f} s",
                    flush=True,
                )
                write_json(f"{args.out}.json", report)
    write_markdown(report, f"{args.out}.md")


def write_markdown(report: dict, path: str) -> None:
    a = report["args"]
    parts = [
        f"# Distillation init vs Mean and Align: {report['model']}, right after initialization\n",
        f"{report['machine']}, {report['date']}, torch threads {a['threads']}. {a['train_lines']} training lines, "
        f"auxiliary BPE of {a['aux_vocab_size']} tokens, bits/byte on the first held-out lines (count per "
        f"language), greedy generation ({a['max_new_tokens']} tokens at most) on prompts cut from the held-out "
        "lines after them.\n",
        "Columns: 'canon. rate': new ids the model emitted / new ids in the canonical re-encoding of the same "
        "generated text (summed over prompts); 'emitted new' / 'canonical new': share of the generated tokens "
        "that are new ids as emitted / as re-encoded; 'argmax new': teacher-forced on the held-out lines, the "
        "share of new-token positions where the argmax is that token; 'text new': share of new ids in the "
        "held-out text; 'init s' (teacher / input rows / output rows): the init's wall time and its parts.\n",
    ]
    if report.get("note"):
        parts.append(report["note"] + "\n")
    for lang, entry in report["langs"].items():
        src = entry["source"]
        parts.append(
            f"\n## {lang}\n\n{entry['eval_lines']} held-out lines, {len(entry['source_greedy']['texts'])} prompts. "
            f"source: {src['bits_per_byte']:.3f} bits/byte (uniform {src['uniform_bits_per_byte']:.3f})"
            f", greedy {entry['source_greedy']['chars_per_token']:.2f} chars/token; the expanded tokenizers give the "
            f"source's greedy text a new-token share of "
            + ", ".join(f"{v:.3f} (k={k})" for k, v in entry["source_greedy_retokenized"].items())
            + "\n"
        )
        rows = [
            [
                r["k"], r["init"], "untied" if not r["tied"] else "tied", r["bpb"]["bits_per_byte"],
                f"{r['bpb']['bits_per_byte'] / src['bits_per_byte'] - 1:+.1%}", r["bpb"]["uniform_bits_per_byte"],
                r["greedy"].get("canonical_rate"), r["greedy"].get("new_emitted_share"),
                r["greedy"].get("new_canonical_share"), r["bpb"].get("argmax_new_share"), r["tokenizer_new_share"],
                r["greedy"]["chars_per_token"], r["init_seconds"], parts_of(r),
            ]
            for r in entry["runs"]
        ]  # fmt: skip
        header = ["k", "init", "head", "bits/byte", "vs source", "uniform", "canon. rate", "emitted new",
                  "canonical new", "argmax new", "text new", "chars/token", "init s",
                  "teacher / input / output s"]  # fmt: skip
        parts.append(markdown_table(header, rows))
        parts.append("")
        for r in entry["runs"]:
            if r["method"] != "distill":
                continue
            settings = ", ".join(f"{key}={value}" for key, value in r["options"].items())
            parts.append(f"- k={r['k']} {r['init']}: {settings}" + (f". *{r['note']}*" if r.get("note") else ""))
            st = r["stats"].get("distill_stats", {})
            if st.get("snippets") is not None:
                parts.append(f"  ({st['snippets']} snippets, {st['tokens_trained']} of {r['k']} tokens trained)")
    Path(path).write_text("\n".join(parts) + "\n", encoding="utf-8")


def parts_of(run: dict) -> str:
    """teacher / input rows / output rows seconds of a distill run, as the method reported them."""
    st = run["stats"].get("distill_stats")
    if not st:
        return ""
    head = st.get("head", {})
    output = head.get("states_seconds", 0) + head.get("fit_seconds", 0) if head else None
    return " / ".join(
        "-" if v is None else f"{v:.0f}"
        for v in (st.get("teacher_seconds"), st.get("input", {}).get("seconds"), output)
    )


if __name__ == "__main__":
    sys.exit(main())
