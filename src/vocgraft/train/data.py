"""Training data: the corpus packed into fixed-length token sequences, and a batch order that depends only on
(seed, step), so a resumed run sees exactly the batches the killed run would have seen."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


class TrainingError(ValueError):
    """Training cannot run as asked; the message names the input to change."""


def pack_tokens(tokenizer: Any, lines: Sequence[str], seq_len: int, *, batch: int = 4096) -> torch.Tensor:
    """The corpus as ``[n_chunks, seq_len]`` int32 token ids: documents joined by EOS, cut into full chunks.

    Packing (no padding) means every position is a real training target; the tail that does not fill a chunk
    is dropped. Ids are collected batch by batch into numpy arrays (4 bytes a token, where a Python list of ints
    costs ~36); the result is a view of one array, so take ``.long()`` of the rows a step uses (losses need int64).
    """
    sep = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.bos_token_id
    parts: list[np.ndarray] = []
    for start in range(0, len(lines), batch):  # batched: the fast tokenizer encodes a batch in parallel
        docs = tokenizer(list(lines[start : start + batch]), add_special_tokens=False)["input_ids"]
        lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        ids = np.fromiter(itertools.chain.from_iterable(docs), dtype=np.int32, count=int(lengths.sum()))
        if sep is not None:  # a separator after every document
            ids = np.insert(ids, np.cumsum(lengths), sep)
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
