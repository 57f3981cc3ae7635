"""`vocgraft export gguf` checked by llama.cpp itself (through llama-cpp-python): does llama.cpp give the ids the
output's own tokenizer gives, and does the exported model continue text as transformers does?

Tokenization: every family of ../shared/tokenizers in a tiny random model (vocgraft.families), with its outputs
`expand` Greek (k=1000), `expand` Hindi (k=1000, --keep-marks auto) and `replace` Greek, plus SmolLM2-135M and its
outputs `expand` Greek (k=1000), `expand` Hindi (k=1000, --keep-marks on: the marks-aware regex) and `replace`
Greek. Each is exported (f32); an output vocgraft refuses is recorded with the reason, the nearest llama.cpp type and
the share vocgraft predicted, then exported with --force-pre that type and measured like the others.
llama.cpp's ``Llama(model_path, vocab_only=True).tokenize(text, add_bos=False, special=False)`` is compared with
the output's ``AutoTokenizer`` (``add_special_tokens=False``) on the first 500 held-out lines of every shared
language, as prose lines and as 5-line chunks, numbered and indented (vocgraft.export.mismatch.chunks). Ids only:
llama-cpp-python drops tokens longer than 32 bytes when it decodes.

Generation: the SmolLM2 source, expand Greek and replace Greek (f32), 20 prompts (10 Greek, 10 English held-out
line beginnings), 16 greedy tokens each, llama.cpp (argmax of its logits) vs transformers (float32).

    .venv/bin/python benchmarks/gguf_parity.py [--families gpt2 llama2] [--no-smollm2] [--work DIR]

Needs llama-cpp-python 0.3.36: installed from ~/.cache/vocgraft/wheels/ when ``llama_cpp`` is not importable (build
the wheel once with ``pip wheel --no-deps llama-cpp-python==0.3.36 -w ~/.cache/vocgraft/wheels``, about 15 minutes
on 2 cores). Writes benchmarks/results/gguf_parity.{json,md}.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from common import new_report

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.export.errors import ExportRefused
from vocgraft.export.mismatch import chunks
from vocgraft.export.to_gguf import export_gguf
from vocgraft.outdir import write_json
from vocgraft.report import markdown_table

RESULTS = Path(__file__).resolve().parent / "results"
WHEELS = Path.home() / ".cache" / "vocgraft" / "wheels"
WHEEL_COMMAND = f"{sys.executable} -m pip wheel --no-deps llama-cpp-python==0.3.36 -w {WHEELS}"
HELDOUT = 500
PROMPTS = 20
NEW_TOKENS = 16


def ensure_llama_cpp():
    """``llama_cpp``, installed from the wheel the lead builds when it is not importable."""
    try:
        return importlib.import_module("llama_cpp")
    except ImportError:
        pass
    wheels = sorted(WHEELS.glob("llama_cpp_python-*.whl"))
    if not wheels:
        sys.exit(
            f"llama_cpp is not installed and {WHEELS} has no llama-cpp-python wheel; build it once with\n  "
            f"{WHEEL_COMMAND}\n(about 15 minutes on 2 cores), then run this benchmark again."
        )
    subprocess.run([sys.executable, "-m", "pip", "install", str(wheels[-1])], check=True)
    importlib.invalidate_caches()
    return importlib.import_module("llama_cpp")


def compare_ids(tokenizer, engine_tokenize: Callable[[str], list[int]], texts: Sequence[str]) -> dict:
    """The share of ``texts`` the engine gives exactly the ids of ``tokenizer`` (no special tokens added)."""
    ours = tokenizer(list(texts), add_special_tokens=False).input_ids
    same = sum(list(engine_tokenize(text)) == ids for text, ids in zip(texts, ours))
    return {"texts": len(texts), "identical": same / len(texts) if texts else 1.0}


def languages() -> list[str]:
    return sorted(p.name for p in SHARED_CORPORA.iterdir() if (p / "heldout.txt").is_file())


def heldout(lang: str) -> list[str]:
    return read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=HELDOUT)


# ---------------------------------------------------------------------------------------------------- outputs


def build_family(family: str, root: Path, k: int, vocab: int, train_lines: int) -> dict[str, Path]:
    from vocgraft.families import family_source_dir
    from vocgraft.recipes.expand import expand_model
    from vocgraft.recipes.replace import replace_model

    source = family_source_dir(family, root / "source")
    outs = {"source": source}
    for name, lang, keep in (("expand-el", "el", "auto"), ("expand-hi", "hi", "auto")):
        if not (root / name).is_dir():
            train = read_lines(SHARED_CORPORA / lang / "train.txt", limit=train_lines)
            expand_model(str(source), train, k, "mean", root / name, aux_vocab_size=vocab, keep_marks=keep,
                         inputs={"corpus": str(SHARED_CORPORA / lang / "train.txt")})  # fmt: skip
        outs[name] = root / name
    if not (root / "replace-el").is_dir():
        train = read_lines(SHARED_CORPORA / "el" / "train.txt", limit=train_lines)
        replace_model(str(source), train, "mean", root / "replace-el", target_vocab_size=vocab,
                      inputs={"corpus": str(SHARED_CORPORA / "el" / "train.txt")})  # fmt: skip
    outs["replace-el"] = root / "replace-el"
    return outs


def build_smollm2(root: Path, k: int, vocab: int, train_lines: int) -> dict[str, Path]:
    from vocgraft.models import resolve
    from vocgraft.recipes.expand import expand_model
    from vocgraft.recipes.replace import replace_model

    source = Path(resolve("smollm2"))
    outs = {"source": source}
    for name, lang, keep in (("expand-el", "el", "auto"), ("expand-hi-marks", "hi", "on")):
        if not (root / name).is_dir():
            train = read_lines(SHARED_CORPORA / lang / "train.txt", limit=train_lines)
            expand_model("smollm2", train, k, "mean", root / name, aux_vocab_size=vocab, keep_marks=keep,
                         inputs={"corpus": str(SHARED_CORPORA / lang / "train.txt")})  # fmt: skip
        outs[name] = root / name
    if not (root / "replace-el").is_dir():
        train = read_lines(SHARED_CORPORA / "el" / "train.txt", limit=train_lines)
        replace_model("smollm2", train, "mean", root / "replace-el", target_vocab_size=vocab,
                      inputs={"corpus": str(SHARED_CORPORA / "el" / "train.txt")})  # fmt: skip
    outs["replace-el"] = root / "replace-el"
    return outs


def export(folder: Path, out: Path) -> dict:
    """Export ``folder``; a refused one is recorded and exported with the nearest type, and the warning of one
    written with a difference its source has is recorded."""
    facts: dict = {"refused": None, "warning": None}
    try:
        result = export_gguf(folder, out, overwrite=out.exists())
        facts["warning"] = result.warning
    except ExportRefused as refused:
        facts["refused"] = {
            "reason": refused.choice.reason,
            "nearest": f"{refused.choice.model}/{refused.choice.pre}",
            "predicted": refused.mismatch.to_dict(),
        }
        result = export_gguf(folder, out, force_pre=refused.choice.pre, overwrite=out.exists())
    facts["tokenizer"] = f"{result.choice.model}/{result.choice.pre}"
    return facts


def tokenization(llama_cpp, file: Path, folder: Path) -> dict:
    """Per language: the share of held-out lines and of 5-line chunks llama.cpp tokenizes as the output does."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    engine = llama_cpp.Llama(model_path=str(file), vocab_only=True, verbose=False)

    def tokenize(text: str) -> list[int]:
        return engine.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    found = {}
    for lang in languages():
        lines = heldout(lang)
        found[lang] = {
            "lines": compare_ids(tokenizer, tokenize, lines),
            "chunks": compare_ids(tokenizer, tokenize, chunks(lines)),
        }
    return found


