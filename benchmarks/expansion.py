"""Expansion benchmark: k new tokens x init method on SmolLM2, right after initialization (no training).

For each language: train one auxiliary byte-level BPE on the training lines (pre-tokenizing as `vocgraft expand`
does: ``--keep-marks auto`` keeps combining marks with their letters where the corpus needs it), expand SmolLM2 by k
tokens, and run every registered init method (plus transformers' own resize_token_embeddings(mean_resizing=True),
the default most users get). Report tokens/line and speedup vs the source, share of new tokens used, bits/byte on
the first N held-out lines next to the uniform reference of that tokenizer, wall time and peak extra RAM of the
initialization alone, and each method's fallback statistics (Align, Merge, FOCUS, SALT). SALT needs a target PLM over
the auxiliary tokenizer's vocabulary: a small GPT-2-style model is trained here once per language on the same lines
with a step budget (--plm-steps; its rows reach SALT by token string, as with `vocgraft expand --target-plm`); FOCUS
and the SALT methods share one fastText run per k. Invariants checked on every run: decode(encode(x)) == x on the
held-out lines, and English held-out tokenization unchanged.

    .venv/bin/python benchmarks/expansion.py [--langs el hi] [--ks 100 1000 5000] [--eval-lines 500] [--plm-steps 100]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import new_report
from peak_memory import PeakRSS

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval import bits_per_byte, encode_lines
from vocgraft.init import METHODS as REGISTRY
from vocgraft.init import InitContext, initialize
from vocgraft.models import load_model
from vocgraft.outdir import write_json
from vocgraft.plan import VocabPlan, raw_tokens
from vocgraft.recipes.common import method_stats
from vocgraft.recipes.expand import train_aux_tokenizer
from vocgraft.recipes.expansion_checks import expansion_summary
from vocgraft.report import markdown_table
from vocgraft.surgery import graft, mean_resizing_baseline
from vocgraft.tokenization import expand_tokenizer
from vocgraft.tokenization.marks import KEEP_MARKS_SETTINGS, choose_keep_marks
from vocgraft.tokenization.scripts import dominant_scripts

RESULTS = Path(__file__).resolve().parent / "results"
BASELINE = "transformers-mean-resizing"  # not a registry method: transformers' resize, the external baseline
PREFERRED_ORDER = ["random", "multivariate", "mean", "merge", "align", "focus", "salt", "salt-centered"]
# every registered method (expansion has every input a method can declare), new ones after the known ones
METHODS = [m for m in PREFERRED_ORDER if m in REGISTRY] + sorted(set(REGISTRY) - set(PREFERRED_ORDER)) + [BASELINE]


def english_changed_share(source_tokenizer, tokenizer, english: list[str]) -> float:
    before, after = encode_lines(source_tokenizer, english), encode_lines(tokenizer, english)
    return sum(a != b for a, b in zip(before, after)) / len(english)


def train_target_plm(aux, train: list[str], steps: int, minutes: float | None) -> tuple[dict, dict]:
    """A small PLM over the auxiliary tokenizer, as SALT's resources (rows matched by token string, like
    `vocgraft expand --target-plm`), and its training log."""
    from vocgraft.train.plm import train_small_plm

    start = time.perf_counter()
    plm = train_small_plm(aux, train, steps=steps, max_seconds=minutes * 60 if minutes else None, show_progress=False)
    log = plm.vocgraft_training
    info = {k: log[k] for k in ("steps", "tokens_seen", "epochs", "first_loss", "last_loss")}
    info["seconds"] = time.perf_counter() - start
    resources = {
        "target_embeddings": plm.get_input_embeddings().weight.detach().float(),
        "target_plm_tokenizer_size": len(aux),
        "target_plm_tokens": raw_tokens(aux),
    }
    return resources, info


def run_method(method, source_spec, source_tokenizer, tokenizer, plan, train, heldout, aux, resources):
    """One init method on a fresh source model; ``resources`` (this k's) gains the fastText vectors it trains."""
    model, _ = load_model(source_spec)
    ctx = None
    had_vectors = "token_vectors" in resources
    start = time.perf_counter()
    with PeakRSS() as memory:
        if method == BASELINE:
            mean_resizing_baseline(model, tokenizer)
        else:
            # Align and Merge work over the auxiliary tokenizer the new tokens came from, as `vocgraft expand` does
            ctx = InitContext(
                plan, source_tokenizer, tokenizer, corpus=train, seed=0, aux_tokenizer=aux, resources=dict(resources)
            )
            input_rows, head_rows = initialize(model, method, ctx)
    seconds = time.perf_counter() - start
    fasttext_seconds = 0.0
    if ctx is not None:
        graft(model, plan, input_rows, head_rows, tokenizer)
        if not had_vectors and "token_vectors" in ctx.resources:  # FOCUS and SALT share them: once per k
            resources["token_vectors"] = ctx.resources["token_vectors"]
            fasttext_seconds = float(getattr(resources["token_vectors"], "seconds", 0.0) or 0.0)
    bpb = bits_per_byte(model, tokenizer, heldout, show_progress=False)
    return {
        "init_seconds": seconds,
        "fasttext_seconds": fasttext_seconds,  # part of init_seconds (0 where the vectors were reused)
        "init_peak_extra_mib": memory.extra_mib,
        "stats": _json_stats(method_stats(ctx.resources)) if ctx is not None else {},
        "bpb": bpb,
    }


def _json_stats(stats: dict) -> dict:
    """The statistics without anything JSON cannot hold (numbers, strings, flags and dicts of those stay)."""
    plain = (int, float, str, bool, type(None))
    return {
        key: {k: v for k, v in value.items() if isinstance(v, plain)} if isinstance(value, dict) else value
        for key, value in stats.items()
        if isinstance(value, (dict, *plain))
    }


def fallbacks(stats: dict) -> str:
    """How a method placed the new tokens it could not place by its own rule (its reported statistics)."""
    if "align_stats" in stats:
        s = stats["align_stats"]
        return (
            f"aligned {s['seen']} ({s['several_tuples']} with >1 tuple); unseen: Merge {s['unseen_merge']}, "
            f"Random {s['unseen_random']}"
        )
    if "merge_stats" in stats:
        s = stats["merge_stats"]
        return (
            f"aux merges {s['aux_merges']}, expansion merges {s['target_merges']}, spelled {s['spelled']}, "
            f"Random {s['random']}"
        )
    if "focus_stats" in stats:
        s = stats["focus_stats"]
        return f"Random {round(s['fallback_share'] * s['n_new'])} of {s['n_new']} ({s['n_keys']} keys)"
    salt = stats.get("salt_stats") or stats.get("salt_centered_stats")
    if salt:
        return (
            f"Random {salt['random_fallback']} of {salt['new']} (no PLM row {salt['no_plm_row']}, no vector "
            f"{salt['no_vector']}); single neighbour {salt['single_neighbour']}, degenerate "
            f"{salt['degenerate_fallback']}; {salt['anchors']} anchors"
        )
    return "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--langs", nargs="*", default=["el", "hi"])
    parser.add_argument("--ks", nargs="*", type=int, default=[100, 1000, 5000])
    parser.add_argument("--methods", nargs="*", default=METHODS)
    parser.add_argument("--train-lines", type=int, default=32768)
    parser.add_argument("--eval-lines", type=int, default=500)
    parser.add_argument("--aux-vocab-size", type=int, default=32000)
    parser.add_argument(
        "--keep-marks",
        choices=KEEP_MARKS_SETTINGS,
        default="auto",
        help="whether the auxiliary and expanded tokenizers keep combining marks with their letters (default as "
        "`vocgraft expand`: auto)",
    )
    parser.add_argument(
        "--protect-lines",
        type=int,
        default=8192,
        help="English *training* lines whose tokenization expansion must keep (0: none); English "
        "held-out lines are then measured, never used",
    )
    parser.add_argument(
        "--scripts",
        choices=["auto", "any"],
        default="auto",
        help="restrict new tokens to the "
        "corpus's dominant writing systems (auto, as `vocgraft expand` does) or not (any)",
    )
    parser.add_argument(
        "--plm-steps", type=int, default=100, help="optimizer steps of the target PLM SALT reads (one per language)"
    )
    parser.add_argument("--plm-minutes", type=float, help="also stop the PLM after this long (load-dependent)")
    parser.add_argument(
        "--fasttext-min-count", type=int, default=10, help="FOCUS/SALT fastText minCount (paper 002: 10)"
    )
    parser.add_argument("--out", default=str(RESULTS / "expansion"))
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="instead of running: merge the reports of runs split over processes (by language or by method) into "
        "--out, checking that their tokenizers agree",
    )
    args = parser.parse_args()
    if args.merge:
        report = merge_reports([json.loads(Path(path).read_text(encoding="utf-8")) for path in args.merge])
        write_json(f"{args.out}.json", report)
        write_markdown(report, f"{args.out}.md")
        return
    unknown = sorted(set(args.methods) - set(REGISTRY) - {BASELINE})
    if unknown:
        parser.error(f"unknown init method {unknown[0]!r}; choose from {', '.join(METHODS)}")

    report = new_report(args.model, args, languages={})
    english = read_lines(SHARED_CORPORA / "en" / "heldout.txt")
    protect = read_lines(SHARED_CORPORA / "en" / "train.txt", limit=args.protect_lines) if args.protect_lines else None
    _, source_tokenizer = load_model(args.model)
    needs_plm = any("target_plm" in REGISTRY[m].needs for m in args.methods if m in REGISTRY)
    for lang in args.langs:
        lang_start = time.perf_counter()
        train = read_lines(SHARED_CORPORA / lang / "train.txt", limit=args.train_lines)
        heldout = read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=args.eval_lines)
        model, _ = load_model(args.model)
        entry = report["languages"][lang] = {"train_lines": len(train), "eval_lines": len(heldout), "runs": []}
        entry["source"] = bits_per_byte(model, source_tokenizer, heldout, show_progress=False)
        del model
        start = time.perf_counter()
        # the source as the expanded tokenizer will pre-tokenize it, chosen as `vocgraft expand` chooses
        marks = choose_keep_marks(args.keep_marks, source_tokenizer, train)
        splitting = marks.apply(source_tokenizer)
        entry["keep_marks"] = marks.to_dict()
        aux = train_aux_tokenizer(splitting, train, args.aux_vocab_size)
        entry["aux_tokenizer_seconds"] = time.perf_counter() - start
        scripts = dominant_scripts(train) if args.scripts == "auto" else None
        entry["scripts"] = sorted(scripts) if scripts else None
        plm_resources = {}
        if needs_plm:
            plm_resources, entry["plm"] = train_target_plm(aux, train, args.plm_steps, args.plm_minutes)
        print(
            f"{lang}: source {entry['source']['bits_per_byte']:.3f} bits/byte; {marks.describe()}; aux tokenizer "
            f"{entry['aux_tokenizer_seconds']:.1f} s"
            + (f"; PLM {entry['plm']['steps']} steps {entry['plm']['seconds']:.0f} s" if needs_plm else ""),
            flush=True,
        )
        for k in args.ks:
            start = time.perf_counter()
            expansion = expand_tokenizer(splitting, aux, train, k, protect=protect, scripts=scripts)
            tokenizer = expansion.tokenizer
            plan = VocabPlan.from_tokenizers(source_tokenizer, tokenizer, "expand")
            expand_seconds = time.perf_counter() - start
            usage = expansion_summary(source_tokenizer, tokenizer, plan.new_ids, heldout)
            common = {
                "k": k,
                "added": len(expansion.new_tokens),
                "intermediates": len(expansion.intermediates),
                "expand_seconds": expand_seconds,
                **usage,
                "english_changed_share": english_changed_share(source_tokenizer, tokenizer, english),
            }
            resources = {"fasttext": {"min_count": args.fasttext_min_count}, **plm_resources}  # fresh per k
            for method in args.methods:
                run = {
                    **common,
                    "method": method,
                    **run_method(method, args.model, source_tokenizer, tokenizer, plan, train, heldout, aux, resources),
                }
                entry["runs"].append(run)
                print(
                    f"{lang} k={k} {method}: {run['bpb']['bits_per_byte']:.3f} bits/byte "
                    f"(uniform {run['bpb']['uniform_bits_per_byte']:.3f}), speedup {run['speedup']:.3f}, "
                    f"used {run['new_tokens_used_share']:.0%}, init {run['init_seconds']:.2f} s; "
                    f"{fallbacks(run['stats'])}",
                    flush=True,
                )
                write_json(f"{args.out}.json", report)
        entry["wall_seconds"] = time.perf_counter() - lang_start
        write_json(f"{args.out}.json", report)
    write_markdown(report, f"{args.out}.md")


