"""SentencePiece's joining rule as BPE merges, for planning an expansion of a SentencePiece-style BPE.

SentencePiece BPE (and llama.cpp's ``llama`` tokenizer, which runs it from a GGUF file's scores) joins *any* two
adjacent pieces whose concatenation is a vocabulary entry, the entry with the best score first. A tokenizer.json
BPE joins only the pairs its merges list. The two agree when every split of every entry into two entries is a
merge, and an entry's merges rank together, in the order of the entries' scores: that is how SentencePiece BPE
models are converted to tokenizer.json (Llama-2, Phi-3, Gemma), and the score vocgraft writes to GGUF is minus the
rank of an entry's first merge (:func:`vocgraft.export.sentencepiece.token_scores`).

:class:`SentencePieceBPE` keeps that true while expansion adds entries:

- a new entry gets every split into two entries as its merges, ranked together after every merge so far (its
  score: below every older entry);
- an entry that the new one completes (``▁`` + new ``να`` = ``▁να``, old or new) gets that split as a merge ranked
  with its own merges, right after them (a fractional rank between two integer ones), so its score is unchanged.

Such a completing merge needs the new entry as one of its pieces, which only the new entry's own (later) merges
make, so text the source tokenizes without any new merge still tokenizes as before.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from vocgraft.tokenization.bpe import BPEModel

# fractional ranks for merges inserted after an entry's merges: 1/2**16 apart, exact in a float
_STEP = 1.0 / 65536


class SentencePieceBPE(BPEModel):
    """A :class:`BPEModel` in which adding an entry adds every merge SentencePiece would join into an entry.

    ``unmergeable``: entries no merge makes or uses (added tokens, ``<0xNN>`` byte pieces), as in llama.cpp's
    scores (they have the lowest) and in the converted tokenizer.json merges.
    """

    def __init__(
        self,
        vocab: Iterable[str],
        merges: Iterable[tuple[str, str]],
        *,
        unmergeable: Iterable[str] = (),
        ignore_merges: bool = False,
    ):
        merges = list(merges)
        super().__init__(vocab, merges, ignore_merges=ignore_merges)
        self.unmergeable = set(unmergeable)
        # entry -> the rank of the last merge of its first run of consecutive merges: splits found later go right
        # after it (runs of one character, ▁▁▁▁, have their merges interleaved with others'; only the first run
        # sets the entry's score)
        self._block_end: dict[str, float] = {}
        for rank, (left, right) in enumerate(merges):
            token = left + right
            end = self._block_end.get(token)
            if end is None or end == rank - 1:
                self._block_end[token] = rank
        self._inserted: dict[str, int] = {}  # entry -> merges inserted after its block so far
        mergeable = [t for t in self.vocab if t not in self.unmergeable]
        self._sorted = sorted(mergeable)  # the source's entries, for prefix search
        self._sorted_reversed = sorted(t[::-1] for t in mergeable)  # for suffix search
        # entries added since construction, by first and by last character, in order of addition
        self._new_by_first: dict[str, list[str]] = {}
        self._new_by_last: dict[str, list[str]] = {}

    # ------------------------------------------------------------------------------------------------ additions

    def add_token(self, token: str) -> None:
        if token in self.vocab:
            return
        super().add_token(token)
        self._new_by_first.setdefault(token[0], []).append(token)
        self._new_by_last.setdefault(token[-1], []).append(token)
        if token in self.unmergeable:
            return
        for cut in range(1, len(token)):  # its own splits: its block, after every merge so far
            self._add_split(token[:cut], token[cut:], "merge")
        for left, right in self._completed_by(token):
            self._add_split(left, right, "split")

    def add_merge(self, left: str, right: str) -> None:
        """The merge (left, right), ranked with the merges of its entry if it has any, else after every merge."""
        self._add_split(left, right, "merge", force=True)

    def _joinable(self, left: str, right: str) -> bool:
        vocab, unmergeable = self.vocab, self.unmergeable
        return (
            left in vocab
            and right in vocab
            and left not in unmergeable
            and right not in unmergeable
            and left + right not in unmergeable
        )

    def _add_split(self, left: str, right: str, kind: str, *, force: bool = False) -> None:
        """Rank the merge (left, right) with its entry's merges; ``kind`` is what the undo log calls it."""
        pair = (left, right)
        if pair in self.ranks or not (force or self._joinable(left, right)):
            return
        token = left + right
        end = self._block_end.get(token)
        if end is None or end == self._next_rank - 1:  # a new block, or the last one: after every merge so far
            rank: float = self._next_rank
            self._next_rank += 1
            self._log.append(("block", (token, end)))
            self._block_end[token] = rank
        else:  # right after its block, before the next merge
            count = self._inserted.get(token, 0) + 1
            if count >= 65536:
                raise RuntimeError(f"more than 65535 merges inserted for {token!r}; please report this.")
            self._inserted[token] = count
            rank = end + count * _STEP
        self.ranks[pair] = rank
        self._log.append((kind, pair))

    def _completed_by(self, token: str) -> Iterator[tuple[str, str]]:
        """Splits (left, right) of other entries in which ``token`` is one part and the other part an entry."""
        n = len(token)
        for other in self._starting_with(token):
            if len(other) > n:
                yield token, other[n:]
        for other in self._ending_with(token):
            if len(other) > n:
                yield other[:-n], token

    def _starting_with(self, prefix: str) -> Iterator[str]:
        at = bisect.bisect_left(self._sorted, prefix)
        while at < len(self._sorted) and self._sorted[at].startswith(prefix):
            yield self._sorted[at]
            at += 1
        yield from (t for t in self._new_by_first.get(prefix[0], ()) if t.startswith(prefix))

    def _ending_with(self, suffix: str) -> Iterator[str]:
        backwards = suffix[::-1]
        at = bisect.bisect_left(self._sorted_reversed, backwards)
        while at < len(self._sorted_reversed) and self._sorted_reversed[at].startswith(backwards):
            yield self._sorted_reversed[at][::-1]
            at += 1
        yield from (t for t in self._new_by_last.get(suffix[-1], ()) if t.endswith(suffix))

    # -------------------------------------------------------------------------------------------------- undo

    def _undo(self, kind: str, item: object) -> None:
        if kind == "vocab":
            self.vocab.discard(item)  # type: ignore[arg-type]
            for index, char in ((self._new_by_first, item[0]), (self._new_by_last, item[-1])):  # type: ignore[index]
                index[char].pop()  # the last one added: undo runs backwards
        elif kind == "block":
            token, end = item  # type: ignore[misc]
            if end is None:
                del self._block_end[token]
            else:
                self._block_end[token] = end
        else:
            rank = self.ranks.pop(item)  # type: ignore[arg-type]
            if rank == self._next_rank - 1:
                self._next_rank -= 1
            else:
                token = "".join(item)  # type: ignore[arg-type]
                self._inserted[token] -= 1
