"""`vocgraft downstream`: generation speed, MT chrF and task scores for a model and (optionally) its source, in one
run so that speeds are compared on the same machine state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vocgraft.eval.registry import CHRF, TOKENS_PER_SECOND, legend, metrics_of, task
from vocgraft.settings.evaluation import MAX_NEW_TOKENS, MT_DIRECTIONS, MT_LIMIT, MT_MAX_NEW_TOKENS, SHOTS


@dataclass
class DownstreamSpec:
    lang: str
    prompts: list[str] = field(default_factory=list)  # generation-speed prompts
    max_new_tokens: int = MAX_NEW_TOKENS.default
    mt_pairs: list[tuple[str, str]] = field(default_factory=list)
    mt_directions: tuple[str, ...] = tuple(MT_DIRECTIONS.default)
    mt_shots: int = SHOTS.default
    mt_limit: int = MT_LIMIT.default
    mt_template: str | None = None
    # in tokens: generous, because an English-centric tokenizer spends about one token per byte on Greek
    mt_max_new_tokens: int = MT_MAX_NEW_TOKENS.default
    tasks: dict[str, list[dict]] = field(default_factory=dict)  # task -> records
    templates: dict | None = None
    seed: int = 0

    def warning(self) -> str | None:
        """MT prompts name the target language; a code with no known name is asked for as the code itself."""
        from vocgraft.eval.mt import LANGUAGE_NAMES

        if not self.mt_pairs or self.lang in LANGUAGE_NAMES:
            return None
        return (
            f"--lang {self.lang}: no name known for this language code, so the MT prompts ask to translate to "
            f"'{self.lang}', which a model may not understand; the known codes are {', '.join(LANGUAGE_NAMES)}."
        )


def read_spec(
    lang: str,
    *,
    prompts: str | None = None,
    num_prompts: int | None = None,
    mt: str | None = None,
    tasks: Sequence[str] = (),
    templates: dict | None = None,
    **settings,
) -> DownstreamSpec:
    """`vocgraft downstream`'s inputs read from their files: generation prompts from the first ``num_prompts``
    lines of ``prompts``, the MT pairs of ``mt``, the records of each ``TASK=FILE`` of ``tasks``; ``settings``: the
    spec's other fields (max_new_tokens, mt_directions, mt_shots, ...)."""
    from vocgraft.corpus import CorpusError, read_lines
    from vocgraft.eval.generation import prompts_from_lines
    from vocgraft.eval.mt import read_pairs
    from vocgraft.eval.tasks import read_records

    records = {}
    for item in tasks:
        task, _, path = item.partition("=")
        if not path:
            raise CorpusError(f"--task {item!r}: expected TASK=FILE, e.g. nli=xnli-el.jsonl.")
        records[task] = read_records(path, task)
    return DownstreamSpec(
        lang=lang,
        prompts=prompts_from_lines(read_lines(prompts, limit=num_prompts)) if prompts else [],
        mt_pairs=read_pairs(mt) if mt else [],
        tasks=records,
        templates=templates,
        **settings,
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
    for name, records in spec.tasks.items():
        result["tasks"].append(task(name).runner(model, tokenizer, records, spec.lang, spec.templates))
    return result


def markdown_summary(results: list[dict]) -> str:
    """One table per measurement, a row per model."""
    from vocgraft.report import markdown_table

    parts = []
    generation = [(r["model"], g) for r in results for g in r["generation"]]
    if generation:
        columns = sorted(metrics_of("generation"), key=lambda m: m is not TOKENS_PER_SECOND)  # speed, tokens/s first
        rows = [[m, g["mode"], *(g.get(c.name) for c in columns)] for m, g in generation]
        header = ["model", "decoding", *(c.label for c in columns)]
        digits = [3, 3, *(c.digits for c in columns)]
        parts.append(markdown_table(header, [[c if c is not None else "–" for c in row] for row in rows], digits))
        parts.append(legend(c for c in columns if c.description) + ".")
    mt = [(r["model"], x) for r in results for x in r["mt"]]
    if mt:
        rows = [[m, x["direction"], x["pairs"], x[CHRF.name]] for m, x in mt]
        parts.append(markdown_table(["model", "direction", "pairs", CHRF.label], rows, [3, 3, 3, CHRF.digits]))
    tasks = [(r["model"], t) for r in results for t in r["tasks"]]
    if tasks:
        rows = [
            [m, t["task"], t["records"], metric.label, t[metric.name]]
            for m, t in tasks
            for metric in task(t["task"]).metrics
        ]
        parts.append(markdown_table(["model", "task", "records", "metric", "score"], rows))
        explained = next((t for _, t in tasks if "scores" in t), None)
        if explained:  # what a task's several metrics are (NLI's two)
            lines = [f"- {explained['task']} {name}: {text}" for name, text in explained["scores"].items()]
            parts.append("\n".join(lines))
    return "\n\n".join(parts)
