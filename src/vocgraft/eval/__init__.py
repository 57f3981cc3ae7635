"""The measuring core: tokenizer fertility, the speedup proxy, bits per byte and its uniform reference."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from vocgraft.eval import tasks as _tasks  # noqa: F401  (declares the downstream tasks in the registry)
from vocgraft.eval.bpb import bits_per_byte, uniform_bits_per_byte
from vocgraft.eval.fertility import encode_lines, fertility, speedup
from vocgraft.settings.evaluation import BATCH_SIZE, MAX_LENGTH

__all__ = ["bits_per_byte", "encode_lines", "evaluate", "fertility", "speedup", "uniform_bits_per_byte"]


def evaluate(
    model,
    tokenizer,
    lines: Sequence[str],
    *,
    baseline_tokenizer=None,
    with_bpb: bool = True,
    max_length: int = MAX_LENGTH.default,
    stride: int | None = None,
    batch_size: int = BATCH_SIZE.default,
    show_progress: bool = True,
    new_token_ids: Collection[int] | None = None,
) -> dict:
    """Everything `vocgraft eval` reports for one model on one text, as a JSON-ready dict; with ``new_token_ids``
    bits/byte also carries the teacher-forced argmax rate of the new tokens."""
    token_ids = encode_lines(tokenizer, lines)
    result = {"tokenizer": fertility(token_ids, lines)}
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None:  # a word-level or WordPiece tokenizer: text it cannot spell is scored as [UNK]
        total = sum(len(ids) for ids in token_ids)
        result["tokenizer"]["unk_share"] = sum(ids.count(unk) for ids in token_ids) / max(total, 1)
    if baseline_tokenizer is not None:
        baseline = fertility(encode_lines(baseline_tokenizer, lines), lines)
        result["baseline_tokenizer"] = baseline
        result["speedup"] = speedup(baseline["tokens_per_line_mean"], result["tokenizer"]["tokens_per_line_mean"])
    if with_bpb and model is not None:
        rows = model.get_input_embeddings().weight.shape[0]
        largest = max((max(ids) for ids in token_ids if ids), default=-1)
        if largest >= rows:  # an index error on a CPU, a device-side assert on a GPU
            raise ValueError(
                f"the tokenizer produces id {largest} but the model has only {rows} embedding rows: the tokenizer "
                "does not belong to this model (or the model was saved without rows for its new tokens)."
            )
        result["bpb"] = bits_per_byte(
            model,
            tokenizer,
            lines,
            token_ids=token_ids,
            max_length=max_length,
            stride=stride,
            batch_size=batch_size,
            show_progress=show_progress,
            new_token_ids=new_token_ids,
        )
    return result
