"""The recipe's shared parts: the method chosen once, the source opened (loaded or on its files), the new rows
initialized and grafted, the directory saved."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from vocgraft.init import INPUTS, InitContext, MethodInputError
from vocgraft.init.choice import ChosenMethod, choose
from vocgraft.plan import VocabPlan, raw_tokens
from vocgraft.recipes.editable import editable
from vocgraft.shards import ShardedModel, ShardMismatch, why_not_sharded
from vocgraft.surgery import SurgeryError

SURGERY_PATHS = ("auto", "shards", "full")
SURGERY_HELP = (
    "auto: edit the safetensors files without loading the model when the init method needs no forward pass "
    "(memory follows the embedding matrices), else load it; shards / full: force one"
)
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
    init: str | ChosenMethod,
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
    chosen = choose(init)
    if chosen.runs_model:
        why = f"init method {chosen.name!r} runs the model"
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


def choose_method(
    init: str | ChosenMethod, options: dict[str, Any] | None = None, inputs: dict[str, Any] | None = None
) -> ChosenMethod:
    """``--init`` resolved once, before any work: the method, its checked settings and the user inputs given for
    it (``{"target_plm": DIR}``). Refuses a method without an input it needs, or a user input it would ignore."""
    if isinstance(init, ChosenMethod):
        return init
    chosen = replace(choose(init, options), inputs=dict(inputs or {}))
    for name, flag in USER_INPUTS.items():
        if name in chosen.method.needs and not chosen.inputs.get(name):
            raise MethodInputError(f"init method {chosen.name!r} needs {INPUTS[name]}; pass {flag}.")
        if chosen.inputs.get(name) and name not in chosen.method.needs:
            users = sorted(m.name for m in _methods_needing(name))
            raise MethodInputError(
                f"{flag} is only read by init methods {', '.join(users)}; --init {chosen.name} would ignore it."
            )
    return chosen


def method_args(values: Mapping[str, Any], init: str | None = None) -> dict[str, dict[str, Any]]:
    """An init method's user inputs and settings by name, from parsed flags or a pipeline's ``adapt`` section, as
    the recipes take them (``method_inputs``, ``options``). Given ``init``, only those that method reads (a sweep's
    config may carry settings for its other methods); without, every one (unset: None), so that
    :func:`choose_method` refuses an input the chosen method would ignore."""
    from vocgraft.init import all_options, get_method

    if init is None:
        inputs, options = list(USER_INPUTS), list(all_options())
    else:
        method = get_method(init)
        inputs = [name for name in USER_INPUTS if name in method.needs]
        options = [option.name for option in method.options]
    return {"method_inputs": {n: values[n] for n in inputs}, "options": {n: values[n] for n in options}}


def _methods_needing(name: str):
    from vocgraft.init import METHODS

    return [m for m in METHODS.values() if name in m.needs]


def method_resources(chosen: ChosenMethod) -> dict[str, Any]:
    """The resources the method's user inputs load into (a target PLM's rows and vocabulary)."""
    resources: dict[str, Any] = {}
    for name in USER_INPUTS:
        if chosen.inputs.get(name):
            resources |= _LOADERS[name](chosen.inputs[name])
    return resources


def init_and_graft(
    model,
    plan: VocabPlan,
    source_tokenizer,
    target_tokenizer,
    init: str | ChosenMethod,
    *,
    corpus: Sequence[str] | None,
    seed: int = 0,
    resources: dict[str, Any] | None = None,
    aux_tokenizer=None,
    options: dict[str, Any] | None = None,
) -> tuple[float, dict[str, Any]]:
    """Initialize ``plan.new_ids`` with ``init`` (a name and its ``options``, or a ChosenMethod) and put the rows
    into ``model`` (in place).

    ``model``: a loaded model, or a :class:`~vocgraft.shards.ShardedModel` (rows from its matrices read one at a
    time; the graft is recorded for its save): :func:`~vocgraft.recipes.editable.editable` gives both one interface.
    Returns the initialization's wall time and the resources dict, where methods leave their statistics (e.g.
    FOCUS's fallback share). A method whose ``untie_head`` setting is on gets an untied model."""
    chosen = choose(init, options)
    target = editable(model)
    if chosen.unties_head:
        target.untie_head(chosen.name)
    ctx = InitContext(
        plan,
        source_tokenizer,
        target_tokenizer,
        corpus=corpus,
        seed=seed,
        resources=dict(resources or {}),
        aux_tokenizer=aux_tokenizer,
        options=dict(chosen.options),
    )
    start = time.perf_counter()
    input_rows, head_rows = target.new_rows(chosen, ctx)
    seconds = time.perf_counter() - start
    target.graft(plan, input_rows, head_rows, target_tokenizer)
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
    return editable(model).save(tokenizer, out_dir, overwrite=overwrite, manifest=manifest, extra_json=extra)
