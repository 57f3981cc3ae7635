"""Align speed on real data: the packaged SmolLM2 expanded with k Greek tokens, aligned against the auxiliary tokenizer.

The expansion is the real tokenizer stage (auxiliary byte-level BPE trained on the same lines, top-k expansion).
Times tokenization (source and auxiliary tokenizers), span alignment + tuple counting, and the rest (Merge tree and
rows for unseen tokens, the sparse product) separately on the first N lines of the shared Greek corpus; writes
benchmarks/results/align_speed.json.

    .venv/bin/python benchmarks/align_speed.py [--lines 32768] [--k 500] [--aux-vocab 8000]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.init import InitContext, get_method
from vocgraft.models import load_model
from vocgraft.plan import VocabPlan
from vocgraft.tokenization.expand import expand_tokenizer
from vocgraft.tokenization.train import train_tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
CORPUS = SHARED_CORPORA / "el" / "train.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=32768)
    parser.add_argument("--k", type=int, default=500, help="new vocabulary rows")
    parser.add_argument("--aux-vocab", type=int, default=8000, help="auxiliary tokenizer size")
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()

    model, source = load_model(args.model)
    matrix = model.get_input_embeddings().weight.detach()
    lines = read_lines(CORPUS, limit=args.lines)
    t0 = time.perf_counter()
    aux = train_tokenizer(lines, "bytelevel-bpe", args.aux_vocab, like=source)
    target = expand_tokenizer(source, aux, lines, args.k).tokenizer
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    prepare_s = time.perf_counter() - t0

    ctx = InitContext(plan, source, target, corpus=lines, aux_tokenizer=aux)
    t0 = time.perf_counter()
    rows = get_method("align")(matrix, ctx)
    total_s = time.perf_counter() - t0
    stats = ctx.resources["align_stats"]
    result = {
        "lines": len(lines),
        "new_tokens": len(plan.new_ids),
        "new_tokens_seen": stats["seen"],
        "new_tokens_with_several_tuples": stats["several_tuples"],
        "new_tokens_unseen_merge": stats["unseen_merge"],
        "new_tokens_unseen_random": stats["unseen_random"],
        "total_s": round(total_s, 3),
        "setup_s (token byte lengths)": round(stats["setup_s"], 3),
        "tokenize_s": round(stats["tokenize_s"], 3),
        "count_s": round(stats["count_s"], 3),
        "rest_s (merge fallback + sparse product)": round(
            total_s - stats["setup_s"] - stats["tokenize_s"] - stats["count_s"], 3
        ),
        "prepare_s (aux training + expansion, not Align)": round(prepare_s, 3),
        "rows_finite": bool(torch.isfinite(rows).all()),
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": torch.get_num_threads()},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "align_speed.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
