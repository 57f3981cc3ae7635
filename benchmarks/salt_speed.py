"""SALT speed on real data: the packaged SmolLM2 with its tokenizer replaced by a Greek byte-level BPE.

Trains (or reuses, from --work) a target tokenizer of --vocab tokens on the shared Greek corpus and a small PLM with
that tokenizer (vocgraft.train.plm, --minutes of CPU), then times SALT's parts separately: fastText token vectors,
sparsemax neighbours, batched least squares, and the row product. Writes benchmarks/results/salt_speed.json.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/salt_speed.py [--vocab 32000] [--minutes 4]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import torch

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.init import InitContext, initialize
from vocgraft.models import load_model, load_tokenizer
from vocgraft.plan import VocabPlan
from vocgraft.recipes.replace import with_source_specials
from vocgraft.tokenization.train import save_tokenizer, train_tokenizer
from vocgraft.train.plm import save_plm, train_small_plm

RESULTS = Path(__file__).resolve().parent / "results"
CORPUS = SHARED_CORPORA / "el" / "train.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=32768)
    parser.add_argument("--vocab", type=int, default=32000, help="target tokenizer size")
    parser.add_argument("--minutes", type=float, default=4.0, help="PLM training budget")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument(
        "--min-count",
        type=int,
        nargs="+",
        default=[10],
        help="fastText minCount per run (10: the FOCUS/SALT setting; 1: vectors for every seen token)",
    )
    parser.add_argument("--work", default="/tmp/vocgraft-salt-bench", help="cache for the tokenizer and the PLM")
    args = parser.parse_args()
    work = Path(args.work) / f"v{args.vocab}-l{args.lines}"
    result: dict = {"lines": args.lines, "vocab": args.vocab}

    t0 = time.perf_counter()
    model, source = load_model(args.model)
    result["load_model_s"] = round(time.perf_counter() - t0, 3)
    lines = read_lines(CORPUS, limit=args.lines)

    t0 = time.perf_counter()
    if (work / "tokenizer").is_dir():
        target = load_tokenizer(work / "tokenizer")
    else:
        target = train_tokenizer(lines, "bytelevel-bpe", args.vocab, like=source)
        save_tokenizer(target, work / "tokenizer")
        target = load_tokenizer(work / "tokenizer")
    result["target_tokenizer_s"] = round(time.perf_counter() - t0, 3)
    plm_size = len(target)
    target = with_source_specials(source, target)  # what `vocgraft replace` does before the plan
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    result["plan"] = plan.summary()

    if (work / "plm").is_dir():
        plm, _ = load_model(work / "plm")
    else:
        plm = train_small_plm(load_tokenizer(work / "tokenizer"), lines, steps=None, max_seconds=args.minutes * 60)
        save_plm(plm, load_tokenizer(work / "tokenizer"), work / "plm")
    manifest = json.loads((work / "plm" / "vocgraft.json").read_text())
    training = {k: v for k, v in manifest["training"].items() if k != "losses"}
    result["plm"] = {"architecture": manifest["architecture"], "training": training}

    from vocgraft.init.token_vectors import train_token_vectors

    e_t = plm.get_input_embeddings().weight.detach().float()
    src = model.get_input_embeddings().weight.detach()[: len(source)]
    result["runs"] = []
    for min_count in args.min_count:
        run: dict = {"fasttext_min_count": min_count}
        t0 = time.perf_counter()
        vectors = train_token_vectors(target, lines, min_count=min_count)
        run["token_vectors_s"] = round(time.perf_counter() - t0, 3)
        run["token_vectors"] = len(vectors.ids)
        resources = {"target_embeddings": e_t, "target_plm_tokenizer_size": plm_size, "token_vectors": vectors}
        ctx = InitContext(plan, source, target, corpus=lines, resources=resources)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the Random-fallback count is in the stats
            rows, _ = initialize(model, "salt", ctx)
        run["salt_s (vectors given)"] = round(time.perf_counter() - t0, 3)
        run["salt_stats"] = {k: v for k, v in ctx.resources["salt_stats"].items() if k != "token_vectors_seconds"}
        run["row_norm_ratio"] = round(float(rows.norm(dim=1).median() / src.norm(dim=1).median()), 4)
        result["runs"].append(run)
    result["torch_threads"] = torch.get_num_threads()
    result["machine"] = f"{platform.machine()}, {platform.processor() or 'cpu'}"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "salt_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