# ------------------------------------------------------------------------------------------------- generation


def prompts() -> list[str]:
    picked = []
    for lang in ("el", "en"):
        for line in heldout(lang)[: PROMPTS // 2]:
            picked.append(" ".join(line.split()[:8]))
    return picked


def greedy_transformers(model, ids: list[int]) -> list[int]:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        generated = []
        for _ in range(NEW_TOKENS):
            token = int(out.logits[0, -1].argmax())
            generated.append(token)
            out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return generated


def greedy_llama_cpp(engine, ids: list[int]) -> list[int]:
    import numpy as np

    engine.reset()
    engine.eval(ids)
    generated = []
    for _ in range(NEW_TOKENS):
        token = int(np.argmax(engine.scores[engine.n_tokens - 1]))
        generated.append(token)
        engine.eval([token])
    return generated


def generation(llama_cpp, file: Path, folder: Path, texts: Sequence[str] | None = None, engine=None) -> dict:
    """The first NEW_TOKENS greedy ids of transformers (float32) and of llama.cpp on each prompt (default
    :func:`prompts`), and how long a prefix they share; ``engine``: a loaded ``llama_cpp.Llama`` for ``file``."""
    import os

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if engine is None:
        engine = llama_cpp.Llama(
            model_path=str(file), n_ctx=256, logits_all=True, n_threads=os.cpu_count(), verbose=False
        )
    rows = []
    for prompt in prompts() if texts is None else texts:
        ids = tokenizer(prompt).input_ids
        ours, theirs = greedy_transformers(model, ids), greedy_llama_cpp(engine, ids)
        agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), NEW_TOKENS)
        rows.append({"prompt": prompt, "transformers": ours, "llama_cpp": theirs, "agreeing_prefix": agree})
    return {
        "prompts": len(rows),
        "identical": sum(r["agreeing_prefix"] == NEW_TOKENS for r in rows) / len(rows),
        "mean_agreeing_prefix": sum(r["agreeing_prefix"] for r in rows) / len(rows),
        "rows": rows,
    }


