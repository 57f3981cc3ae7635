"""The pipeline's eval stage: one model measured as a config's eval section asks, and ``eval.json``'s summary.

Tokens/line, bits/byte and its uniform reference (+ the speedup against a baseline's tokenizer, the new tokens' use
on the held-out text, and MT, tasks and generation when configured), from one load of the model. The summary's keys
are those the metric registry declares (:mod:`vocgraft.eval.registry`), so a metric registered with a summary key
reaches ``eval.json``, the pipeline's report and the sweep without an edit here.
"""

from __future__ import annotations

from pathlib import Path

from vocgraft.eval.registry import NEW_TOKENS_USED, SPEEDUP, summarize, task_names


def evaluate_model(
    model_spec: str,
    *,
    baseline: str | None,
    heldout: str,
    settings: dict,
    lang: str | None,
    device: str,
    dtype: str,
    out: Path,
) -> dict:
    """The summary of ``model_spec`` on ``heldout`` (``settings``: the config's eval section), written with the
    full result to ``<out>/eval.json``."""
    from vocgraft.eval.downstream import new_token_ids
    from vocgraft.eval.files import run_eval
    from vocgraft.models import timed_load
    from vocgraft.outdir import write_json

    loaded = timed_load(model_spec, dtype, device)
    new_ids = new_token_ids(model_spec)
    result = run_eval(
        model_spec,
        heldout,
        baseline=baseline,
        limit=settings["limit"],
        max_length=settings["max_length"],
        loaded=loaded,
        new_token_ids=new_ids,
    )
    # the "eval" group: what this stage adds to run_eval's result (a model is its own baseline: speedup 1)
    measured = {SPEEDUP.name: result.get(SPEEDUP.name, 1.0)}
    if new_ids is not None:  # the share of the new tokens the held-out text actually uses
        from vocgraft.corpus import read_lines
        from vocgraft.eval import encode_lines
        from vocgraft.eval.fertility import new_tokens_used_share

        text = read_lines(heldout, limit=settings["limit"])
        measured[NEW_TOKENS_USED.name] = new_tokens_used_share(encode_lines(loaded[1], text), new_ids)
    facts = summarize({"tokenizer": result["tokenizer"], "bpb": result["bpb"], "eval": measured})
    if settings["mt"] or settings["prompts"] or any(settings[name] for name in task_names()):
        facts["downstream"] = downstream_summary(_downstream(model_spec, heldout, settings, lang, loaded[:2]))
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "eval.json", {"summary": facts, "full": result})
    return facts


def _downstream(model_spec: str, heldout: str, settings: dict, lang: str | None, loaded: tuple) -> dict:
    from vocgraft.corpus import read_lines
    from vocgraft.eval.downstream import DownstreamSpec, evaluate_downstream
    from vocgraft.eval.generation import prompts_from_lines
    from vocgraft.eval.mt import read_pairs
    from vocgraft.eval.tasks import read_records

    prompts = settings["prompts"]
    spec = DownstreamSpec(
        lang=lang or "xx",
        prompts=prompts_from_lines(read_lines(heldout, limit=prompts)) if prompts else [],
        max_new_tokens=settings["max_new_tokens"],
        mt_pairs=read_pairs(settings["mt"]) if settings["mt"] else [],
        mt_directions=("en-xx",),
        mt_shots=settings["shots"],
        mt_limit=settings["mt_limit"],
        tasks={name: read_records(settings[name], name) for name in task_names() if settings[name]},
    )
    return evaluate_downstream(model_spec, spec, loaded=loaded)


def downstream_summary(result: dict) -> dict:
    """eval.json's summary of :func:`vocgraft.eval.downstream.evaluate_downstream`'s result: chrF per direction,
    each task's metrics and per decoding mode the speed and canonical use of the new tokens."""
    summary = {}
    for mt in result["mt"]:
        summary |= summarize({"mt": mt}, direction=mt["direction"])
    for scored in result["tasks"]:
        summary |= summarize({scored["task"]: scored})
    for generated in result["generation"]:
        summary |= summarize({"generation": generated}, mode=generated["mode"])
    return summary
