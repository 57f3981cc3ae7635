"""Align initialization (paper 000 §3.2, paper 003 §4.3): each new token's row is the frequency-weighted mean of the
mean source rows of the source-token tuples it is aligned with in the corpus.

Every corpus line is tokenized by the source tokenizer and by the *auxiliary* tokenizer (``ctx.aux``: in expand
mode the tokenizer the new tokens came from, in replace mode the target tokenizer itself). Each occurrence of a
new token in the auxiliary segmentation is aligned to the tuple of source tokens whose byte spans overlap its
own; per new token the distinct tuples are weighted by their relative frequency. New tokens that never occur
in the auxiliary segmentation of the corpus (in expand mode: the expansion's intermediates, and auxiliary
tokens the auxiliary tokenizer always merges further) get Merge, which gives Random where it has no merge
path: the fallbacks of the authors' code.

Why the auxiliary segmentation and not the expanded tokenizer's: vocgraft ranks its new merges after every
source merge, so wherever the expanded tokenizer emits a new token, that token covers exactly the source pieces
of its own string, and Align over it is Mean (measured on SmolLM2 + Greek: identical rows). The papers' method
rests on the source tokenizing a new token's text differently in different contexts; against the auxiliary
segmentation it does (4,096 Greek lines: ``ĠÎ¼Îµ`` is ``ĠÎ¼ Îµ`` 555 times, ``ĠÎ¼ ÎµÏģ`` once, where the
source's ``ÎµÏģ`` crosses the token's end), as it does against the authors' expanded tokenizers, which rank the
auxiliary merges first.
New tokens are found in the auxiliary vocabulary by their raw string (expansion adds auxiliary tokens under the
same raw strings).

Alignment is done on UTF-8 *byte* spans in one convention for both tokenizers (see ``_byte_spans``):
  * special tokens (BOS, whose span is (0, 0), and the like) are dropped;
  * a token owns the bytes from the end of the previous token of its line to its own end, so a leading space belongs
    to the token that follows it whether or not the tokenizer's offsets include it (byte-level BPE with and without
    ``trim_offsets``, SentencePiece ``▁``, whitespace pre-tokenizers that drop spaces all end up alike);
  * tokens holding parts of one multi-byte character get that whole character as offsets; such overlapping tokens
    form one group, split into exact byte spans by the tokens' own byte lengths when these add up to the group,
    otherwise every token of the group gets the group's span;
  * a token with an empty span that is not special (``trim_offsets`` gives a lone ``Ġ`` one) joins the group of the
    token after it, so its byte length puts it back where it was.
A source token aligns with a new token when their byte spans share at least one byte, so a source token that
straddles the new token's edge is part of its tuple (the authors' code keeps only source tokens that contain or
are contained in the new token, which drops straddling tokens and can leave part of the text unrepresented).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from vocgraft.init import InitContext, register, source_rows
from vocgraft.init.merge import cached_tree, merge_rows, warn_random
from vocgraft.progress import progress
from vocgraft.tokenization.canonical import canonical_tokens
from vocgraft.tokenization.ids import id_range

BATCH_LINES = 8192  # lines per tokenizer call: large enough for the Rust batch encoder, small enough for memory

PairCounts = Counter[tuple[int, tuple[int, ...]]]  # (aligned token id, covering source ids) -> occurrences


class _Spans:
    """Tokens of a batch of lines with their byte spans in batch-global coordinates (sorted, non-decreasing)."""

    __slots__ = ("ids", "start", "end")

    def __init__(self, ids: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        self.ids, self.start, self.end = ids, start, end


def _backend(tokenizer):
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"align needs offsets, which only fast tokenizers give; {type(tokenizer).__name__} is a slow tokenizer. "
            "Load the tokenizer with use_fast=True (or save it as tokenizer.json)."
        )
    return backend


def token_byte_lengths(tokenizer) -> np.ndarray:
    """UTF-8 length of the text each token id stands for (leading space included); -1 where unknown.

    The lengths only refine spans inside groups of overlapping tokens, so a tokenizer without canonical forms
    (WordLevel, ...) still aligns, on character-granular spans.
    """
    try:
        forms = canonical_tokens(tokenizer)
    except ValueError:  # a family canonical.py does not know
        return np.full(id_range(tokenizer), -1, dtype=np.int64)
    return np.fromiter((-1 if b is None else len(b) for b in forms), dtype=np.int64, count=len(forms))


def _char_to_byte(lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Byte offset of every character boundary of the concatenated lines, and each line's first character index.

    ``cum[line_char[i] + c]`` is the batch-global byte offset of character ``c`` of line ``i``.
    """
    line_len = np.fromiter((len(line) for line in lines), dtype=np.int64, count=len(lines))
    line_char = np.zeros(len(lines), dtype=np.int64)
    np.cumsum(line_len[:-1], out=line_char[1:])
    code = np.frombuffer("".join(lines).encode("utf-32-le"), dtype=np.uint32)
    nbytes = 1 + (code >= 0x80).astype(np.int64) + (code >= 0x800) + (code >= 0x10000)
    cum = np.zeros(len(code) + 1, dtype=np.int64)
    np.cumsum(nbytes, out=cum[1:])
    return cum, line_char