PER_K = ("added", "intermediates", "tokens_per_line_after", "speedup", "new_tokens_used_share", "roundtrip_exact")


def merge_reports(reports: list[dict]) -> dict:
    """One report from runs of the same settings split over processes (by language, k or method): runs ordered by
    k, then by METHODS, a (k, method) that two parts ran taken from the first; the per-k tokenizer figures of the
    parts must agree (same auxiliary tokenizer and expansion in each process)."""
    first = reports[0]
    fixed = ("model", "train_lines", "eval_lines", "aux_vocab_size", "keep_marks", "protect_lines", "scripts")
    for other in reports[1:]:
        differ = [key for key in fixed if other["args"].get(key) != first["args"].get(key)]
        if differ:
            raise SystemExit(f"cannot merge runs with different {', '.join(differ)}")
    methods = [m for m in METHODS if any(m in r["args"]["methods"] for r in reports)]
    ks = sorted({k for r in reports for k in r["args"]["ks"]})
    merged = {
        **first,
        "args": {**first["args"], "ks": ks, "methods": methods, "merged_from": len(reports)},
        "languages": {},
    }
    for report in reports:
        for lang, entry in report["languages"].items():
            into = merged["languages"].setdefault(lang, {**entry, "runs": [], "parts_wall_seconds": []})
            if "plm" in entry:
                into["plm"] = entry["plm"]
            into["parts_wall_seconds"].append(entry.get("wall_seconds"))
            into["parts"] = len(into["parts_wall_seconds"])
            done = {(r["k"], r["method"]) for r in into["runs"]}
            into["runs"] += [r for r in entry["runs"] if (r["k"], r["method"]) not in done]  # first part's run wins
    for entry in merged["languages"].values():
        walls = entry.pop("parts_wall_seconds")
        entry.pop("wall_seconds", None)
        if None not in walls:  # a part stopped before it finished has its runs in, not its wall time
            entry["wall_seconds"] = max(walls)  # the parts ran in parallel
        done = {(r["k"], r["method"]) for r in entry["runs"]}
        entry["partial"] = any((k, m) not in done for k in ks for m in methods)
        for run in entry["runs"]:
            same_k = next(r for r in entry["runs"] if r["k"] == run["k"])
            if any(run[key] != same_k[key] for key in PER_K):
                raise SystemExit(f"k={run['k']}: the parts' expansions differ ({run['method']} vs {same_k['method']})")
        entry["runs"].sort(key=lambda r: (r["k"], methods.index(r["method"])))
    return merged


