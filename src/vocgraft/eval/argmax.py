"""Teacher-forced argmax rate of new tokens: where the tokenizer's canonical encoding of held-out text has a new
token, does the model's argmax pick that token, or its first piece (the old token a model without the new token
would start the word with)?

Greedy decoding emits a new token only where it wins the argmax, so this is the teacher-forced counterpart of the
canonical rate of generated text (:mod:`vocgraft.eval.canonical_use`), read off logits a bits/byte pass computes
anyway (``bits_per_byte(..., new_token_ids=...)``) or any other forward pass (:meth:`NewTokenArgmax.update`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from vocgraft.tokenization.bpe import BPEModel, parse_merges
from vocgraft.tokenization.spec import tokenizer_spec


def first_pieces(tokenizer, new_ids: Collection[int]) -> dict[int, int]:
    """New id -> id of the first token of its spelling without any new token.

    That spelling is the tokenizer's own BPE with the new tokens and every merge that makes one removed (expansion
    appends its merges after the source's, so this is the source tokenizer's spelling). A first character the
    remaining vocabulary lacks becomes its first UTF-8 byte's ``<0xNN>`` piece (SentencePiece byte fallback); a new
    token without a first piece (not a vocabulary token, or no such byte piece) is left out.
    """
    model = tokenizer_spec(tokenizer)["model"]
    if model.get("type") != "BPE":
        raise ValueError(
            f"first pieces need a BPE tokenizer (the new tokens' merges); this one is {model.get('type')!r}."
        )
    new = set(new_ids)
    new_raw = {raw: i for raw, i in model["vocab"].items() if i in new}
    old = {raw: i for raw, i in model["vocab"].items() if i not in new}
    merges = [(a, b) for a, b in parse_merges(model.get("merges", [])) if a + b not in new_raw]
    bpe = BPEModel(old, merges, ignore_merges=bool(model.get("ignore_merges")))
    out = {}
    for raw, token in new_raw.items():
        first = bpe.tokenize(raw)[0]
        if first in old:
            out[token] = old[first]
        else:
            byte_piece = old.get(f"<0x{first.encode()[0]:02X}>")
            if byte_piece is not None:
                out[token] = byte_piece
    return out


class NewTokenArgmax:
    """Counts, over scored positions whose label is a new token: positions, argmax == the label, argmax == the
    label's first piece. Feed it the logits and labels of scored positions with :meth:`update`."""

    def __init__(self, new_ids: Collection[int], first_piece: Mapping[int, int] | None):
        self.new_ids = sorted(set(new_ids))
        self.first_piece = dict(first_piece) if first_piece is not None else None  # None: not known
        self.positions = self.hits = self.first_piece_hits = 0
        self._tables: dict = {}

    def _lookup(self, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(is new, first piece or -1) per id, on ``device``, built once per (width, device)."""
        key = (width, str(device))
        if key not in self._tables:
            size = max(width, self.new_ids[-1] + 1 if self.new_ids else 0)
            is_new = torch.zeros(size, dtype=torch.bool)
            is_new[self.new_ids] = True
            first = torch.full((size,), -1, dtype=torch.long)
            if self.first_piece:  # a dict with entries
                first[list(self.first_piece)] = torch.tensor(list(self.first_piece.values()), dtype=torch.long)
            self._tables[key] = (is_new.to(device), first.to(device))
        return self._tables[key]

    @torch.no_grad()
    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """``logits`` [n, vocab] and ``labels`` [n] at scored positions (no -100 labels)."""
        is_new, first = self._lookup(logits.shape[-1], logits.device)
        rows = is_new[labels]
        n = int(rows.sum())
        if not n:
            return
        target = labels[rows]
        top = logits[rows].argmax(-1)
        self.positions += n
        self.hits += int((top == target).sum())
        self.first_piece_hits += int((top == first[target]).sum())

    def summary(self) -> dict:
        """``argmax_new_positions``; ``argmax_new_share`` (argmax is the canonical new token) and
        ``argmax_first_piece_share`` (argmax is its first piece instead), None without new-token positions (the
        latter also without a first-piece table)."""
        n = self.positions
        return {
            "argmax_new_positions": n,
            "argmax_new_share": self.hits / n if n else None,
            "argmax_first_piece_share": self.first_piece_hits / n if n and self.first_piece is not None else None,
        }
