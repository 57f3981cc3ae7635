"""lm-evaluation-harness as an outside ruler: its bits_per_byte next to `vocgraft eval`'s, on the source and on
expanded models, over the same held-out lines.

Per language: the source model and an expansion of it (`vocgraft expand --new-tokens K --init INIT` on the
language's training corpus, built once in ``--work`` and reused). For each model, `vocgraft lm-eval-task` writes the
task over the first ``--lines`` held-out lines and prints the `lm_eval` command; that command is run as printed (in
a fresh process, offline), then `vocgraft eval` on the same lines. Each row: both bits/byte, their relative
difference, lm-eval's byte and word perplexity, the lines longer than the window (where the two window long lines
differently) and the seconds of each command. Writes ``--out``.json and .md with the machine, the date and the load
average before and after (the machine may be shared: times are upper bounds).

    .venv/bin/python benchmarks/lm_eval_agreement.py            # SmolLM2, el and hi, k=1000, mean, 200 lines
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from common import new_report

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.eval import lm_eval_task as lmt
from vocgraft.models import load_tokenizer
from vocgraft.outdir import atomic_write, write_json
from vocgraft.report import markdown_table

RESULTS = Path(__file__).resolve().parent / "results"
SRC = Path(__file__).resolve().parent.parent / "src"
CLI = "import sys; from vocgraft.cli import main; sys.exit(main(sys.argv[1:]))"
GOAL = 0.005  # the issue's: lm-eval's bits/byte within 0.5% of vocgraft eval's
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="source model (vocgraft's --model)")
    parser.add_argument("--langs", default="el,hi", help="language folders of --corpora")
    parser.add_argument("--corpora", default=str(SHARED_CORPORA), help="<lang>/train.txt and <lang>/heldout.txt")
    parser.add_argument("--k", type=int, default=1000, help="new tokens of the expanded models")
    parser.add_argument("--init", default="mean", help="init method of the expanded models")
    parser.add_argument("--aux-vocab-size", type=int, default=16000, help="vocgraft expand's --aux-vocab-size")
    parser.add_argument("--lines", type=int, default=200, help="first N held-out lines, one document each")
    parser.add_argument("--batch-size", type=int, default=8, help="both tools' batch size")
    parser.add_argument("--max-length", type=int, default=512, help="both tools' window (vocgraft eval's default)")
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "vocgraft" / "lm_eval_agreement"),
                        help="expanded models and task folders (kept: a rerun reuses the models)")  # fmt: skip
    parser.add_argument("--out", default=str(RESULTS / "lm_eval_agreement"), help="writes OUT.json and OUT.md")
    return parser.parse_args(argv)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(argv: list[str], log: Path, env: dict | None = None) -> tuple[float, str]:
    """Run a command in a fresh process; its wall seconds and stdout (stderr goes to ``log``)."""
    start = time.perf_counter()
    with log.open("w") as err:
        done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} failed (exit {done.returncode}):\n{log.read_text()[-4000:]}")
    return seconds, done.stdout


def vocgraft(args: list[str], log: Path) -> tuple[float, str]:
    """A `vocgraft` command of this checkout (its src/ first on the path)."""
    path = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **OFFLINE, "PYTHONPATH": path, "VOCGRAFT_NO_PROGRESS": "1"}
    return run([sys.executable, "-c", CLI, *args], log, env)


def expanded_model(lang: str, args, work: Path) -> Path:
    """`vocgraft expand` of the source on the language's training corpus; kept in ``work`` under a name that holds
    every setting that shapes it, so a rerun reuses it and a changed setting builds a new one."""
    corpus = Path(args.corpora).absolute() / lang / "train.txt"
    settings = json.dumps([args.model, str(corpus), args.k, args.init, args.aux_vocab_size])
    out = work / f"{lang}-k{args.k}-{args.init}-{hashlib.sha256(settings.encode()).hexdigest()[:10]}"
    if not (out / "vocgraft.json").is_file():
        vocgraft(["expand", "--model", args.model, "--corpus", str(corpus), "--new-tokens", str(args.k), "--init",
                  args.init, "--aux-vocab-size", str(args.aux_vocab_size), "--out", str(out), "--overwrite"],
                 work / f"expand-{lang}.log")  # fmt: skip
    return out


def measure(lang: str, label: str, model: str, heldout: Path, args, work: Path) -> dict:
    """One row: the printed lm_eval command run as printed, then `vocgraft eval` on the same lines."""
    task_dir = work / f"task-{lang}-{label}"
    _, printed = vocgraft(["lm-eval-task", "--model", model, "--text", str(heldout), "--limit", str(args.lines),
                           "--name", f"vocgraft_{lang}", "--batch-size", str(args.batch_size), "--max-length",
                           str(args.max_length), "--out", str(task_dir),
                           "--overwrite"], work / f"task-{lang}-{label}.log")  # fmt: skip
    command = printed.strip().splitlines()[-1]
    argv = shlex.split(command)
    lm_eval_bin = Path(sys.executable).with_name("lm_eval")  # this environment's, whatever PATH says
    lm_eval_seconds, _ = run([str(lm_eval_bin), *argv[1:]], work / f"lm_eval-{lang}-{label}.log",
                             {**os.environ, **OFFLINE})  # fmt: skip
    result_file = max((task_dir / lmt.RESULTS_FOLDER).rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    theirs = lmt.results_of(json.loads(result_file.read_text(encoding="utf-8")), f"vocgraft_{lang}")
    eval_json = work / f"eval-{lang}-{label}.json"
    eval_seconds, _ = vocgraft(["eval", "--model", model, "--text", str(heldout), "--limit", str(args.lines),
                                "--batch-size", str(args.batch_size), "--max-length", str(args.max_length), "--json",
                                str(eval_json)],
                               work / f"eval-{lang}-{label}.log")  # fmt: skip
    ours = json.loads(eval_json.read_text(encoding="utf-8"))["bpb"]
    task = lmt.read_task(task_dir)
    docs = task.data_path.read_text(encoding="utf-8").splitlines()
    return {
        "lang": lang,
        "model": label,
        "model_path": model,
        "lines": task.lines,
        "bytes": task.bytes,
        "tokens": ours["tokens_scored"],
        "lines_longer_than_window": lmt.lines_longer_than(load_tokenizer(model), docs, ours["max_length"]),
        "vocgraft_bits_per_byte": ours["bits_per_byte"],
        "lm_eval_bits_per_byte": theirs["bits_per_byte"],
        "relative_difference": theirs["bits_per_byte"] / ours["bits_per_byte"] - 1,
        "lm_eval_byte_perplexity": theirs["byte_perplexity"],
        "lm_eval_word_perplexity": theirs["word_perplexity"],
        "vocgraft_eval_seconds": eval_seconds,
        "lm_eval_seconds": lm_eval_seconds,
        "lm_eval_command": command,
    }


def markdown(report: dict) -> str:
    args = report["args"]
    rows = [
        [r["lang"], r["model"], r["lines"], r["tokens"], r["lines_longer_than_window"],
         f"{r['vocgraft_bits_per_byte']:.6f}", f"{r['lm_eval_bits_per_byte']:.6f}", f"{r['relative_difference']:+.2e}",
         f"{r['lm_eval_byte_perplexity']:.5g}", f"{r['lm_eval_word_perplexity']:.5g}",
         f"{r['vocgraft_eval_seconds']:.1f}", f"{r['lm_eval_seconds']:.1f}"]
        for r in report["rows"]
    ]  # fmt: skip
    header = ["lang", "model", "lines", "tokens", "lines > window", "vocgraft eval bits/byte", "lm-eval bits/byte",
              "relative difference", "lm-eval byte ppl", "lm-eval word ppl", "vocgraft eval s",
              "lm_eval s"]  # fmt: skip
    worst = max((abs(r["relative_difference"]) for r in report["rows"]), default=float("nan"))
    lines = [
        "# lm-evaluation-harness vs vocgraft eval: bits per byte",
        "",
        f"{report['date']}, {report['machine']}. Load average (1/5/15 min) {report['load_before']} before, "
        f"{report['load_after']} after (times are upper bounds on a shared machine; each includes the process start "
        "and the model load).",
        "",
        f"Source `{args['model']}`, and its expansion with k={args['k']} new tokens, init `{args['init']}` "
        f"(`vocgraft expand` on `<lang>/train.txt`), on the first {args['lines']} lines of `<lang>/heldout.txt`. "
        "lm-eval: the command `vocgraft lm-eval-task` prints, run as printed (lm-eval "
        f"{report['lm_eval_version']}, HF model, `add_bos_token=False`, vocgraft's prefix token, window and dtype).",
        "",
        markdown_table(header, rows),
        "",
        f"Largest relative difference: {worst:.2e} (goal: within {GOAL:.1%}: "
        f"{'met' if worst <= GOAL else 'NOT met'}). Lines longer than the window are where the two "
        f"differ by design: lm-eval scores them in disjoint windows of {args['max_length']} tokens, vocgraft eval in "
        "windows overlapping by half (more context); `--max-length` above the longest line removes that difference.",
        "",
        "Rerun: `.venv/bin/python benchmarks/lm_eval_agreement.py` (best on otherwise idle cores).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import importlib.metadata

    args = parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report = new_report(args.model, args, load_before=load_average(), rows=[])
    report["lm_eval_version"] = importlib.metadata.version("lm_eval")
    out = Path(args.out)
    for lang in args.langs.split(","):
        heldout = work / f"{lang}-heldout.txt"  # vocgraft's reading of the file: the same for both tools
        atomic_write(heldout, "\n".join(read_lines(Path(args.corpora) / lang / "heldout.txt", limit=args.lines)) + "\n")
        models = [("source", args.model), (f"k{args.k}-{args.init}", str(expanded_model(lang, args, work)))]
        for label, model in models:
            row = measure(lang, label, model, heldout, args, work)
            report["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "lm_eval_command"}), file=sys.stderr)
    report["load_after"] = load_average()
    write_json(out.with_suffix(".json"), report)
    atomic_write(out.with_suffix(".md"), markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