# ---------------------------------------------------------------------------------------------------- report


def share(value: dict) -> str:
    return f"{value['identical']:.0%}"


def write_markdown(report: dict) -> None:
    langs = languages()
    rows = []
    for name, facts in report["outputs"].items():
        cells = [f"{share(facts['ids'][lang]['lines'])} / {share(facts['ids'][lang]['chunks'])}" for lang in langs]
        refused = facts["refused"]
        verdict = "exact" if refused is None else f"refused; forced {facts['tokenizer']}"
        if refused is None and facts.get("warning"):
            verdict = "written; warned (the source's difference)"
        rows.append([name, facts["tokenizer"], verdict, *cells])
    lines = [
        "# GGUF export: llama.cpp's ids vs the output's tokenizer",
        "",
        f"{report['date']}, {report['machine']}; llama-cpp-python {report['llama_cpp']}. Command: "
        "`python benchmarks/gguf_parity.py`. Each cell: held-out lines / 5-line chunks (numbered, indented) that "
        f"llama.cpp tokenizes exactly as the output's own tokenizer ({HELDOUT} lines per language).",
        "",
        markdown_table(["output", "GGUF tokenizer", "export", *langs], rows),
        "",
        "## Refused outputs",
        "",
        "What vocgraft predicted (emulating the nearest type with tokenizers, on the output's own held-out text) and "
        "what llama.cpp then did with the forced file on the same language.",
        "",
    ]
    refused_rows = []
    for name, facts in report["outputs"].items():
        if facts["refused"] is None:
            continue
        predicted = facts["refused"]["predicted"]
        lang = Path(predicted["text"].split()[0]).parent.name or "?"
        measured = facts["ids"].get(lang)
        refused_rows.append([
            name, facts["refused"]["nearest"], facts["refused"]["reason"],
            f"{1 - predicted['lines_differing']:.1%} / {1 - predicted['chunks_differing']:.1%}",
            f"{share(measured['lines'])} / {share(measured['chunks'])}" if measured else "-",
        ])  # fmt: skip
    if refused_rows:
        lines += [markdown_table(["output", "nearest", "reason", "predicted identical", "llama.cpp identical"],
                                 refused_rows), ""]  # fmt: skip
    else:
        lines += ["None: every output was written without --force-pre.", ""]
    warned = [[name, facts["warning"]] for name, facts in report["outputs"].items() if facts.get("warning")]
    if warned:
        lines += ["## Written with a warning", "",
                  "A difference llama.cpp has with the source model's own tokenizer, which the output keeps: written "
                  "without --force-pre, with this one-line warning.", "",
                  markdown_table(["output", "warning"], warned), ""]  # fmt: skip
    if report["generation"]:
        lines += ["## Greedy continuation (SmolLM2, f32)", "",
                  f"{PROMPTS} prompts (10 Greek, 10 English), {NEW_TOKENS} tokens, argmax of llama.cpp's logits vs "
                  "transformers in float32.", ""]  # fmt: skip
        gen_rows = [[name, f"{g['identical']:.0%}", f"{g['mean_agreeing_prefix']:.1f}"]
                    for name, g in report["generation"].items()]  # fmt: skip
        lines += [markdown_table(["output", "identical continuations", "mean agreeing prefix (tokens)"], gen_rows), ""]
    lines += gemma3_section()
    (RESULTS / "gguf_parity.md").write_text("\n".join(lines), encoding="utf-8")


