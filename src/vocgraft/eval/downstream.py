"""`vocgraft downstream`: generation speed, MT chrF and task scores for a model and (optionally) its source, in one
run so that speeds are compared on the same machine state."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class DownstreamSpec:
    lang: str
    prompts: list[str] = field(default_factory=list)  # generation-speed prompts
    max_new_tokens: int = 64
    mt_pairs: list[tuple[str, str]] = field(default_factory=list)
    mt_directions: tuple[str, ...] = ("en-xx", "xx-en")
    mt_shots: int = 3
    mt_limit: int = 50
    mt_template: str | None = None
    # in tokens: generous, because an English-centric tokenizer spends about one token per byte on Greek
    mt_max_new_tokens: int = 256
    tasks: dict[str, list[dict]] = field(default_factory=dict)  # task -> records
    templates: dict | None = None
    seed: int = 0


GENERATION_LEGEND = (
    "new emitted: share of generated tokens that are new; new canonical: share of new tokens when the same text is "
    "re-encoded with the tokenizer; canonical rate: new tokens emitted / new tokens in that canonical encoding; "
    "matched: canonical new tokens emitted as exactly that token; non-canonical: new tokens emitted where the "
    "canonical encoding has none; new in prompts: share of new tokens in the prompts (held-out text), context only."
)


def new_token_ids(model_dir: str) -> set[int] | None:
    """The plan's new ids when ``model_dir`` is a vocgraft output (``vocgraft-plan.json``), else None."""
    from vocgraft.plan import VocabPlan

    plan_file = Path(model_dir) / "vocgraft-plan.json"
    return set(VocabPlan.from_json(plan_file).new_ids) if plan_file.is_file() else None


def context_length(config) -> int | None:
    """The positions the model was trained on (Llama & co.: max_position_embeddings, GPT-2: n_positions)."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_generation_budget(model, spec: DownstreamSpec, model_spec: str) -> None:
    """A token budget past the model's context is refused before generating: `--max-new-tokens 1000000` ran for
    hours past what the model can attend to."""
    from vocgraft.parsing import ArgumentError

    context = context_length(model.config)
    budgets = {"--max-new-tokens": (spec.max_new_tokens, spec.prompts)}
    budgets["--mt-max-new-tokens"] = (spec.mt_max_new_tokens, spec.mt_pairs)
    for flag, (budget, used) in budgets.items():
        if used and context is not None and budget > context:
            raise ArgumentError(
                f"{flag} {budget} is more than the {context} positions of {model_spec}'s context; give at most "
                f"{context}."
            )


def evaluate_downstream(
    model_spec: str, spec: DownstreamSpec, *, dtype: str = "auto", device: str = "auto", loaded: tuple | None = None
) -> dict:
    """Generation speed, MT and tasks of one model, loaded in ``dtype`` on ``device`` (or given as ``loaded`` =
    (model, tokenizer) by a caller that already has it)."""
    from vocgraft.eval.generation import generation_speed
    from vocgraft.eval.mt import DEFAULT_TEMPLATE, translate_and_score
    from vocgraft.eval.tasks import RUNNERS
    from vocgraft.models import load_model

    model, tokenizer = loaded if loaded is not None else load_model(model_spec, dtype, device)
    model.eval()
    check_generation_budget(model, spec, model_spec)
    result: dict = {"model": model_spec, "generation": [], "mt": [], "tasks": []}
    if spec.prompts:
        new_ids = new_token_ids(model_spec)
        for sampled in (False, True):
            result["generation"].append(
                generation_speed(
                    model,
                    tokenizer,
                    spec.prompts,
                    sampled=sampled,
                    max_new_tokens=spec.max_new_tokens,
                    new_token_ids=new_ids,
                    seed=spec.seed,
                )
            )
    for direction in spec.mt_directions if spec.mt_pairs else ():
        result["mt"].append(
            translate_and_score(
                model,
                tokenizer,
                spec.mt_pairs,
                spec.lang,
                direction=direction,
                shots=spec.mt_shots,
                limit=spec.mt_limit,
                template=spec.mt_template or DEFAULT_TEMPLATE,
                max_new_tokens=spec.mt_max_new_tokens,
            )
        )
    for task, records in spec.tasks.items():
        result["tasks"].append(RUNNERS[task](model, tokenizer, records, spec.lang, spec.templates))
    return result


def markdown_summary(results: list[dict]) -> str:
    """One table per measurement, a row per model."""
    from vocgraft.report import markdown_table

    parts = []
    generation = [(r["model"], g) for r in results for g in r["generation"]]
    if generation:
        keys = ["tokens_per_second", "chars_per_second", "chars_per_token", "new_emitted_share"]
        keys += ["new_canonical_share", "canonical_rate", "canonical_matched", "noncanonical_new", "prompt_new_share"]
        rows = [[m, g["mode"], *(g.get(k) for k in keys)] for m, g in generation]
        header = ["model", "decoding", "tokens/s", "chars/s", "chars/token", "new emitted", "new canonical"]
        header += ["canonical rate", "matched", "non-canonical", "new in prompts"]
        parts.append(markdown_table(header, [[c if c is not None else "–" for c in row] for row in rows]))
        parts.append(GENERATION_LEGEND)
    mt = [(r["model"], x) for r in results for x in r["mt"]]
    if mt:
        rows = [[m, x["direction"], x["pairs"], x["chrf"]] for m, x in mt]
        parts.append(markdown_table(["model", "direction", "pairs", "chrF"], rows))
    tasks = [(r["model"], t) for r in results for t in r["tasks"]]
    if tasks:
        from vocgraft.eval.tasks import METRICS

        rows = [[m, t["task"], t["records"], metric, t[metric]] for m, t in tasks for metric in METRICS[t["task"]]]
        parts.append(markdown_table(["model", "task", "records", "metric", "score"], rows))
        nli = [t for _, t in tasks if t["task"] == "nli"]
        if nli:  # what the two NLI metrics are
            parts.append("\n".join(f"- nli {name}: {text}" for name, text in nli[0]["scores"].items()))
    return "\n\n".join(parts)
