"""What every vocabulary recipe does once it has a plan: initialize the new rows, graft them, save the directory."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vocgraft.init import (
    INPUTS,
    InitContext,
    MethodInputError,
    get_method,
    initialize,
    initialize_matrices,
    method_options,
)
from vocgraft.plan import VocabPlan, raw_tokens
from vocgraft.shards import ShardedModel, ShardMismatch, why_not_sharded
from vocgraft.surgery import SurgeryError, graft, save_model_dir, untie_head

SURGERY_PATHS = ("auto", "shards", "full")
SURGERY_HELP = (
    "auto: edit the safetensors files without loading the model when the init method needs no forward pass "
    "(memory follows the embedding matrices), else load it; shards / full: force one"
)
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


def open_source(
    model_spec: str,
    init: str,
    *,
    dtype: str = "auto",
    device: str = "auto",
    surgery: str = "auto",
    tokenizer=None,
) -> tuple[Any, Any, dict[str, Any]]:
    """The source model for expand/replace: (model, tokenizer, facts for the manifest).

    The model is a :class:`~vocgraft.shards.ShardedModel` (only the embedding matrices are ever read) when the init
    method needs no forward pass and the source is a local safetensors directory whose tensors match the model's;
    otherwise the model loaded whole in ``dtype`` on ``device``. ``surgery`` forces a path ("shards" refuses
    when it cannot be taken)."""
    from vocgraft.checkpoint import ModelLoadError
    from vocgraft.devices import resolve_device
    from vocgraft.models import check_tokenizer_fits, load_model, load_tokenizer, resolve

    if surgery not in SURGERY_PATHS:
        raise SurgeryError(f"--surgery {surgery!r}: choose one of {', '.join(SURGERY_PATHS)}.")
    resolve_device(device)  # a device that is not there is an error whichever path runs
    where = resolve(model_spec)
    if "model" in get_method(init).needs:
        why = f"init method {init!r} runs the model"
    else:
        why = why_not_sharded(where)
    if why is None and surgery != "full":
        try:
            source = ShardedModel.open(where, dtype)
        except ShardMismatch as exc:
            why = str(exc)
        except OSError as exc:
            raise ModelLoadError(f"could not read model {model_spec!r}: {exc}") from exc
        else:
            source.check_fits()
            tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_spec)
            check_tokenizer_fits(tokenizer, source.get_input_embeddings().weight.shape[0], model_spec)
            return source, tokenizer, {"path": "shards", "dtype": _dtype_of(source), "device": "cpu"}
    if surgery == "shards":
        raise SurgeryError(f"--surgery shards: cannot edit {model_spec} file by file: {why}; use --surgery auto.")
    why = "--surgery full" if surgery == "full" else why
    hint = f"expand/replace read only the embedding matrices when they can edit the files ({why})"
    model, tokenizer = load_model(model_spec, dtype, device, tokenizer=tokenizer, hint=hint)
    device_name = str(model.get_input_embeddings().weight.device)
    return model, tokenizer, {"path": "full-load", "why": why, "dtype": _dtype_of(model), "device": device_name}


def _dtype_of(model) -> str:
    return str(model.get_input_embeddings().weight.dtype).removeprefix("torch.")


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

    ``model``: a loaded model, or a :class:`~vocgraft.shards.ShardedModel` (rows from its matrices read one at a
    time; the graft is recorded for its save). Returns the initialization's wall time and the resources dict,
    where methods leave their statistics (e.g. FOCUS's fallback share). A method whose ``untie_head`` setting is
    on gets an untied model (:data:`UNTIE_HEAD`)."""
    options = method_options(init, options)
    if options.get(UNTIE_HEAD):
        if isinstance(model, ShardedModel):  # the shard path rewrites the matrices the source has, no new head
            raise SurgeryError(f"init method {init!r} unties the head, which needs the model loaded: --surgery full.")
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
    if isinstance(model, ShardedModel):
        head = None if model.tied else model.matrix_reader("head")
        input_rows, head_rows = initialize_matrices(init, ctx, model.matrix_reader("input"), head)
        seconds = time.perf_counter() - start
        model.graft(plan, input_rows, head_rows, target_tokenizer)
    else:
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
    """The HF directory plus the plan (``vocgraft-plan.json``) and the manifest, written atomically (a
    :class:`~vocgraft.shards.ShardedModel` writes its files itself)."""
    extra = {"vocgraft-plan.json": plan.to_dict(), **(extra_json or {})}
    if isinstance(model, ShardedModel):
        return save_model_dir(
            model.skeleton,
            tokenizer,
            out_dir,
            overwrite=overwrite,
            manifest=manifest,
            extra_json=extra,
            write_weights=model.weight_writer(),
        )
    return save_model_dir(model, tokenizer, out_dir, overwrite=overwrite, manifest=manifest, extra_json=extra)
