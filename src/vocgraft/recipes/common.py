"""What every vocabulary recipe does once it has a plan: initialize the new rows, graft them, save the directory."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vocgraft.init import InitContext, initialize
from vocgraft.plan import VocabPlan
from vocgraft.surgery import graft, save_model_dir


def init_and_graft(
    model,
    plan: VocabPlan,
    source_tokenizer,
    target_tokenizer,
    init: str,
    *,
    corpus: Sequence[str] | None,
    seed: int = 0,
    resources: dict[str, Any] | None = None,
) -> tuple[float, dict[str, Any]]:
    """Initialize ``plan.new_ids`` with ``init`` and put the rows into ``model`` (in place).

    Returns the initialization's wall time and the resources dict, where methods leave their statistics
    (e.g. FOCUS's fallback share)."""
    ctx = InitContext(
        plan, source_tokenizer, target_tokenizer, corpus=corpus, seed=seed, resources=dict(resources or {})
    )
    start = time.perf_counter()
    input_rows, head_rows = initialize(model, init, ctx)
    seconds = time.perf_counter() - start
    graft(model, plan, input_rows, head_rows, target_tokenizer)
    return seconds, ctx.resources


def method_stats(resources: dict[str, Any]) -> dict[str, Any]:
    """The JSON-friendly statistics methods leave in the resources (keys ending in ``_stats``)."""
    return {key: value for key, value in resources.items() if key.endswith("_stats")}


def save_adapted(
    model,
    tokenizer,
    plan: VocabPlan,
    out_dir: str | Path,
    *,
    overwrite: bool,
    manifest: dict,
    extra_json: dict | None = None,
) -> Path:
    """The HF directory plus the plan (``vocgraft-plan.json``) and the manifest, written atomically."""
    extra = {"vocgraft-plan.json": plan.to_dict(), **(extra_json or {})}
    return save_model_dir(model, tokenizer, out_dir, overwrite=overwrite, manifest=manifest, extra_json=extra)