def _encode(tokenizer, lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat token ids, (n, 2) character offsets, and the line index of every token."""
    encodings = _backend(tokenizer).encode_batch(list(lines), add_special_tokens=False)
    chain = itertools.chain.from_iterable
    counts = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    total = int(counts.sum())
    ids = np.fromiter(chain(e.ids for e in encodings), dtype=np.int64, count=total)
    offsets = np.fromiter(chain(chain(e.offsets for e in encodings)), dtype=np.int64, count=2 * total)
    line = np.repeat(np.arange(len(encodings), dtype=np.int64), counts)
    return ids, offsets.reshape(-1, 2), line


def _byte_spans(
    ids: np.ndarray,
    offsets: np.ndarray,
    line: np.ndarray,
    cum: np.ndarray,
    line_char: np.ndarray,
    byte_len: np.ndarray,
    special: np.ndarray,
) -> _Spans:
    """Turn one tokenizer's character offsets into byte spans in the module's one convention (see docstring)."""
    keep = ~np.isin(ids, special)
    ids, offsets, line = ids[keep], offsets[keep], line[keep]
    n = len(ids)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return _Spans(empty, empty, empty)
    base = line_char[line]
    b_start, b_end = cum[base + offsets[:, 0]], cum[base + offsets[:, 1]]
    first_of_line = np.ones(n, dtype=bool)
    first_of_line[1:] = line[1:] != line[:-1]
    # a group starts where a token does not overlap the one before it (overlaps are partial UTF-8 characters);
    # a zero-width token (a lone space under trim_offsets) joins the next token's group, which gives it its bytes
    zero = b_end == b_start
    group_start = first_of_line.copy()
    group_start[1:] |= (b_start[1:] >= np.maximum.accumulate(b_end)[:-1]) & ~zero[:-1]
    starts = np.flatnonzero(group_start)
    group = np.cumsum(group_start) - 1
    g_end = np.maximum.accumulate(np.maximum.reduceat(b_end, starts))
    # gap filling: a group begins where the previous group of its line ended (the line's start for the first)
    g_begin = np.empty_like(g_end)
    g_begin[0] = 0
    g_begin[1:] = g_end[:-1]
    line_first = first_of_line[starts]
    g_begin[line_first] = cum[line_char[line[starts[line_first]]]]
    # exact spans inside a group from the tokens' own byte lengths, where they add up to the group's width
    length = np.full(n, -1, dtype=np.int64)
    inside = ids < len(byte_len)
    length[inside] = byte_len[ids[inside]]
    known = np.minimum.reduceat(length, starts) >= 0
    safe = np.where(length < 0, 0, length)
    exact = known & (np.add.reduceat(safe, starts) == g_end - g_begin)
    csum = np.cumsum(safe)
    within = csum - safe - (csum - safe)[starts][group]  # exclusive running length inside the group
    tok_exact = exact[group]
    start = np.where(tok_exact, g_begin[group] + within, g_begin[group])
    end = np.where(tok_exact, start + safe, g_end[group])
    if np.any(np.diff(start) < 0) or np.any(np.diff(end) < 0):
        raise ValueError("tokenizer offsets are not monotone within a line; align cannot pair tokens by position.")
    return _Spans(ids, start, end)


def _special_ids(tokenizer) -> np.ndarray:
    return np.asarray(sorted(set(getattr(tokenizer, "all_special_ids", []) or [])), dtype=np.int64)


def _count_batch(source: _Spans, aligned: _Spans, wanted: np.ndarray, counts: PairCounts) -> None:
    """Add the (wanted id, covering source tuple) pairs of one batch to ``counts``."""
    hit = np.isin(aligned.ids, wanted)
    t_start, t_end = aligned.start[hit], aligned.end[hit]
    # covering = every source token whose span overlaps [t_start, t_end): spans are sorted, so two binary searches
    lo = np.searchsorted(source.end, t_start, side="right")
    hi = np.searchsorted(source.start, t_end, side="left")
    ok = hi > lo  # a span with no source token under it (text the source tokenizer dropped) says nothing
    src = source.ids.tolist()
    pairs = zip(aligned.ids[hit][ok].tolist(), (tuple(src[a:b]) for a, b in zip(lo[ok].tolist(), hi[ok].tolist())))
    counts.update(pairs)


def count_pairs(
    source_tokenizer,
    aligned_tokenizer,
    lines: Iterable[str],
    wanted_ids: Iterable[int],
    *,
    batch_lines: int = BATCH_LINES,
    show_progress: bool = True,
    timings: dict[str, float] | None = None,
) -> PairCounts:
    """Occurrences of every (id of ``aligned_tokenizer`` in ``wanted_ids``, covering tuple of source ids) pair
    over the corpus lines, each line tokenized by both tokenizers."""
    clock = timings if timings is not None else {}
    t0 = time.perf_counter()
    lines = list(lines)
    wanted = np.asarray(sorted(set(wanted_ids)), dtype=np.int64)
    src_len, aln_len = token_byte_lengths(source_tokenizer), token_byte_lengths(aligned_tokenizer)
    src_special, aln_special = _special_ids(source_tokenizer), _special_ids(aligned_tokenizer)
    counts: PairCounts = Counter()
    clock["setup_s"] = clock.get("setup_s", 0.0) + time.perf_counter() - t0
    clock.setdefault("tokenize_s", 0.0)
    clock.setdefault("count_s", 0.0)
    batches = range(0, len(lines), batch_lines)
    for lo in progress(batches, desc="align", unit="batch", disable=not show_progress or len(batches) < 2):
        batch = lines[lo : lo + batch_lines]
        t0 = time.perf_counter()
        s_raw, a_raw = _encode(source_tokenizer, batch), _encode(aligned_tokenizer, batch)
        t1 = time.perf_counter()
        cum, line_char = _char_to_byte(batch)
        source = _byte_spans(*s_raw, cum, line_char, src_len, src_special)
        aligned = _byte_spans(*a_raw, cum, line_char, aln_len, aln_special)
        _count_batch(source, aligned, wanted, counts)
        clock["tokenize_s"] += t1 - t0
        clock["count_s"] += time.perf_counter() - t1
    return counts


def align_counts(
    source_tokenizer, aligned_tokenizer, lines: Iterable[str], wanted_ids: Iterable[int]
) -> dict[int, Counter[tuple[int, ...]]]:
    """For each wanted id seen in ``lines``: how often each tuple of source ids covered it (unseen ids absent)."""
    out: dict[int, Counter[tuple[int, ...]]] = {}
    counts = count_pairs(source_tokenizer, aligned_tokenizer, lines, wanted_ids, show_progress=False)
    for (tid, tup), n in counts.items():
        out.setdefault(tid, Counter())[tup] = n
    return out


def aux_ids_of_new_tokens(plan, aux_tokenizer) -> dict[int, int]:
    """Auxiliary id -> target id for every new token of ``plan`` that is a (non-special) auxiliary token, matched
    by raw string. Intermediates the expansion made up have no auxiliary id."""
    vocab = aux_tokenizer.get_vocab()
    special = set(_special_ids(aux_tokenizer).tolist())
    found = {}
    for tid in plan.new_ids:
        aux_id = vocab.get(plan.target_tokens[tid])
        if aux_id is not None and aux_id not in special:
            found[aux_id] = tid
    return found


def count_new_token_pairs(
    source_tokenizer,
    aux_tokenizer,
    lines: Sequence[str],
    plan,
    *,
    show_progress: bool = True,
    timings: dict[str, float] | None = None,
) -> PairCounts:
    """(new target id, covering source tuple) occurrences, aligning the source against the auxiliary segmentation
    of ``lines``."""
    to_target = aux_ids_of_new_tokens(plan, aux_tokenizer)
    counts = count_pairs(
        source_tokenizer, aux_tokenizer, lines, list(to_target), show_progress=show_progress, timings=timings
    )
    return Counter({(to_target[aux_id], tup): n for (aux_id, tup), n in counts.items()})


def weight_matrix(counts: PairCounts, new_ids: Sequence[int], n_rows: int) -> torch.Tensor:
    """Sparse (len(new_ids) x n_rows) matrix M with M @ E = the Align rows (zero rows for unseen ids).

    M = W @ T, W[new, tuple] = tuple frequency normalized per new token, T[tuple, source] = 1/|tuple| per member;
    the product is formed by summing duplicate (row, column) entries, never as a dense |Vnew| x |Vold| matrix.
    """
    row_of = {tid: r for r, tid in enumerate(new_ids)}
    keys = list(counts)
    if not keys:
        return torch.sparse_coo_tensor(
            torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (len(new_ids), n_rows), check_invariants=True
        )
    rows = np.fromiter((row_of[tid] for tid, _ in keys), dtype=np.int64, count=len(keys))
    freq = np.fromiter(counts.values(), dtype=np.float64, count=len(keys))
    size = np.fromiter((len(tup) for _, tup in keys), dtype=np.int64, count=len(keys))
    cols = np.fromiter(itertools.chain.from_iterable(tup for _, tup in keys), dtype=np.int64, count=int(size.sum()))
    if cols.max() >= n_rows:
        raise ValueError(f"source id {int(cols.max())} is outside the source matrix ({n_rows} rows).")
    total = np.bincount(rows, weights=freq, minlength=len(new_ids))
    weight = freq / total[rows] / size
    index = torch.from_numpy(np.stack([np.repeat(rows, size), cols]))
    values = torch.from_numpy(np.repeat(weight, size))
    # float64 while summing duplicates keeps the weights exact enough; the product itself runs in float32
    matrix = torch.sparse_coo_tensor(index, values, (len(new_ids), n_rows), check_invariants=True)
    return matrix.coalesce().to(torch.float32)


def align_rows(source_matrix: torch.Tensor, new_ids: Sequence[int], counts: PairCounts, fallback: torch.Tensor):
    """Rows for ``new_ids`` (in that order): the Align row where a token has aligned tuples in ``counts``, its
    ``fallback`` row (same order) elsewhere. ``source_matrix``: the real source rows, float32."""
    rows = torch.sparse.mm(weight_matrix(counts, new_ids, source_matrix.shape[0]), source_matrix)
    seen = {tid for tid, _ in counts}
    unseen = [r for r, tid in enumerate(new_ids) if tid not in seen]
    rows[unseen] = fallback[unseen]
    return rows


def tuple_variety(counts: PairCounts) -> Counter[int]:
    """Number of distinct source tuples per seen id."""
    return Counter(tid for tid, _ in counts)


@register(
    "align",
    needs=("corpus", "aux_tokenizer"),
    summary="frequency-weighted mean of the source tuples aligned with the token in the auxiliary segmentation "
    "of the corpus",
    reference="paper 000 §3.2, paper 003 §4.3 (Align)",
)
def align(source_matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
    """Align over ``ctx.corpus``; new tokens the auxiliary segmentation never produces get Merge (then Random)."""
    if ctx.corpus is None:
        raise ValueError("init method 'align' needs a corpus: pass the target-language text (--corpus).")
    matrix = source_rows(source_matrix, ctx)
    tree = cached_tree(ctx, "align")  # checks the auxiliary tokenizer is there before the corpus pass
    new_ids = list(ctx.plan.new_ids)
    # the counts depend only on the tokenizers and the corpus: an untied model's head pass reuses them
    if "align_counts" not in ctx.resources:
        timings: dict[str, float] = {}
        counts = count_new_token_pairs(ctx.source_tokenizer, ctx.aux, ctx.corpus, ctx.plan, timings=timings)
        seen = tuple_variety(counts)
        unseen = [n for n, tid in enumerate(new_ids) if tid not in seen]
        random = sum(tree.depth[n] < 0 for n in unseen)
        ctx.resources["align_counts"] = counts
        ctx.resources["align_stats"] = {
            **timings,
            "seen": len(seen),
            "several_tuples": sum(v > 1 for v in seen.values()),
            "unseen_merge": len(unseen) - random,
            "unseen_random": random,
        }
        warn_random("align", random, len(new_ids), "never occur in the auxiliary segmentation and have no merge path")
    fallback = merge_rows(matrix, tree, ctx.generator())
    return align_rows(matrix, new_ids, ctx.resources["align_counts"], fallback)
