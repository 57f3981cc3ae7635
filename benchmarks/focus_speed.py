"""FOCUS speed: vocgraft's ``focus`` against the official ``deepfocus`` package on the same inputs.

Source: the packaged SmolLM2 (input embeddings). Target: a byte-level BPE of --vocab tokens trained on the first
--lines lines of the shared Greek corpus (``like`` the source tokenizer), replacement plan. Measures

The plan matches exact canonical bytes only (``fuzzy=False``), as deepfocus does by default (``exact_match_all``,
no ``match_symbols``), so that both start from the same overlap except where decoded strings collide.

* end to end: ours = plan (canonical overlap) + fastText + FOCUS; theirs = ``deepfocus.FOCUS`` trained from the
  text file (its own tokenization + fastText). fastText time is reported separately for both. Both use the same
  dim / epochs / minCount; the algorithm differs as each package chooses (ours skip-gram as in the paper,
  deepfocus CBOW with 10 negatives);
* the FOCUS step on the same fastText vectors: deepfocus reloads the model it trained (``fasttext_model_path``)
  and ours gets the same vectors (load time excluded for both). This is the ratio the speed goal is about;
* colliding tokens: target ids deepfocus copies from a different source row than the byte-exact plan (it matches
  decoded strings: partial UTF-8 tokens all read "\ufffd", whitespace tokens ""), and on the same vectors how many
  FOCUS rows agree within 1e-4 (rows whose sparsemax support touches a disputed key cannot).

Needs the test extra (deepfocus installed --no-deps, fasttext-wheel, entmax, fastdist, numba, print-on-steroids).

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/focus_speed.py [--lines 32768] [--vocab 32000]
    (a quick check: --lines 2000 --vocab 4000 --dim 50 --out /tmp/focus_speed.json)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.init import InitContext, get_method
from vocgraft.init.sparsemax import sparsemax_cosine_weights
from vocgraft.init.token_vectors import TokenVectors
from vocgraft.models import load_model
from vocgraft.plan import VocabPlan
from vocgraft.tokenization.canonical import canonical_tokens
from vocgraft.tokenization.train import train_tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
CORPUS = SHARED_CORPORA / "el" / "train.txt"


class Timed:
    """Wraps a function and adds up the seconds spent in it (to split deepfocus's fastText time from the rest)."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kw):
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kw)
        finally:
            self.seconds += time.perf_counter() - t0


def run_deepfocus(target, source, matrix, **kw) -> tuple[torch.Tensor, float, float]:
    """(rows, total seconds, seconds in loading/training fastText) for one ``deepfocus.FOCUS`` call."""
    import deepfocus.focus as df

    original = df.load_target_token_embedding
    df.load_target_token_embedding = timed = Timed(original)
    try:
        t0 = time.perf_counter()
        rows = df.FOCUS(target, source, matrix, verbosity="silent", **kw)
        return rows, time.perf_counter() - t0, timed.seconds
    finally:
        df.load_target_token_embedding = original


def deepfocus_overlap(source, target) -> dict[int, int]:
    """deepfocus's overlap with its default options: target id -> the source id it copies."""
    from deepfocus.focus import get_overlapping_tokens

    overlap, _ = get_overlapping_tokens(target, source, False, True, False)
    return {o.target.id: o.source[0].id for o in overlap.values()}


def misassigned(plan: VocabPlan, theirs: dict[int, int], target) -> tuple[dict[str, int], set[int]]:
    """Target ids whose deepfocus overlap (decoded strings) differs from the plan's (canonical bytes): counts by
    kind, and the ids."""
    forms = canonical_tokens(target)
    counts = {"total": 0, "partial_utf8": 0, "whitespace": 0, "special": 0, "other": 0}
    ids = {t for t in range(len(target)) if theirs.get(t) != plan.copied.get(t)}
    for t in sorted(ids):
        form = forms[t]
        try:
            kind = "special" if form is None else "whitespace" if form.decode("utf-8").isspace() else "other"
        except UnicodeDecodeError:
            kind = "partial_utf8"
        counts["total"] += 1
        counts[kind] += 1
    return counts, ids


