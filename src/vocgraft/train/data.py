"""Training data: the corpus packed into fixed-length token sequences, and a batch order that depends only on
(seed, step), so a resumed run sees exactly the batches the killed run would have seen."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vocgraft.errors import UserError


class TrainingError(UserError, ValueError):
    """Training cannot run as asked; the message names the input to change."""


JOINS = ("newline", "eos", "none")  # what joins corpus lines when they are packed (TrainConfig.join)


def separator_ids(tokenizer: Any, join: str) -> list[int]:
    """The ids put after every line for ``join``: ``eos``: the EOS token (BOS where there is none); ``newline``: the
    ids a line break gets where it follows text (a SentencePiece tokenizer's "\\n" alone is "▁" + "<0x0A>", after
    a word only "<0x0A>"; a byte-level one's is "Ċ"); ``none``: nothing, the lines run together.

    A tokenizer that encodes a line break as nothing (WordPiece drops whitespace) or only as unknown (SentencePiece
    without byte fallback) joins lines with nothing under ``newline``, with a warning: for the first that is
    exactly how it reads a line break, and either way the model is not taught to stop or to predict <unk>."""
    if join not in JOINS:
        raise TrainingError(f"--join must be one of {', '.join(JOINS)}; got {join!r}.")
    if join == "none":
        return []
    if join == "eos":
        sep = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.bos_token_id
        return [] if sep is None else [sep]

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    word, after = encode("x"), encode("x\n")
    ids = after[len(word) :] if after[: len(word)] == word and len(after) > len(word) else encode("\n")
    unknown = tokenizer.unk_token_id
    if not ids or (unknown is not None and unknown in ids):
        shown = "nothing" if not ids else " ".join(tokenizer.convert_ids_to_tokens(ids))
        warnings.warn(
            f'--join newline: this tokenizer has no token for a line break (it encodes "\\n" as {shown}), so '
            "lines are joined by nothing, as with --join none; --join eos puts EOS between them instead.",
            stacklevel=2,
        )
        return []
    return ids


def pack_tokens(
    tokenizer: Any, lines: Sequence[str], seq_len: int, *, join: str | Sequence[int] = "eos", batch: int = 4096
) -> torch.Tensor:
    """The corpus as ``[n_chunks, seq_len]`` int32 token ids: lines joined by ``join``'s separator (one of
    ``JOINS``, see :func:`separator_ids`, or the separator's ids themselves; after every line), cut into full
    chunks.

    Packing (no padding) means every position is a real training target; the tail that does not fill a chunk
    is dropped. Ids are collected batch by batch into numpy arrays (4 bytes a token, where a Python list of ints
    costs ~36); the result is a view of one array, so take ``.long()`` of the rows a step uses (losses need int64).
    """
    sep = np.asarray(separator_ids(tokenizer, join) if isinstance(join, str) else list(join), dtype=np.int32)
    parts: list[np.ndarray] = []
    for start in range(0, len(lines), batch):  # batched: the fast tokenizer encodes a batch in parallel
        docs = tokenizer(list(lines[start : start + batch]), add_special_tokens=False)["input_ids"]
        lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        ids = np.fromiter(itertools.chain.from_iterable(docs), dtype=np.int32, count=int(lengths.sum()))
        if len(sep):  # the separator after every line: its positions in the joined stream, then the lines' ids
            ends = np.cumsum(lengths + len(sep))  # where each line's separator ends
            joined = np.empty(int(ends[-1]) if len(ends) else 0, dtype=np.int32)
            at = (ends - len(sep))[:, None] + np.arange(len(sep))  # [lines, len(sep)]
            joined[at.ravel()] = np.tile(sep, len(docs))
            text = np.ones(len(joined), dtype=bool)
            text[at.ravel()] = False
            joined[text] = ids
            ids = joined
        parts.append(ids)
    ids = np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)
    del parts
    n_chunks = len(ids) // seq_len
    if n_chunks == 0:
        raise TrainingError(
            f"the corpus gives {len(ids)} tokens, fewer than one sequence of seq_len={seq_len}; "
            "give more text or a smaller seq_len."
        )
    return torch.from_numpy(ids[: n_chunks * seq_len]).view(n_chunks, seq_len)


def split_validation(lines: Sequence[str], n_val: int) -> tuple[list[str], list[str]]:
    """(training lines, validation lines): the last ``n_val`` lines are held out.

    The caller samples/shuffles the corpus first (``read_lines(sample=...)``), so the tail is a random slice.
    """
    if n_val < 0 or n_val >= len(lines):
        raise TrainingError(
            f"cannot hold out {n_val} validation lines from a corpus of {len(lines)}; give more lines or a smaller "
            "--val-lines."
        )
    cut = len(lines) - n_val
    return list(lines[:cut]), list(lines[cut:])


class BatchOrder:
    """Which chunks form global batch number ``step``: epoch ``e`` walks a permutation seeded by ``seed + e``.

    A pure function of the step, so resuming needs no data-loader state; the last partial batch of an epoch is
    dropped so every step has the same size.
    """

    def __init__(self, n_chunks: int, global_batch: int, seed: int):
        if n_chunks < global_batch:
            raise TrainingError(
                f"the training data packs into {n_chunks} sequences, fewer than one global batch of {global_batch} "
                "(batch size x processes x accumulation); give more text, or a smaller --batch-size, --grad-accum "
                "or --seq-len."
            )
        self.n_chunks, self.global_batch, self.seed = n_chunks, global_batch, seed
        self.steps_per_epoch = n_chunks // global_batch
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def indices(self, step: int) -> torch.Tensor:
        epoch, position = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._perm = torch.randperm(self.n_chunks, generator=torch.Generator().manual_seed(self.seed + epoch))
        return self._perm[position * self.global_batch : (position + 1) * self.global_batch]
