"""What every vocabulary recipe does once it has a plan: initialize the new rows, graft them, save the directory."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vocgraft.init import INPUTS, InitContext, MethodInputError, get_method, initialize, method_options
from vocgraft.plan import VocabPlan, raw_tokens
from vocgraft.surgery import graft, save_model_dir, untie_head

# a method setting the recipe reads itself: a method that declares it may ask for a model with its own LM head
# (a tied model is untied before the init stage, so the method is called once per space and the output is untied)
UNTIE_HEAD = "untie_head"

# method inputs that the user names by a path: the command-line flag and the pipeline key (``adapt.<key>``)
USER_INPUTS = {"target_plm": "--target-plm"}


def target_plm_resources(spec: str) -> dict[str, Any]:
    """A target-language PLM's input embeddings and vocabulary, as SALT reads them."""
    from vocgraft.models import load_model

    plm, plm_tokenizer = load_model(spec)
    return {
        "target_embeddings": plm.get_input_embeddings().weight.detach().float(),
        "target_plm_tokenizer_size": len(plm_tokenizer),
        "target_plm_tokens": raw_tokens(plm_tokenizer),  # rows are matched to target tokens by their strings
    }


_LOADERS = {"target_plm": target_plm_resources}


def check_method_inputs(init: str, given: dict[str, Any]) -> None:
    """Refuse, before any work, a method without an input it needs or a user input it would ignore."""
    method = get_method(init)
    for name, flag in USER_INPUTS.items():
        if name in method.needs and not given.get(name):
            raise MethodInputError(f"init method {init!r} needs {INPUTS[name]}; pass {flag}.")
        if given.get(name) and name not in method.needs:
            users = sorted(m.name for m in _methods_needing(name))
            raise MethodInputError(
                f"{flag} is only read by init methods {', '.join(users)}; --init {init} would ignore it."
            )


def _methods_needing(name: str):
    from vocgraft.init import METHODS

    return [m for m in METHODS.values() if name in m.needs]


def method_resources(init: str, given: dict[str, Any]) -> dict[str, Any]:
    """The resources the method's user inputs load into (after :func:`check_method_inputs`)."""
    check_method_inputs(init, given)
    resources: dict[str, Any] = {}
    for name in USER_INPUTS:
        if given.get(name):
            resources |= _LOADERS[name](given[name])
    return resources


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
    aux_tokenizer=None,
    options: dict[str, Any] | None = None,
) -> tuple[float, dict[str, Any]]:
    """Initialize ``plan.new_ids`` with ``init`` and put the rows into ``model`` (in place).

    Returns the initialization's wall time and the resources dict, where methods leave their statistics
    (e.g. FOCUS's fallback share). A method whose ``untie_head`` setting is on gets an untied model
    (:data:`UNTIE_HEAD`)."""
    options = method_options(init, options)
    if options.get(UNTIE_HEAD):
        untie_head(model)
    ctx = InitContext(
        plan,
        source_tokenizer,
        target_tokenizer,
        corpus=corpus,
        seed=seed,
        resources=dict(resources or {}),
        aux_tokenizer=aux_tokenizer,
        options=dict(options or {}),
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
