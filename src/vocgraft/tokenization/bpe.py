"""A small pure-Python BPE model over raw vocab strings, for planning merges.

Expansion asks "which pieces does the current model leave for this string?" thousands of times while merges
are being added; rebuilding a ``tokenizers.Tokenizer`` for each question would be slow, so we run the merge
loop ourselves. It follows ``tokenizers``' BPE exactly (the test suite checks this against the real model):
start from single characters, repeatedly apply the adjacent pair with the lowest merge rank, leftmost first on
ties. Characters that are not in the vocabulary stay as they are and never take part in a merge (the real
model turns them into ``<0xNN>`` byte pieces or ``<unk>``, which no merge mentions either).
"""

from __future__ import annotations

from collections.abc import Iterable

# log kinds that add a merge: "merge" (asked for with add_merge, or a new token's own split) and "split" (a
# subclass's merge completing an entry that a new token is part of)
MERGE_KINDS = ("merge", "split")


def parse_merges(raw: Iterable) -> list[tuple[str, str]]:
    """Merges from a tokenizer.json model: pairs (``tokenizers`` >= 0.20) or legacy ``"a b"`` strings."""
    merges = []
    for item in raw:
        if isinstance(item, str):
            parts = item.split(" ")
            if len(parts) != 2:
                raise ValueError(f"malformed merge {item!r} in tokenizer.json: expected 'left right'.")
            merges.append((parts[0], parts[1]))
        else:
            left, right = item
            merges.append((left, right))
    return merges


class BPEModel:
    """Vocabulary strings and merge ranks, with cheap checkpoints so a tentative plan can be undone."""

    def __init__(self, vocab: Iterable[str], merges: Iterable[tuple[str, str]], *, ignore_merges: bool = False):
        self.vocab: set[str] = set(vocab)
        self.ranks: dict[tuple[str, str], int] = {}
        rank = -1
        for rank, pair in enumerate(merges):
            self.ranks[pair] = rank  # a duplicated merge keeps its last rank, as in tokenizers
        self._next_rank = rank + 1
        self.ignore_merges = ignore_merges
        self._log: list[tuple[str, object]] = []  # undo log: ("vocab", token) / ("merge", pair)

    def tokenize(self, word: str, *, ignore_merges: bool | None = None) -> list[str]:
        """The pieces this model makes of one pre-token (raw vocab alphabet: ``Ġ``/``▁`` already applied)."""
        if (self.ignore_merges if ignore_merges is None else ignore_merges) and word in self.vocab:
            return [word]
        symbols = list(word)
        ranks = self.ranks
        while len(symbols) > 1:
            best_rank, best_at = None, -1
            for i in range(len(symbols) - 1):
                rank = ranks.get((symbols[i], symbols[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_at = rank, i
            if best_rank is None:
                break
            symbols[best_at : best_at + 2] = [symbols[best_at] + symbols[best_at + 1]]
        return symbols

    def add_token(self, token: str) -> None:
        if token not in self.vocab:
            self.vocab.add(token)
            self._log.append(("vocab", token))

    def add_merge(self, left: str, right: str) -> None:
        """Append a merge ranked after every existing one (the merged string must already be in the vocab)."""
        if (left, right) not in self.ranks:
            self.ranks[(left, right)] = self._next_rank
            self._next_rank += 1
            self._log.append(("merge", (left, right)))

    def checkpoint(self) -> int:
        return len(self._log)

    def added_since(self, mark: int) -> list[tuple[str, object]]:
        """What was added since ``checkpoint()`` returned ``mark``: ("vocab", token) / ("merge", pair), and in
        subclasses other kinds (see :meth:`merges_since`)."""
        return list(self._log[mark:])

    def merges_since(self, mark: int) -> list[tuple[float, tuple[str, str]]]:
        """Every merge added since ``checkpoint()`` returned ``mark``, as (rank, pair) in rank order. A rank is an
        integer past the original merges, or (in subclasses) a fraction after the original merge it follows."""
        ranks = self.ranks
        pairs = [item for kind, item in self._log[mark:] if kind in MERGE_KINDS]
        return sorted((ranks[pair], pair) for pair in pairs)  # type: ignore[index]

    def rollback(self, mark: int) -> None:
        """Undo every addition made after ``checkpoint()`` returned ``mark``."""
        while len(self._log) > mark:
            kind, item = self._log.pop()
            self._undo(kind, item)

    def _undo(self, kind: str, item: object) -> None:
        if kind == "vocab":
            self.vocab.discard(item)  # type: ignore[arg-type]
        else:
            del self.ranks[item]  # type: ignore[arg-type]
            self._next_rank -= 1
