"""`vocgraft demo`: the main job on the embedded defaults. A small sweep (:mod:`vocgraft.pipeline.sweep`) of k
target-language tokens x init methods over the shared corpora of one language, with its report and recommendation."""

from __future__ import annotations

import sys
from pathlib import Path

from vocgraft.corpus import SHARED_CORPORA


def demo_config(
    model: str, lang: str, init: str, *, sample: int, aux_vocab_size: int, limit: int, out: str, device: str, dtype: str
) -> dict:
    """The demo's pipeline config (before validation): expansion on ``lang``'s shared corpus, measured on its
    held-out text; ``init``: the comma-separated methods the sweep compares."""
    corpora = SHARED_CORPORA / lang
    return {
        "model": model,
        "corpus": str(corpora / "train.txt"),
        "heldout": str(corpora / "heldout.txt"),
        "lang": lang,
        "out": out,
        "sample": sample,
        # English training text: the new merges must not change how the source language tokenizes
        "adapt": {"mode": "expand", "aux_vocab_size": aux_vocab_size}
        # distill as the end-to-end grid ran it (every pair merged): the only init whose new tokens are generated
        | ({"distill_merge": "all"} if "distill" in init.split(",") else {})
        | ({"protect": str(SHARED_CORPORA / "en" / "train.txt")} if lang != "en" else {}),
        "eval": {"limit": limit},
        "device": device,
        "dtype": dtype,
    }


def run_demo(model: str, lang: str, k: str, init: str, **settings) -> tuple[dict, Path]:
    """Say what the demo runs (on stderr), then run the sweep over ``k`` (comma-separated counts) x ``init`` and
    write its report; returns (the sweep, report.md). ``settings``: :func:`demo_config`'s."""
    from vocgraft.parsing import parse_ints
    from vocgraft.pipeline.config import validate
    from vocgraft.pipeline.sweep import run_sweep, write_report

    raw = demo_config(model, lang, init, **settings)
    print(
        f"vocgraft demo: {model} + k in {k} {lang} tokens x init in {init}, trained on "
        f"{raw['sample']} lines of {raw['corpus']}, measured on the first {raw['eval']['limit']} lines of "
        f"{raw['heldout']}",
        file=sys.stderr,
    )
    config = validate(raw, "the demo's settings")
    sweep = run_sweep(config, parse_ints(k, "k"), init.split(","))
    return sweep, write_report(sweep, raw["out"])