def gemma3_section() -> list[str]:
    """The real Gemma 3 270M's parity, as benchmarks/gemma3.py measured it (results/gemma3.json), so that this
    file has every exported model: tiny families, SmolLM2 and the second packaged model."""
    from gemma3 import parity_section

    path = RESULTS / "gemma3.json"
    if not path.is_file():
        return []
    report = json.loads(path.read_text(encoding="utf-8"))
    heading = (f"## Gemma 3 270M, real weights (f32; `benchmarks/gemma3.py`, {report['date']}, "
               f"llama-cpp-python {report.get('llama_cpp', '?')})")  # fmt: skip
    return parity_section(report, heading)


def main() -> None:
    from vocgraft.families import FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=FAMILIES)
    parser.add_argument("--no-smollm2", action="store_true", help="skip SmolLM2 (tokenization and generation)")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--vocab", type=int, default=8000, help="auxiliary / target tokenizer size")
    parser.add_argument("--train-lines", type=int, default=8192)
    parser.add_argument("--work", help="folder for the outputs and files (kept; reused when run again)")
    parser.add_argument("--markdown-only", action="store_true", help="write gguf_parity.md from gguf_parity.json")
    args = parser.parse_args()
    if args.markdown_only:
        write_markdown(json.loads((RESULTS / "gguf_parity.json").read_text(encoding="utf-8")))
        return
    llama_cpp = ensure_llama_cpp()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gguf-parity-"))
    report = new_report("tiny family models + SmolLM2-135M-Instruct", args, llama_cpp=llama_cpp.__version__,
                        outputs={}, generation={})  # fmt: skip
    started = time.perf_counter()
    groups = [(family, lambda root, f=family: build_family(f, root, args.k, args.vocab, args.train_lines))
              for family in args.families]  # fmt: skip
    if not args.no_smollm2:
        groups.append(("smollm2", lambda root: build_smollm2(root, args.k, 16000, 16384)))
    for group, build in groups:
        root = work / group
        outputs = build(root)
        for name, folder in outputs.items():
            key = f"{group} {name}"
            file = root / f"{name}.gguf"
            facts = export(folder, file)
            facts["ids"] = tokenization(llama_cpp, file, folder)
            report["outputs"][key] = facts
            if group == "smollm2" and name in ("source", "expand-el", "replace-el"):
                report["generation"][key] = generation(llama_cpp, file, folder)
            print(key, facts["tokenizer"], "refused" if facts["refused"] else "exact", flush=True)
            write_json(RESULTS / "gguf_parity.json", report)
    report["seconds"] = round(time.perf_counter() - started, 1)
    write_json(RESULTS / "gguf_parity.json", report)
    write_markdown(report)
    print(f"-> {RESULTS / 'gguf_parity.md'} (work folder {work})")


if __name__ == "__main__":
    main()
