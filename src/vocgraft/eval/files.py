"""`vocgraft eval` on files: read the text, load the model, evaluate (the CLI and the pipeline both call it)."""

from __future__ import annotations

from collections.abc import Collection

from vocgraft.outdir import nonfinite_paths
from vocgraft.settings.evaluation import BATCH_SIZE, MAX_LENGTH

# a larger share of unknown tokens makes bits/byte say little about the model: it scores [UNK]s, not the text
UNK_WARN_SHARE = 0.05


def result_warnings(result: dict, text: str) -> list[str]:
    """Why an eval result is useless though it finished: text the tokenizer maps to its unknown token, numbers
    that are not finite (written as null in JSON)."""
    out = []
    share = result.get("tokenizer", {}).get("unk_share")
    if share is not None and share > UNK_WARN_SHARE:
        out.append(
            f"{share:.1%} of the tokens of {text} are the unknown token: the tokenizer cannot spell this text, so "
            "bits/byte and token counts say little; use a tokenizer with byte fallback or text it covers."
        )
    bad = nonfinite_paths(result)
    if bad:
        out.append(
            f"{', '.join(bad)}: not finite numbers (the model's outputs overflowed or are NaN); the JSON holds null "
            "for them."
        )
    return out


def run_eval(
    model_spec: str,
    text: str,
    *,
    baseline: str | None,
    limit: int | None,
    with_bpb: bool = True,
    max_length: int = MAX_LENGTH.default,
    batch_size: int = BATCH_SIZE.default,
    field: str = "text",
    dtype: str = "auto",
    device: str = "auto",
    loaded: tuple | None = None,
    new_token_ids: Collection[int] | None = None,
) -> dict:
    """``vocgraft eval`` on one model: loaded in ``dtype`` on ``device``, or given as ``loaded`` = (model,
    tokenizer, load seconds) by a caller that measures more with the same model (the pipeline); ``new_token_ids``:
    see :func:`vocgraft.eval.evaluate`."""
    from vocgraft.corpus import read_lines
    from vocgraft.eval import evaluate
    from vocgraft.models import describe, load_tokenizer, timed_load

    lines = read_lines(text, limit=limit, field=field)
    model, tokenizer, load_seconds = loaded if loaded is not None else timed_load(model_spec, dtype, device)
    baseline_tokenizer = load_tokenizer(baseline) if baseline else None
    result = evaluate(
        model,
        tokenizer,
        lines,
        baseline_tokenizer=baseline_tokenizer,
        with_bpb=with_bpb,
        max_length=max_length,
        batch_size=batch_size,
        new_token_ids=new_token_ids,
    )
    return {
        "model": model_spec,
        "text": str(text),
        "limit": limit,
        "baseline_tokenizer_spec": baseline,
        "model_info": describe(model, tokenizer).to_dict(),
        "load_seconds": load_seconds,
        **result,
    }


def eval_markdown(result: dict, name: str = "model") -> str:
    """The `vocgraft eval` result as a two-column table (metric, value): the metrics of the held-out text that
    the result holds (a baseline's speedup, bits/byte), named and rounded as the metric registry declares them."""
    from vocgraft.eval import registry as r
    from vocgraft.report import fmt, markdown_table

    rows = [r.LINES, r.TOKENS_PER_LINE, r.TOKENS_PER_LINE_MEDIAN, r.CHARS_PER_TOKEN, r.BYTES_PER_TOKEN]
    if r.SPEEDUP.name in result:
        rows += [r.BASELINE_TOKENS_PER_LINE, r.SPEEDUP]
    if "bpb" in result:
        rows += [r.BITS_PER_BYTE, r.UNIFORM_BITS_PER_BYTE, r.PERPLEXITY, r.TOKENS_SCORED, r.EVAL_THROUGHPUT]
    found = {"eval": result, **result}  # a group's result: result[group]; the "eval" group is the result itself
    # each value with its metric's decimals (a median of counts can be an int: a figure all the same)
    values = [found[m.group][m.name] for m in rows]
    cells = [[m.row_label, fmt(float(v), m.digits) if m.digits and v is not None else v] for m, v in zip(rows, values)]
    return markdown_table(["metric", name], cells, right=[False, True])
