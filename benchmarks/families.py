"""The real-tokenizer families, run as a new user would: every folder of ../shared/tokenizers wrapped in a tiny random
model of that family's shape, then `vocgraft expand` (Greek and Hindi, k=200 and 2000) and `vocgraft replace` (Greek)
with --init mean on 4,096 training lines, each command in its own process (wall time and peak RSS of that process).

Reported per run: exact round trip of held-out lines, English held-out lines whose ids changed (expand), the share of
new ids the held-out text uses, whether every special-token string keeps its role, and whether the chat template
renders the same text and decodes as the source decodes it.

    .venv/bin/python benchmarks/families.py [--families gpt2 neox] [--ks 200 2000] [--lines 4096]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import new_report
from transformers import AutoTokenizer

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.families import FAMILIES, family_info, family_source_dir
from vocgraft.outdir import write_json
from vocgraft.plan import VocabPlan
from vocgraft.report import markdown_table

RESULTS = Path(__file__).resolve().parent / "results"
ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")
CONVERSATION = [
    {"role": "user", "content": "Γειά σου, τι κάνεις; नमस्ते"},
    {"role": "assistant", "content": "Καλά! Hello there."},
]
RUN = (
    "import sys\nfrom vocgraft.cli import main\nfrom vocgraft.train.lapt import peak_rss_mib\n"
    "code = main(sys.argv[1:])\nprint('PEAK_RSS_MIB', peak_rss_mib())\nsys.exit(code)\n"
)


def run_cli(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one vocgraft command in a fresh process."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"vocgraft {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    peak = next(float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("PEAK_RSS_MIB"))
    return seconds, peak


def measure(source_dir: Path, out: Path, lang: str, mode: str) -> dict:
    source, target = AutoTokenizer.from_pretrained(source_dir), AutoTokenizer.from_pretrained(out)
    plan = VocabPlan.from_json(out / "vocgraft-plan.json")
    heldout = read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=500)
    ids = target(heldout, add_special_tokens=False).input_ids
    new = set(plan.new_ids)
    facts = {
        "roundtrip_exact": [target.decode(x) for x in ids] == heldout,
        "new_ids_used_share": len({t for x in ids for t in x} & new) / max(len(new), 1),
        "new_tokens": len(new),
        "roles_kept": all(getattr(target, r) == getattr(source, r) for r in ROLES),
        "specials_kept": set(source.all_special_tokens) <= set(target.all_special_tokens),
    }
    if mode == "expand":
        english = read_lines(SHARED_CORPORA / "en" / "heldout.txt", limit=500)
        facts["english_lines_changed"] = sum(
            a != b for a, b in zip(source(english).input_ids, target(english).input_ids)
        )
    if source.chat_template:
        rendered = source.apply_chat_template(CONVERSATION, tokenize=False)
        facts["chat_template_kept"] = target.apply_chat_template(CONVERSATION, tokenize=False) == rendered and (
            target.decode(target(rendered, add_special_tokens=False).input_ids)
            == source.decode(source(rendered, add_special_tokens=False).input_ids)
        )
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="*", default=FAMILIES)
    parser.add_argument("--ks", nargs="*", type=int, default=[200, 2000])
    parser.add_argument("--lines", type=int, default=4096)
    parser.add_argument("--vocab-size", type=int, default=16000, help="aux (expand) and target (replace) size")
    args = parser.parse_args()
    report = new_report("tiny random models of each family", args, runs=[])
    with tempfile.TemporaryDirectory(prefix="vocgraft-families-") as tmp:
        root = Path(tmp)
        for lang in ("el", "hi"):
            corpus = root / f"{lang}.txt"
            corpus.write_text("\n".join(read_lines(SHARED_CORPORA / lang / "train.txt", limit=args.lines)) + "\n")
        for family in args.families:
            source = family_source_dir(family, root / family / "source")
            cases = [("expand", lang, k) for lang in ("el", "hi") for k in args.ks] + [("replace", "el", None)]
            for mode, lang, k in cases:
                out = root / family / f"{mode}-{lang}-{k}"
                command = [mode, "--model", str(source), "--corpus", str(root / f"{lang}.txt"), "--init", "mean"]
                command += ["--out", str(out)]
                if mode == "expand":
                    command += ["--new-tokens", str(k), "--aux-vocab-size", str(args.vocab_size)]
                else:
                    command += ["--vocab-size", str(args.vocab_size)]
                seconds, peak = run_cli(command)
                row = {"family": family, "mode": mode, "lang": lang, "k": k, "wall_seconds": seconds}
                row |= {"peak_rss_mib": peak, **measure(source, out, lang, mode)}
                report["runs"].append(row)
                print(json.dumps(row), flush=True)
    write_json(RESULTS / "families.json", report)
    write_markdown(report)


def write_markdown(report: dict) -> None:
    header = ["family", "run", "round trip", "English lines changed", "new ids used", "roles & specials kept"]
    header += ["chat template kept", "wall s", "peak RSS MiB"]
    rows = []
    for r in report["runs"]:
        run = f"{r['mode']} {r['lang']}" + (f" k={r['k']}" if r["k"] else "")
        rows.append(
            [
                r["family"],
                run,
                "exact" if r["roundtrip_exact"] else "NO",
                f"{r['english_lines_changed']} / 500" if "english_lines_changed" in r else "–",
                f"{r['new_ids_used_share']:.3f} of {r['new_tokens']}",
                "yes" if r["roles_kept"] and r["specials_kept"] else "NO",
                {True: "yes", False: "NO"}.get(r.get("chat_template_kept"), "–"),
                round(r["wall_seconds"], 1),
                round(r["peak_rss_mib"]),
            ]
        )
    text = [
        "# Real tokenizer families: expand and replace as a new user runs them\n",
        f"{report['machine']}, {report['date']}; tiny random models (hidden 64, 2 layers) with each family's "
        f"embedding shape; --init mean; {report['args']['lines']} training lines; aux/target tokenizer "
        f"{report['args']['vocab_size']}; measured on 500 held-out lines. Family facts: "
        + "; ".join(f"{f}: {family_info(f)['model_rows']} rows" for f in report["args"]["families"])
        + ".\n",
        markdown_table(header, rows),
    ]
    (RESULTS / "families.md").write_text("\n".join(text) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