def compare_with_deepfocus(
    model, source, target, lines: list[str], *, dim: int = 300, epochs: int = 3, min_count: int = 10, threads: int = 2
) -> dict:
    """Ours vs deepfocus on one source model, target tokenizer and corpus: times, misassignments, parity."""
    work = Path(tempfile.mkdtemp(prefix="focus-speed-"))
    # deepfocus caches tokenized text and fastText models under XDG_CACHE_HOME (read at import): a fresh one, so no
    # run reuses another's; datasets offline, its cache there too
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")
    os.environ["HF_DATASETS_CACHE"] = str(work / "datasets")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import fasttext

    matrix = model.get_input_embeddings().weight.detach().float()
    text_path = work / "train.txt"
    text_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    # ours, end to end
    t0 = time.perf_counter()
    plan = VocabPlan.from_tokenizers(source, target, "replace", fuzzy=False)
    plan_s = time.perf_counter() - t0
    fasttext_params = {"dim": dim, "epochs": epochs, "min_count": min_count, "threads": threads}
    ctx = InitContext(plan, source, target, corpus=lines, resources={"fasttext": fasttext_params})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        get_method("focus")(matrix, ctx)
        ours_total = time.perf_counter() - t0
    stats = ctx.resources["focus_stats"]

    # theirs, end to end (trains and caches its fastText model)
    _, their_total, their_fasttext = run_deepfocus(
        target,
        source,
        matrix,
        target_training_data_path=str(text_path),
        fasttext_model_dim=dim,
        fasttext_model_epochs=epochs,
        fasttext_model_min_count=min_count,
        processes=threads,
    )

    # the FOCUS step on the same vectors: deepfocus's own fastText model, reloaded by both
    [bin_path] = (work / "cache" / "deepfocus" / "fasttext").glob("*.bin")
    ft = fasttext.load_model(str(bin_path))
    index = target.get_vocab()
    kept = np.asarray(sorted(index[w] for w in ft.words if w in index), dtype=np.int64)
    words = {i: w for w, i in index.items()}
    same = TokenVectors(kept, np.stack([ft.get_word_vector(words[i]) for i in kept.tolist()]))
    ctx_same = InitContext(plan, source, target, resources={"token_vectors": same})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        ours_rows = get_method("focus")(matrix, ctx_same)
        ours_step = time.perf_counter() - t0
    their_rows, their_step_total, their_load = run_deepfocus(target, source, matrix, fasttext_model_path=str(bin_path))
    their_step = their_step_total - their_load

    # parity at scale, and where it cannot hold
    theirs = deepfocus_overlap(source, target)
    counts, disputed = misassigned(plan, theirs, target)
    new = np.asarray(plan.new_ids, dtype=np.int64)
    with_vec = np.flatnonzero(np.isin(new, kept))
    diff = (ours_rows[with_vec] - their_rows[new[with_vec]]).abs().amax(dim=1)
    has_vec = set(kept.tolist())
    keys = np.asarray([t for t in sorted(plan.copied) if t in has_vec], dtype=np.int64)
    pos = {t: i for i, t in enumerate(kept.tolist())}
    table = torch.from_numpy(same.vectors)
    weights = sparsemax_cosine_weights(table[[pos[t] for t in new[with_vec]]], table[[pos[t] for t in keys]])
    touched = np.zeros(len(with_vec), dtype=bool)
    rows_idx, cols_idx = weights.indices().numpy()
    touched[rows_idx[np.isin(keys[cols_idx], list(disputed))]] = True
    clean = ~touched
    # the same FOCUS on deepfocus's own overlap: must reproduce its rows everywhere (the overlap is the only
    # difference)
    their_plan = dataclasses.replace(plan, copied=dict(sorted(theirs.items())), match_kind={})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on_theirs = get_method("focus")(
            matrix, InitContext(their_plan, source, target, resources={"token_vectors": same})
        )
    their_new = np.asarray(their_plan.new_ids, dtype=np.int64)
    common = np.flatnonzero(np.isin(their_new, kept))
    diff_theirs = (on_theirs[common] - their_rows[their_new[common]]).abs().amax(dim=1)
    return {
        "lines": len(lines),
        "target_vocab": len(target),
        "new_tokens": stats["n_new"],
        "focus_stats": {k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items()},
        "fasttext": {**fasttext_params, "ours": "gensim skip-gram", "deepfocus": "fasttext cbow, neg 10"},
        "end_to_end": {
            "ours_s": round(plan_s + ours_total, 3),
            "ours_plan_s": round(plan_s, 3),
            "ours_fasttext_s": round(stats["fasttext_seconds"], 3),
            "ours_focus_s": round(ours_total - stats["fasttext_seconds"], 3),
            "deepfocus_s": round(their_total, 3),
            "deepfocus_fasttext_s (tokenize + train)": round(their_fasttext, 3),
            "deepfocus_focus_s": round(their_total - their_fasttext, 3),
            "ratio_ours_over_deepfocus": round((plan_s + ours_total) / their_total, 3),
        },
        "focus_step_same_vectors": {
            "ours_s": round(ours_step, 3),
            "ours_with_plan_s": round(ours_step + plan_s, 3),
            "deepfocus_s": round(their_step, 3),
            "ratio_ours_over_deepfocus": round(ours_step / their_step, 4),
            "ratio_with_plan": round((ours_step + plan_s) / their_step, 4),
        },
        "deepfocus_misassigned_tokens": counts,
        "parity_same_vectors": {
            "rows_compared": int(len(with_vec)),
            "rows_within_1e-4": int((diff <= 1e-4).sum()),
            "rows_touching_disputed_keys": int(touched.sum()),
            "max_abs_diff_other_rows": float(diff[torch.from_numpy(clean)].max()) if clean.any() else None,
            "with_deepfocus_overlap": {
                "rows_compared": int(len(common)),
                "max_abs_diff": float(diff_theirs.max()) if len(common) else None,
            },
        },
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=32768)
    parser.add_argument("--vocab", type=int, default=32000, help="target tokenizer size")
    parser.add_argument("--dim", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--min-count", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--out", default=str(RESULTS / "focus_speed.json"))
    args = parser.parse_args()

    model, source = load_model(args.model)
    lines = read_lines(CORPUS, limit=args.lines)
    target = train_tokenizer(lines, "bytelevel-bpe", args.vocab, like=source)
    result = compare_with_deepfocus(
        model, source, target, lines, dim=args.dim, epochs=args.epochs, min_count=args.min_count, threads=args.threads
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
