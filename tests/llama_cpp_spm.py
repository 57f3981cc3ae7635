"""llama.cpp's SentencePiece tokenizer, written out again in Python for the default suite (CI has no llama.cpp).

``llm_tokenizer_spm_session::tokenize`` in src/llama-vocab.cpp (llama.cpp as vendored by llama-cpp-python 0.3.36):
a space before the text when ``add_space_prefix``, every space as ``▁``, the text cut into UTF-8 characters, then
repeatedly the adjacent pair whose concatenation is a token with the highest score joins (the leftmost pair on
ties); a final piece that is no token is written as its ``<0xNN>`` byte tokens. Only the GGUF file's tokens,
scores and ``add_space_prefix`` are read, never the tokenizer.json vocgraft wrote it from. (Special and
user-defined tokens in the text are not split out first: the tests' texts have none.)
benchmarks/gguf_parity.py runs llama.cpp itself.
"""

from __future__ import annotations

import heapq
from pathlib import Path

SPACE = "\u2581"


class SpmTokenizer:
    def __init__(self, tokens: list[str], scores: list[float], add_space_prefix: bool):
        self.ids = {token: i for i, token in enumerate(tokens)}
        self.scores = scores
        self.add_space_prefix = add_space_prefix

    @classmethod
    def from_gguf(cls, path: str | Path) -> SpmTokenizer:
        from gguf import GGUFReader

        fields = GGUFReader(str(path)).fields
        assert fields["tokenizer.ggml.model"].contents() == "llama"
        prefix = fields.get("tokenizer.ggml.add_space_prefix")
        return cls(
            fields["tokenizer.ggml.tokens"].contents(),
            fields["tokenizer.ggml.scores"].contents(),
            True if prefix is None else bool(prefix.contents()),
        )

    def __call__(self, text: str) -> list[int]:
        if self.add_space_prefix:
            text = " " + text
        symbols = list(text.replace(" ", SPACE))
        last = len(symbols) - 1
        prev = list(range(-1, last))
        nxt = [i + 1 if i < last else -1 for i in range(len(symbols))]
        queue: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            joined = symbols[left] + symbols[right]
            token = self.ids.get(joined)
            if token is not None:  # highest score first, then the leftmost pair
                heapq.heappush(queue, (-self.scores[token], left, right, len(joined)))

        for i in range(1, len(symbols)):
            push(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            # a pair one of whose symbols has joined another since it was queued is stale
            if not symbols[left] or not symbols[right] or len(symbols[left]) + len(symbols[right]) != size:
                continue
            symbols[left] += symbols[right]
            symbols[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] != -1:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])
        out: list[int] = []
        at = 0 if symbols else -1
        while at != -1:
            piece = symbols[at]
            if piece in self.ids:
                out.append(self.ids[piece])
            else:
                out.extend(self.ids[f"<0x{byte:02X}>"] for byte in piece.encode("utf-8"))
            at = nxt[at]
        return out
