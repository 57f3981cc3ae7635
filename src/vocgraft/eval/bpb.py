"""Bits per UTF-8 byte: the quality measure that is comparable across vocabularies.

Every line is scored as its own document: a prefix token (BOS by default) followed by the line's tokens; every token of
the line is predicted and scored exactly once, the prefix never is. bits/byte = sum of token NLLs (nats) / ln 2 /
UTF-8 bytes of the lines. Documents longer than ``max_length`` are split into windows that overlap by
``max_length - stride`` tokens of context; only the tokens new to a window are scored. Windows are sorted by length and
packed into batches under a token budget, so almost no compute is spent on padding, and logits are only turned into
losses at scored positions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from vocgraft.eval.argmax import NewTokenArgmax, first_pieces
from vocgraft.progress import progress
from vocgraft.settings.evaluation import BATCH_SIZE, MAX_LENGTH


@dataclass(frozen=True)
class Window:
    input_ids: list[int]
    labels: list[int]  # labels[j] is the token after input_ids[j]
    n_scored: int  # only the last n_scored labels are scored
    doc: int = 0  # the document (line) it scores part of: per-line sums add up its windows


def make_windows(ids: Sequence[int], prefix_id: int, max_length: int, stride: int, doc: int = 0) -> list[Window]:
    """Split ``[prefix] + ids`` into windows of at most ``max_length`` inputs scoring each token once; each window
    carries ``doc``."""
    if not 0 < stride <= max_length:
        raise ValueError(f"stride must be in 1..max_length ({max_length}), got {stride}")
    seq = [prefix_id, *ids]
    n = len(ids)
    windows = []
    begin = 1  # position in seq of the first label this window scores
    while begin <= n:
        end = min(begin + (max_length if begin == 1 else stride), n + 1)
        start = max(0, end - 1 - max_length)
        windows.append(Window(seq[start : end - 1], seq[start + 1 : end], end - begin, doc))
        begin = end
    return windows


def batches_by_budget(
    windows: list[Window], max_tokens: int, max_padding: float = 0.1, context_width: int = 0
) -> list[list[Window]]:
    """Longest first; a batch holds as many windows as fit in ``max_tokens`` padded tokens, and only windows at least
    ``1 - max_padding`` times as long as its longest, so no row is mostly padding (short-line corpora would otherwise
    spend most of the compute on pads). ``context_width``: tokens of a cached shared prefix every row also holds."""
    ordered = sorted(windows, key=lambda w: len(w.input_ids), reverse=True)
    batches, current = [], []
    for window in ordered:
        width = len(current[0].input_ids) if current else len(window.input_ids)
        too_many = (len(current) + 1) * (width + context_width) > max_tokens
        too_short = len(window.input_ids) < (1 - max_padding) * width
        if current and (too_many or too_short):
            batches.append(current)
            current = []
        current.append(window)
    if current:
        batches.append(current)
    return batches


def default_prefix_id(tokenizer) -> int:
    for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return token_id
    from vocgraft.checkpoint import ModelLoadError  # the user's model, not a bug: one line, exit 2

    raise ModelLoadError(
        "the model's tokenizer has neither a BOS nor an EOS token, and bits/byte starts every line with one; set "
        "bos_token or eos_token in its tokenizer_config.json, or measure token counts only (--no-bpb)."
    )


def collate(batch: list[Window], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = len(batch[0].input_ids)
    input_ids = torch.zeros(len(batch), width, dtype=torch.long)
    attention = torch.zeros(len(batch), width, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, window in enumerate(batch):
        length = len(window.input_ids)
        input_ids[row, :length] = torch.tensor(window.input_ids)
        attention[row, :length] = 1
        labels[row, length - window.n_scored : length] = torch.tensor(window.labels[-window.n_scored :])
    return input_ids.to(device), attention.to(device), labels.to(device)


@torch.inference_mode()
def score_windows(
    model,
    windows: list[Window],
    max_tokens: int,
    show_progress: bool = True,
    argmax: NewTokenArgmax | None = None,
    per_doc: list[float] | None = None,
    forward=None,
    context_width: int = 0,
) -> tuple[float, int, int, int]:
    """Sum of NLL (nats) over scored labels; numbers of scored labels, of non-pad inputs and of inputs with pads.
    ``argmax`` counts the argmax at new-token labels from the same logits; ``per_doc[w.doc]`` (a list as long as
    the documents) gets each window's NLL added. ``forward(input_ids, attention_mask) -> logits`` replaces the
    plain model call (e.g. one that reuses a cached prefix of ``context_width`` tokens)."""
    device = next(model.parameters()).device
    total_nll, scored, forward_tokens, padded_tokens = 0.0, 0, 0, 0
    batches = batches_by_budget(windows, max_tokens, context_width=context_width)
    if forward is None:
        forward = lambda ids, mask: model(input_ids=ids, attention_mask=mask).logits  # noqa: E731
    bar = progress(total=sum(w.n_scored for w in windows), desc="bits/byte", unit="tok", disable=not show_progress)
    for batch in batches:
        input_ids, attention, labels = collate(batch, device)
        hidden_logits = forward(input_ids, attention)
        mask = labels != -100
        scored_logits, scored_labels = hidden_logits[mask], labels[mask]
        token_nll = F.cross_entropy(scored_logits.float(), scored_labels, reduction="none")
        total_nll += token_nll.sum().item()
        if per_doc is not None:  # mask is row-major, so its nonzero rows say which window each scored label is in
            rows = mask.nonzero()[:, 0]
            row_nll = torch.zeros(len(batch), dtype=torch.float64, device=token_nll.device)
            row_nll.index_add_(0, rows, token_nll.double())
            for window, value in zip(batch, row_nll.tolist()):
                per_doc[window.doc] += value
        if argmax is not None:
            argmax.update(scored_logits, scored_labels)
        n = int(mask.sum())
        scored += n
        forward_tokens += int(attention.sum())
        padded_tokens += attention.numel()
        bar.update(n)
    bar.close()
    return total_nll, scored, forward_tokens, padded_tokens


def bits_per_byte(
    model,
    tokenizer,
    lines: Sequence[str],
    *,
    token_ids: Sequence[Sequence[int]] | None = None,
    max_length: int = MAX_LENGTH.default,
    stride: int | None = None,
    batch_size: int = BATCH_SIZE.default,
    prefix_id: int | None = None,
    show_progress: bool = True,
    new_token_ids: Collection[int] | None = None,
    first_piece: Mapping[int, int] | None = None,
    per_line: bool = False,
) -> dict:
    """Bits per UTF-8 byte, per-token perplexity and the uniform reference of ``model`` on ``lines``.

    With ``per_line`` also ``bits_per_line`` and ``bytes_per_line`` (one number per line, in the order of
    ``lines``; their sums give ``bits_per_byte``): the units of a bootstrap interval
    (:func:`bits_per_byte_interval`, :func:`paired_bits_per_byte_difference`).

    With ``new_token_ids`` also the teacher-forced argmax rate of the new tokens from the same logits
    (:class:`vocgraft.eval.argmax.NewTokenArgmax`: ``argmax_new_positions``, ``argmax_new_share``,
    ``argmax_first_piece_share``); ``first_piece`` (new id -> first piece) defaults to
    :func:`vocgraft.eval.argmax.first_pieces` of ``tokenizer`` (none for a tokenizer that is not BPE)."""
    if token_ids is None:
        token_ids = tokenizer(list(lines), add_special_tokens=False)["input_ids"]
    prefix_id = default_prefix_id(tokenizer) if prefix_id is None else prefix_id
    stride = stride or max_length // 2
    windows = [w for doc, ids in enumerate(token_ids) for w in make_windows(ids, prefix_id, max_length, stride, doc)]
    start = time.perf_counter()
    argmax = None
    if new_token_ids is not None:
        if first_piece is None:
            try:
                first_piece = first_pieces(tokenizer, new_token_ids)
            except ValueError:  # not BPE: no first pieces, the new-token share alone
                first_piece = None
        argmax = NewTokenArgmax(new_token_ids, first_piece)
    per_doc = [0.0] * len(token_ids) if per_line else None
    nll, scored, forward_tokens, padded_tokens = score_windows(
        model, windows, batch_size * max_length, show_progress, argmax, per_doc
    )
    seconds = time.perf_counter() - start
    nbytes = sum(len(line.encode("utf-8")) for line in lines)
    vocab = len(tokenizer)
    lines_part = {}
    if per_doc is not None:
        lines_part = {
            "bits_per_line": [value / math.log(2) for value in per_doc],
            "bytes_per_line": [len(line.encode("utf-8")) for line in lines],
        }
    return {
        "bits_per_byte": nll / math.log(2) / nbytes,
        "perplexity": math.exp(nll / scored),
        "uniform_bits_per_byte": uniform_bits_per_byte(scored, vocab, nbytes),
        "nll_nats": nll,
        "tokens_scored": scored,
        "bytes": nbytes,
        "vocab_size": vocab,
        "prefix_token": tokenizer.convert_ids_to_tokens(prefix_id),
        "max_length": max_length,
        "stride": stride,
        "seconds": seconds,
        "forward_tokens": forward_tokens,
        "padding_share": 1 - forward_tokens / padded_tokens if padded_tokens else 0.0,
        "forward_tokens_per_second": forward_tokens / seconds if seconds else float("nan"),
        **(argmax.summary() if argmax is not None else {}),
        **lines_part,
    }


def bits_per_byte_interval(result: Mapping, **bootstrap) -> dict:
    """The bootstrap interval over lines of a :func:`bits_per_byte` result made with ``per_line=True``
    (``bootstrap``: ``resamples``, ``confidence``, ``seed`` of :func:`vocgraft.eval.bootstrap.bootstrap_interval`,
    whose keys it returns)."""
    from vocgraft.eval.bootstrap import bootstrap_interval

    return bootstrap_interval(result["bits_per_line"], result["bytes_per_line"], **bootstrap)


def paired_bits_per_byte_difference(a: Mapping, b: Mapping, **bootstrap) -> dict:
    """Bits/byte of ``a`` minus that of ``b`` (two ``per_line=True`` results on the same lines: negative = ``a``
    is better), with the paired bootstrap interval over lines."""
    from vocgraft.eval.bootstrap import bootstrap_interval

    if a["bytes_per_line"] != b["bytes_per_line"]:
        raise ValueError("a paired difference needs both results on the same lines; their bytes per line differ.")
    return bootstrap_interval(
        a["bits_per_line"], a["bytes_per_line"], minus=(b["bits_per_line"], b["bytes_per_line"]), **bootstrap
    )


def heldout_bits_per_byte(
    model,
    tokenizer,
    lines: Sequence[str] | str | Path,
    *,
    limit: int | None = None,
    bootstrap: Mapping | None = None,
    **options,
) -> dict:
    """:func:`bits_per_byte` with ``per_line=True`` on ``lines`` (or the first ``limit`` lines of the text file
    at that path, e.g. ``SHARED_CORPORA / "en" / "heldout.txt"`` for English), plus ``interval``: its bootstrap
    interval over lines (``bootstrap``: a dict of ``resamples``, ``confidence``, ``seed``; 1,000 resamples, 95%,
    seed 0 by default). ``options`` go to :func:`bits_per_byte`."""
    if isinstance(lines, (str, Path)):
        from vocgraft.corpus import read_lines

        lines = read_lines(lines, limit=limit)
    elif limit is not None:
        lines = list(lines)[:limit]
    result = bits_per_byte(model, tokenizer, lines, per_line=True, **options)
    result["interval"] = bits_per_byte_interval(result, **(bootstrap or {}))
    return result


def uniform_bits_per_byte(tokens: int, vocab_size: int, nbytes: int) -> float:
    """Bits/byte of a model that knows only the tokenizer: every token costs log2(V) bits."""
    return tokens * math.log2(vocab_size) / nbytes