def write_markdown(report: dict, path: str) -> None:
    args = report["args"]
    parts = [
        f"# Expansion right after initialization: {report['model']}\n",
        f"{report['machine']}, {report['date']}. Bits/byte on the first {args['eval_lines']} held-out lines; the "
        "uniform reference is what a model knowing only the tokenizer scores. Auxiliary tokenizer: byte-level BPE, "
        f"{args['aux_vocab_size']} tokens, --keep-marks {args.get('keep_marks', 'off')}. FOCUS and SALT: fastText "
        f"minCount {args.get('fasttext_min_count', 10)}, one fastText run per k shared by them (the fastText column "
        "is its training time, inside init s of the first method that ran it). SALT's target PLM: GPT-2-style, "
        f"2 layers, trained {args.get('plm_steps')} steps on the training lines with the auxiliary tokenizer.\n",
    ]
    for lang, entry in report["languages"].items():
        src = entry["source"]
        plm = entry.get("plm")
        marks = entry.get("keep_marks")
        parts.append(
            f"\n## {lang}\n\nsource: {src['bits_per_byte']:.3f} bits/byte (uniform "
            f"{src['uniform_bits_per_byte']:.3f}), {entry['train_lines']} training lines, new tokens restricted "
            f"to {', '.join(entry.get('scripts') or ['any script'])}"
            + (f"; keep marks {'on' if marks['keep'] else 'off'} ({marks['reason']})" if marks else "")
            + (
                f"; target PLM {plm['steps']} steps in {plm['seconds']:.0f} s (loss {plm['first_loss']:.2f} -> "
                f"{plm['last_loss']:.2f})"
                if plm
                else ""
            )
            + (f"; wall time {entry['wall_seconds'] / 60:.1f} min" if "wall_seconds" in entry else "")
            + ("; **partial: the run was stopped before every (k, method) finished**" if entry.get("partial") else "")
            + (f" ({entry['parts']} processes in parallel)" if entry.get("parts", 1) > 1 else "")
            + "\n"
        )
        per_k = {r["k"]: r for r in entry["runs"]}
        parts.append(
            markdown_table(
                ["k", "added", "intermediates", "tokens/line", "speedup", "new used", "round trip", "en changed"],
                [
                    [
                        k,
                        r["added"],
                        r["intermediates"],
                        r["tokens_per_line_after"],
                        r["speedup"],
                        r["new_tokens_used_share"],
                        r["roundtrip_exact"],
                        r["english_changed_share"],
                    ]
                    for k, r in per_k.items()
                ],
            )
        )
        parts.append("")
        rows = [
            [
                r["k"],
                r["method"],
                r["bpb"]["bits_per_byte"],
                r["bpb"]["uniform_bits_per_byte"],
                r["bpb"]["bits_per_byte"] < r["bpb"]["uniform_bits_per_byte"],
                r["init_seconds"],
                r.get("fasttext_seconds", 0.0),
                r["init_peak_extra_mib"],
                fallbacks(r.get("stats", {})),
            ]
            for r in entry["runs"]
        ]
        parts.append(
            markdown_table(
                ["k", "init", "bits/byte", "uniform", "beats uniform", "init s", "fastText s", "init MiB", "fallbacks"],
                rows,
            )
        )
    Path(path).write_text("\n".join(parts) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
