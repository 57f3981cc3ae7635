"""Distillation snippets: corpus windows around new tokens, spelled by the source (teacher) and with new ids
(student), aligned on the bytes both tokenizations share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vocgraft.progress import progress
from vocgraft.tokenization.canonical import canonical_tokens

LINES_PER_CHUNK = 4096  # corpus lines tokenized at once while looking for snippets


@dataclass
class Snippet:
    """One training context. Positions count the prefix token as 0 in both sequences.

    ``student`` holds a source id (>= 0) where the student reads a frozen source row and ``-(1 + j)`` where it
    reads new row ``j`` (the index into ``plan.new_ids``)."""

    student: np.ndarray
    teacher: np.ndarray  # source ids
    loss_student: np.ndarray  # student positions whose final hidden states are matched ...
    loss_teacher: np.ndarray  # ... with these teacher positions
    # the window as the expanded tokenizer spells it, in the student's id convention (prefix first); None when a
    # target token of it has neither a source row nor a new row. The output rows are fitted on it.
    canonical: np.ndarray | None


@dataclass
class Vocab:
    """What the snippet builder needs to know about the two tokenizers and the plan."""

    source_of_target: np.ndarray  # copied target id -> source id, else -1
    new_index: np.ndarray  # target id -> index into plan.new_ids, else -1
    trainable: np.ndarray  # per new index: the source spells the token byte for byte
    target_bytes: np.ndarray  # byte length per target id (-1: special/unknown)
    source_bytes: np.ndarray
    prefix: int  # the source id put before every snippet (BOS, else EOS)


def byte_lengths(tokenizer) -> np.ndarray:
    forms = canonical_tokens(tokenizer)
    return np.fromiter((-1 if f is None else len(f) for f in forms), dtype=np.int64, count=len(forms))


def prefix_id(tokenizer) -> int:
    for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    raise ValueError("distill needs a BOS or EOS token in the source tokenizer to start every snippet with.")


def _ends(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    if len(ids) == 0 or ids.max() >= len(lengths):
        return None
    sizes = lengths[ids]
    return None if (sizes < 0).any() else np.cumsum(sizes)


def _line_ends(t_ids: np.ndarray, s_ids: np.ndarray, vocab: Vocab) -> tuple[np.ndarray, np.ndarray] | None:
    """Byte end of every target and source token of one line, in one coordinate system; None when the two
    tokenizations do not spell the same bytes (unknown pieces, normalization)."""
    t_end, s_end = _ends(t_ids, vocab.target_bytes), _ends(s_ids, vocab.source_bytes)
    if t_end is None or s_end is None:
        return None
    extra = int(t_end[-1] - s_end[-1])
    if extra == 1:  # a word-start marker one tokenizer adds before the line (SentencePiece): not text
        t_end = np.maximum(t_end - 1, 0)
    elif extra == -1:
        s_end = np.maximum(s_end - 1, 0)
    elif extra:
        return None
    return t_end, s_end


def _window(i: int, n: int, length: int, common_end: np.ndarray) -> tuple[int, int]:
    """Target tokens [s, e) around token i: up to ``length`` tokens, i in the middle where the line allows,
    widened to start and end on byte boundaries both tokenizations share."""
    s = max(0, i - (length - 1) // 2)
    e = min(n, s + length)
    s = max(0, min(s, e - length))
    while s > 0 and not common_end[s - 1]:
        s -= 1
    while e < n and not common_end[e - 1]:
        e += 1
    return s, e


def _snippet(
    t_ids: np.ndarray,
    s_ids: np.ndarray,
    t_end: np.ndarray,
    s_end: np.ndarray,
    common: np.ndarray,
    window: tuple[int, int],
    occurrence: int,
    merge: str,
    vocab: Vocab,
) -> Snippet | None:
    s, e = window
    start_byte = int(t_end[s - 1]) if s else 0
    end_byte = int(t_end[e - 1])
    a = int(np.searchsorted(s_end, start_byte, side="right"))  # first source token ending inside the window
    b = int(np.searchsorted(s_end, end_byte, side="left")) + 1
    teacher = np.concatenate([[vocab.prefix], s_ids[a:b]])
    # teacher position of each target token that ends on a shared boundary (prefix = 0)
    src_pos = np.searchsorted(s_end, t_end[s:e]) - a + 1
    shared = common[s:e]
    new = vocab.new_index[t_ids]
    canonical = None
    if not ((new[s:e] < 0) & (vocab.source_of_target[t_ids[s:e]] < 0)).any():  # else: a plan that does not fit
        spelled = np.where(new[s:e] >= 0, -(1 + new[s:e]), vocab.source_of_target[t_ids[s:e]])
        canonical = np.concatenate([[vocab.prefix], spelled]).astype(np.int64)
    if merge == "all":
        if canonical is None:
            return None
        student = canonical
        first = int(np.flatnonzero(new[s:e] >= 0)[0])
        keep = shared & (np.arange(e - s) >= first)
        loss_student = np.flatnonzero(keep) + 1
        loss_teacher = src_pos[keep]
    else:  # the paper's form: the source spelling with only this occurrence's pieces replaced by its new id
        if not (common[occurrence] and (occurrence == 0 or common[occurrence - 1])):
            return None
        lo = int(np.searchsorted(s_end, t_end[occurrence - 1] if occurrence else 0, side="right"))
        hi = int(np.searchsorted(s_end, t_end[occurrence])) + 1
        pieces = hi - lo
        student = np.concatenate([teacher[: lo - a + 1], [-(1 + new[occurrence])], teacher[hi - a + 1 :]])
        loss_student = np.arange(lo - a + 1, len(student))
        loss_teacher = loss_student + pieces - 1
    return Snippet(student.astype(np.int64), teacher.astype(np.int64), loss_student, loss_teacher, canonical)


def collect_snippets(
    lines: Sequence[str],
    source_tokenizer,
    target_tokenizer,
    vocab: Vocab,
    *,
    per_token: int,
    length: int,
    merge: str,
    seed: int,
    show_progress: bool = True,
) -> tuple[list[Snippet], np.ndarray]:
    """Snippets giving every trainable new token up to ``per_token`` occurrences, from lines in a seeded random
    order; and how many occurrences each new token got."""
    need = np.where(vocab.trainable, per_token, 0).astype(np.int64)
    got = np.zeros(len(vocab.trainable), dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(lines))
    snippets: list[Snippet] = []
    chunks = range(0, len(order), LINES_PER_CHUNK)
    bar = progress(total=int(need.sum()), desc="distill snippets", unit="occ", disable=not show_progress)
    for lo in chunks:
        if not need.any():
            break
        batch = [lines[i] for i in order[lo : lo + LINES_PER_CHUNK]]
        t_all = target_tokenizer(batch, add_special_tokens=False)["input_ids"]
        s_all = source_tokenizer(batch, add_special_tokens=False)["input_ids"]
        for t_list, s_list in zip(t_all, s_all):
            t_ids = np.asarray(t_list, dtype=np.int64)
            if len(t_ids) == 0:
                continue
            new = vocab.new_index[t_ids] if t_ids.max() < len(vocab.new_index) else None
            if new is None:
                continue
            wanted = np.flatnonzero((new >= 0) & vocab.trainable[np.maximum(new, 0)])
            wanted = wanted[need[new[wanted]] > 0]
            if len(wanted) == 0:
                continue
            s_ids = np.asarray(s_list, dtype=np.int64)
            ends = _line_ends(t_ids, s_ids, vocab)
            if ends is None:
                continue
            t_end, s_end = ends
            common = np.isin(t_end, s_end)
            covered = -1  # target tokens before this index are already in a snippet of this line ("all")
            for i in wanted.tolist():
                if i < covered or need[new[i]] <= 0:
                    continue
                window = _window(i, len(t_ids), length, common)
                snippet = _snippet(t_ids, s_ids, t_end, s_end, common, window, i, merge, vocab)
                if snippet is None:
                    continue
                snippets.append(snippet)
                if merge == "all":
                    inside = new[window[0] : window[1]]
                    inside = inside[inside >= 0]
                    inside = inside[vocab.trainable[inside]]
                    covered = window[1]
                else:
                    inside = new[i : i + 1]
                np.add.at(got, inside, 1)
                before = int(need.sum())
                np.subtract.at(need, inside, 1)
                np.maximum(need, 0, out=need)
                bar.update(before - int(need.sum()))
    bar.close()
    return snippets, got
